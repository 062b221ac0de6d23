// Graph: validation of a graph's structure and costs at construction.
//
// The costs are checked by Chain's validation (one definition of what a
// valid stage cost is), given the costs with their backward transients
// raised to >= 0: a graph stage's backward produces the gradients of all its
// distinct inputs, so the lower bound of its transient is minus their sum,
// checked here instead of minus the previous value's size.
#include "remat/planner/graph.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "check.h"

namespace remat::planner {
namespace {

[[noreturn]] void fail(const std::string& what) {
  throw std::invalid_argument("remat::planner::Graph: " + what);
}

// `stages` with every backward transient raised to >= 0 (see the top).
std::vector<StageCost> with_nonnegative_backward(
    std::vector<StageCost> stages) {
  for (StageCost& cost : stages) {
    cost.backward_tmp_bytes = std::max<int64_t>(0, cost.backward_tmp_bytes);
    if (cost.selective) {
      cost.selective->backward_tmp_bytes =
          std::max<int64_t>(0, cost.selective->backward_tmp_bytes);
    }
  }
  return stages;
}

void check_costs(
    const std::vector<StageCost>& stages,
    int64_t input_bytes,
    const ModelState& model_state) {
  try {
    Chain(with_nonnegative_backward(stages), input_bytes, 0, model_state);
  } catch (const std::invalid_argument& error) {
    const std::string message = error.what();
    const std::string prefix = "remat::planner::Chain: ";
    fail(
        message.rfind(prefix, 0) == 0 ? message.substr(prefix.size())
                                      : message);
  }
}

void check_backward_bound(
    int64_t stage, const char* field, int64_t value, int64_t gradients) {
  if (value < -gradients) {
    fail(
        "stage " + std::to_string(stage) + " " + field + ": expected >= -" +
        std::to_string(gradients) +
        " (minus the summed sizes of the gradients its backward produces), "
        "got " +
        std::to_string(value));
  }
}

}  // namespace

Graph::Graph(
    std::vector<StageCost> stages,
    std::vector<std::vector<int64_t>> inputs,
    int64_t input_bytes,
    ModelState model_state)
    : stages_(std::move(stages)),
      input_bytes_(input_bytes),
      model_state_(model_state),
      inputs_(std::move(inputs)) {
  if (stages_.empty()) {
    fail("expected at least one stage, got an empty graph");
  }
  if (inputs_.size() != stages_.size()) {
    fail(
        "expected one inputs list per stage (" +
        std::to_string(stages_.size()) + "), got " +
        std::to_string(inputs_.size()));
  }
  check_costs(stages_, input_bytes_, model_state_);
  const int64_t n = size();
  input_values_.resize(n);
  consumers_.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    if (inputs_[i].empty()) {
      fail(
          "stage " + std::to_string(i) +
          " reads nothing; every stage reads the graph input (" +
          std::to_string(kGraphInput) + ") or earlier stages");
    }
    for (int64_t input : inputs_[i]) {
      if (input < kGraphInput || input >= i) {
        fail(
            "stage " + std::to_string(i) + " reads " + std::to_string(input) +
            ", which is neither the graph input (" +
            std::to_string(kGraphInput) +
            ") nor an earlier stage (stages are in topological order: "
            "each reads only stages before it, so a graph has no cycle)");
      }
      input_values_[i].push_back(input + 1);
      if (input >= 0) {
        consumers_[input].push_back(i);
      }
    }
    auto& values = input_values_[i];
    std::sort(values.begin(), values.end());
    values.erase(std::unique(values.begin(), values.end()), values.end());
  }
  for (int64_t i = 0; i < n; ++i) {
    auto& readers = consumers_[i];
    readers.erase(std::unique(readers.begin(), readers.end()), readers.end());
    if (i < n - 1 && readers.empty()) {
      fail(
          "stage " + std::to_string(i) +
          "'s output is read by no stage and is not the graph output (the "
          "last stage's): a stage that feeds nothing gets no gradient");
    }
    int64_t gradients = 0;
    for (int64_t value : input_values_[i]) {
      gradients += value_bytes(value);
    }
    const StageCost& cost = stages_[i];
    check_backward_bound(
        i, "backward_tmp_bytes", cost.backward_tmp_bytes, gradients);
    if (cost.selective) {
      check_backward_bound(
          i,
          "selective.backward_tmp_bytes",
          cost.selective->backward_tmp_bytes,
          gradients);
    }
  }
}

const StageCost& Graph::stage(int64_t index) const {
  if (index < 0 || index >= size()) {
    throw std::out_of_range(
        "remat::planner::Graph::stage: index " + std::to_string(index) +
        " out of range [0, " + std::to_string(size()) + ")");
  }
  return stages_[index];
}

const std::vector<int64_t>& Graph::inputs(int64_t index) const {
  stage(index);  // range check
  return inputs_[index];
}

const std::vector<int64_t>& Graph::input_values(int64_t index) const {
  stage(index);
  return input_values_[index];
}

const std::vector<int64_t>& Graph::consumers(int64_t index) const {
  stage(index);
  return consumers_[index];
}

int64_t Graph::value_bytes(int64_t value) const {
  if (value < 0 || value > size()) {
    throw std::out_of_range(
        "remat::planner::Graph::value_bytes: value " + std::to_string(value) +
        " out of range [0, " + std::to_string(size()) + "]");
  }
  return value == 0 ? input_bytes_ : stages_[value - 1].output_bytes;
}

Graph Graph::with_model_state(const ModelState& state) const {
  return Graph(stages_, inputs_, input_bytes_, state)
      .with_cold_write_ms_per_mib(cold_write_ms_per_mib_);
}

Graph Graph::with_cold_write_ms_per_mib(double ms_per_mib) const {
  // Its cost is charged for every MiB of a peak (at most 2^43 MiB): that
  // product must be finite too.
  if (!std::isfinite(ms_per_mib * 0x1p43) || ms_per_mib < 0) {
    fail(
        "cold_write_ms_per_mib: expected >= 0 and finite for any peak (at "
        "most 1e295), got " +
        detail::number_text(ms_per_mib));
  }
  Graph copy = *this;
  copy.cold_write_ms_per_mib_ = ms_per_mib;
  return copy;
}

bool Graph::is_chain() const {
  for (int64_t i = 0; i < size(); ++i) {
    if (inputs_[i].size() != 1 || inputs_[i][0] != i - 1) {
      return false;
    }
  }
  return true;
}

Chain Graph::as_chain() const {
  if (!is_chain()) {
    fail(
        "as_chain: the graph is not a chain (some stage reads more than the "
        "stage before it)");
  }
  return Chain(stages_, input_bytes_, 0, model_state_)
      .with_cold_write_ms_per_mib(cold_write_ms_per_mib_);
}

Graph graph_of(const Chain& chain) {
  if (chain.resident_bytes() != 0) {
    throw std::invalid_argument(
        "remat::planner::graph_of: graphs have no resident bytes, the chain "
        "has " +
        std::to_string(chain.resident_bytes()));
  }
  std::vector<std::vector<int64_t>> inputs;
  for (int64_t i = 0; i < chain.size(); ++i) {
    inputs.push_back({i - 1});
  }
  return Graph(
             chain.stages(),
             std::move(inputs),
             chain.input_bytes(),
             chain.model_state())
      .with_cold_write_ms_per_mib(chain.cold_write_ms_per_mib());
}

bool operator==(const Graph& lhs, const Graph& rhs) {
  if (lhs.size() != rhs.size() || lhs.input_bytes() != rhs.input_bytes() ||
      lhs.model_state() != rhs.model_state() ||
      lhs.cold_write_ms_per_mib() != rhs.cold_write_ms_per_mib() ||
      lhs.stages() != rhs.stages()) {
    return false;
  }
  for (int64_t i = 0; i < lhs.size(); ++i) {
    if (lhs.inputs(i) != rhs.inputs(i)) {
      return false;
    }
  }
  return true;
}

bool operator!=(const Graph& lhs, const Graph& rhs) {
  return !(lhs == rhs);
}

}  // namespace remat::planner
