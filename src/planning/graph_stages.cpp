// graph_stages.cpp: the checked structure of a graph of stages, run_graph.
#include "graph_stages.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include <c10/util/Exception.h>

namespace remat {
namespace detail {

planner::Graph graph_structure(
    const char* who, const std::vector<GraphStage>& stages) {
  TORCH_CHECK(!stages.empty(), who, ": expected at least one stage, got none");
  std::vector<std::vector<int64_t>> inputs;
  for (size_t i = 0; i < stages.size(); ++i) {
    TORCH_CHECK(
        static_cast<bool>(stages[i].forward),
        who,
        ": expected every stage to have a forward, stage ",
        i,
        " has none");
    inputs.emplace_back(stages[i].inputs.begin(), stages[i].inputs.end());
  }
  try {
    return planner::Graph(
        std::vector<planner::StageCost>(stages.size(), unit_cost()),
        std::move(inputs),
        /*input_bytes=*/1);
  } catch (const std::invalid_argument& error) {
    const std::string message = error.what();
    const std::string prefix = "remat::planner::Graph: ";
    TORCH_CHECK(
        false,
        who,
        ": ",
        message.rfind(prefix, 0) == 0 ? message.substr(prefix.size())
                                      : message);
  }
}

StageCall call_of(
    const GraphStage& stage, const planner::Graph& structure, int64_t index) {
  // Position of each argument among the distinct input values.
  const std::vector<int64_t>& values = structure.input_values(index);
  std::vector<size_t> positions;
  for (int64_t input : structure.inputs(index)) {
    positions.push_back(static_cast<size_t>(
        std::lower_bound(values.begin(), values.end(), input + 1) -
        values.begin()));
  }
  return StageCall{
      [forward = stage.forward,
       positions](const std::vector<torch::Tensor>& distinct) {
        std::vector<torch::Tensor> arguments;
        arguments.reserve(positions.size());
        for (size_t position : positions) {
          arguments.push_back(distinct.at(position));
        }
        return forward(arguments);
      },
      stage.module};
}

std::vector<Stage> module_holders(const std::vector<GraphStage>& stages) {
  std::vector<Stage> holders;
  for (const GraphStage& stage : stages) {
    holders.push_back(Stage{nullptr, stage.module});
  }
  return holders;
}

}  // namespace detail

torch::Tensor run_graph(
    const std::vector<GraphStage>& stages, const torch::Tensor& input) {
  const planner::Graph structure =
      detail::graph_structure("remat::run_graph", stages);
  std::vector<torch::Tensor> values(stages.size() + 1);
  values[0] = input;
  for (int64_t i = 0; i < structure.size(); ++i) {
    std::vector<torch::Tensor> arguments;
    for (int input_index : stages[i].inputs) {
      arguments.push_back(values[input_index + 1]);
    }
    values[i + 1] = stages[i].forward(arguments);
    TORCH_CHECK(
        values[i + 1].defined(),
        "remat::run_graph: stage ",
        i,
        " returned an undefined tensor; every stage must return a defined "
        "tensor");
    // Drop what no later stage reads.
    for (int64_t v : structure.input_values(i)) {
      const auto& readers =
          v == 0 ? std::vector<int64_t>{} : structure.consumers(v - 1);
      if (v > 0 && readers.back() == i) {
        values[v] = torch::Tensor();
      }
    }
  }
  return values.back();
}

}  // namespace remat
