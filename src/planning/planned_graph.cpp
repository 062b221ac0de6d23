// planned_graph.cpp: PlannedGraph (a graph of stages run by the plan
// executor, NOTE: [Plan execution] in plan_executor.cpp) and auto_checkpoint
// for graphs (plan_within: plan_choice.cpp).
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include "graph_stages.h"
#include "plan_executor.h"
#include "remat/graph.h"
#include "remat/planner/simulate.h"
#include "remat/planner/solvers.h"

namespace remat {
namespace {

using planner::OpKind;

bool has_selective_op(const planner::Plan& plan) {
  return std::any_of(
      plan.ops.begin(), plan.ops.end(), [](const planner::Op& op) {
        return op.kind == OpKind::kForwardSelective;
      });
}

}  // namespace

PlannedGraphImpl::PlannedGraphImpl(
    std::vector<GraphStage> stages,
    planner::Plan plan,
    PlannedGraphOptions options)
    : stages_(
          std::make_shared<const std::vector<GraphStage>>(std::move(stages))),
      plan_(std::move(plan)),
      options_(std::move(options)),
      structure_(detail::graph_structure("remat::PlannedGraph", *stages_)) {
  const planner::Simulation check = planner::simulate(structure_, plan_);
  TORCH_CHECK(
      check.valid,
      "remat::PlannedGraph: expected a valid plan for the ",
      structure_.size(),
      " stages, got '",
      plan_.to_string().substr(0, 80),
      "': ",
      check.error);
  TORCH_CHECK(
      !has_selective_op(plan_) ||
          static_cast<bool>(options_.selective_policy()),
      "remat::PlannedGraph: the plan runs stages selectively (S ops), so it "
      "needs options.selective_policy, the policy the graph was profiled "
      "with");
  if (options_.graph()) {
    const planner::Graph& graph = *options_.graph();
    bool same = graph.size() == structure_.size();
    for (int64_t i = 0; same && i < graph.size(); ++i) {
      same = graph.inputs(i) == structure_.inputs(i);
    }
    TORCH_CHECK(
        same,
        "remat::PlannedGraph: options.graph has ",
        graph.size(),
        " stages and must have the stages' inputs; the stages are ",
        structure_.size());
  }
  for (size_t i = 0; i < stages_->size(); ++i) {
    const auto& module = (*stages_)[i].module;
    if (module && std::find_if(
                      stages_->begin(),
                      stages_->begin() + static_cast<std::ptrdiff_t>(i),
                      [&](const GraphStage& s) {
                        return s.module == module;
                      }) == stages_->begin() + static_cast<std::ptrdiff_t>(i)) {
      register_module("stage" + std::to_string(i), module);
    }
  }
}

torch::Tensor PlannedGraphImpl::forward(const torch::Tensor& input) {
  if (!options_.input_shape().empty()) {
    TORCH_CHECK(
        input.sizes().vec() == options_.input_shape(),
        "remat::PlannedGraph: the plan was made for inputs of shape ",
        c10::IntArrayRef(options_.input_shape()),
        ", got ",
        input.sizes());
  }
  bool needs_grad = input.requires_grad();
  for (const torch::Tensor& parameter : parameters()) {
    needs_grad = needs_grad || parameter.requires_grad();
  }
  if (!c10::GradMode::is_enabled() || !needs_grad) {
    return run_graph(*stages_, input);
  }
  if (!program_) {
    std::vector<detail::StageCall> calls;
    for (int64_t i = 0; i < structure_.size(); ++i) {
      calls.push_back(detail::call_of((*stages_)[i], structure_, i));
    }
    program_ = detail::make_program(
        std::move(calls), structure_, plan_, options_.selective_policy());
  }
  return detail::run_program(program_, input, "remat::PlannedGraph");
}

void PlannedGraphImpl::pretty_print(std::ostream& stream) const {
  std::string text = plan_.to_string();
  if (text.size() > 60) {
    text = text.substr(0, 57) + "...";
  }
  stream << "remat::PlannedGraph(stages=" << stages_->size()
         << ", ops=" << plan_.ops.size() << ", plan=" << text << ")";
}

PlannedGraph auto_checkpoint(
    std::vector<GraphStage> stages,
    const torch::Tensor& sample,
    Budget budget,
    const AutoCheckpointOptions& options) {
  ProfileOptions profile = options.profile();
  profile.selective_policy(options.selective_policy());
  planner::Graph graph = profile_graph(stages, sample, profile);
  planner::Plan plan = plan_within(graph, budget, options.solver());
  return PlannedGraph(
      std::move(stages),
      std::move(plan),
      PlannedGraphOptions()
          .selective_policy(options.selective_policy())
          .graph(std::move(graph))
          .input_shape(sample.sizes().vec()));
}

}  // namespace remat
