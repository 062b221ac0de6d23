// remat/planner/graph.h: the cost model of a graph of stages (a DAG).
//
// A graph is stages 0..L-1 in topological order. Stage i reads the values
// named by inputs(i) -- the graph input (kGraphInput) or outputs of earlier
// stages -- and produces one value, its output; the last stage's output is the
// graph's output (it feeds only the loss). A chain is the graph in which every
// stage reads the one before (is_chain()). Values are numbered as in a chain:
// x_0 is the graph input, x_{i+1} the output of stage i.
//
// Each stage has the costs of a chain stage (StageCost, remat/planner/chain.h)
// with one difference: a stage's backward produces the gradients of all its
// distinct inputs, so backward_tmp_bytes is measured above the bytes held
// before the backward plus the sum of those gradients' sizes.
// How plans on graphs are costed: docs/planner.md ("Graphs").
#pragma once

#include <cstdint>
#include <vector>

#include "remat/planner/chain.h"

namespace remat::planner {

/// The index that names the graph input in a stage's inputs.
inline constexpr int64_t kGraphInput = -1;

/// A validated, immutable graph of stage costs.
///
/// Example (a two-level skip: stage 2 reads stage 0's and stage 1's outputs):
// clang-format off
///   Graph graph({a, b, c}, {{kGraphInput}, {0}, {0, 1}}, /*input_bytes=*/100);
// clang-format on
class Graph {
 public:
  /// Throws std::invalid_argument, naming the stage, if `stages` is empty,
  /// `inputs` has not one list per stage, a stage reads nothing, reads an
  /// index that is neither kGraphInput nor an earlier stage (which also
  /// refuses cycles), or a stage other than the last has an output no later
  /// stage reads; and as Chain's constructor for the costs, `input_bytes`
  /// and `model_state`; a backward transient must be >= minus the summed
  /// sizes of the stage's distinct inputs (the gradients it produces). A
  /// stage may read a value more than once.
  Graph(
      std::vector<StageCost> stages,
      std::vector<std::vector<int64_t>> inputs,
      int64_t input_bytes,
      ModelState model_state = {});

  /// Number of stages L (>= 1).
  int64_t size() const {
    return static_cast<int64_t>(stages_.size());
  }
  /// Costs of stage `index`. Throws std::out_of_range unless
  /// 0 <= index < size().
  const StageCost& stage(int64_t index) const;
  /// All stage costs, in order.
  const std::vector<StageCost>& stages() const {
    return stages_;
  }
  /// What stage `index` reads, as given: kGraphInput or earlier stages.
  /// Throws std::out_of_range unless 0 <= index < size().
  const std::vector<int64_t>& inputs(int64_t index) const;
  /// The distinct values stage `index` reads (x_0 for the graph input,
  /// x_{j+1} for stage j), ascending. Throws as inputs().
  const std::vector<int64_t>& input_values(int64_t index) const;
  /// The stages that read the output of stage `index`, ascending (empty for
  /// the last stage). Throws as inputs().
  const std::vector<int64_t>& consumers(int64_t index) const;
  /// Size of the graph input x_0 in bytes.
  int64_t input_bytes() const {
    return input_bytes_;
  }
  /// Size in bytes of value x_value (and of its gradient): input_bytes() for
  /// 0, else stage(value - 1).output_bytes. Throws std::out_of_range unless
  /// 0 <= value <= size().
  int64_t value_bytes(int64_t value) const;
  /// The step's parameters, gradients and optimizer state; outside every
  /// peak simulate() reports (as a chain's).
  const ModelState& model_state() const {
    return model_state_;
  }
  /// A copy with `state` as its model state. Throws as the constructor.
  Graph with_model_state(const ModelState& state) const;
  /// As Chain::cold_write_ms_per_mib(): charged once per step for every
  /// byte of the peak. Default: 0.
  double cold_write_ms_per_mib() const {
    return cold_write_ms_per_mib_;
  }
  /// A copy with `ms_per_mib` as cold_write_ms_per_mib(). Throws as
  /// Chain::with_cold_write_ms_per_mib().
  Graph with_cold_write_ms_per_mib(double ms_per_mib) const;
  /// True when every stage reads exactly the one before (stage 0 the input):
  /// the graph is a chain, and as_chain() gives it.
  bool is_chain() const;
  /// The same costs as a Chain. Throws std::invalid_argument unless
  /// is_chain().
  Chain as_chain() const;

 private:
  std::vector<StageCost> stages_;
  int64_t input_bytes_;
  ModelState model_state_;
  double cold_write_ms_per_mib_ = 0;
  std::vector<std::vector<int64_t>> inputs_;
  std::vector<std::vector<int64_t>> input_values_;
  std::vector<std::vector<int64_t>> consumers_;
};

/// The chain `chain` as a graph (stage i reads stage i - 1), its model
/// state and cold-write cost included. Throws std::invalid_argument if the
/// chain has resident bytes (Chain::resident_bytes > 0: graphs have none).
Graph graph_of(const Chain& chain);

/// Graphs are equal when their costs, inputs, model states and cold-write
/// costs are equal.
bool operator==(const Graph& lhs, const Graph& rhs);
bool operator!=(const Graph& lhs, const Graph& rhs);

}  // namespace remat::planner
