// remat/planner/explain.h: a plan on a chain or a graph, as a table people
// read.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "remat/planner/chain.h"
#include "remat/planner/graph.h"
#include "remat/planner/plan.h"

namespace remat::planner {

/// How a plan uses one stage: one row of the report's first part.
struct ExplainStage {
  int64_t stage = 0;
  StageCost cost;  ///< the chain's costs of the stage
  /// Forwards the plan runs of the stage, and of which kinds.
  int64_t forwards = 0;
  int64_t records = 0;      ///< kForwardRecord
  int64_t checkpoints = 0;  ///< kForwardCheckpoint
  int64_t selectives = 0;   ///< kForwardSelective
  /// The kind of its first forward; nullopt if the plan runs none.
  std::optional<OpKind> first_forward;
  /// What the plan keeps of it, in words: "record (stored from the first
  /// forward)", "input x_3 (checkpoint, 1.0 KiB)", ...
  std::string keeps;
  /// On a graph: what the stage reads (Graph::inputs; -1 the input).
  std::vector<int64_t> reads;
};

/// One op of the plan as simulate() replays it.
struct ExplainOp {
  Op op;
  int64_t live_after_bytes = 0;    ///< Simulation::live_after_bytes
  int64_t op_peak_bytes = 0;       ///< Simulation::op_peak_bytes
  int64_t running_peak_bytes = 0;  ///< the highest so far, this op included
};

/// Everything the report says, as data: explain() renders it as text, the
/// remat tool also as JSON.
struct ExplainReport {
  /// simulate()'s verdict; when false only `error` is set.
  bool valid = false;
  std::string error;
  std::vector<ExplainStage> stages;  ///< one per stage, in order
  int64_t start_bytes = 0;           ///< live before the first op (base bytes)
  std::vector<ExplainOp> ops;        ///< one per op, in plan order
  int64_t peak_bytes = 0;            ///< predicted peak (simulate())
  double step_ms = 0;                ///< predicted step (Simulation::step_ms)
  int64_t store_all_peak_bytes = 0;  ///< the same for storing everything
  double store_all_step_ms = 0;
  int64_t recomputed_forwards = 0;  ///< stage forwards beyond one per stage
  /// Whether the memory model counts parameters (a sharded chain), and then
  /// how the peak splits: resident shards, the parameters the peak op
  /// gathers, and where the peak is ("in op B3", "before any op").
  bool counts_parameters = false;
  int64_t resident_bytes = 0;
  int64_t peak_gathered_bytes = 0;
  std::string peak_at;
  /// Whether the report is of a graph (then stages carry `reads`).
  bool graph = false;
};

/// The report of `plan` on `chain` (see explain() for its parts). An invalid
/// plan gives valid == false and simulate()'s error; never throws except
/// std::bad_alloc.
ExplainReport explain_report(const Chain& chain, const Plan& plan);

/// The same report of `plan` on `graph`: stage rows also say what each
/// stage reads ("reads": stage indices, "in" for the graph input); no
/// parameter split (graphs are not sharded).
ExplainReport explain_report(const Graph& graph, const Plan& plan);
/// The report as the text explain() returns.
std::string to_text(const ExplainReport& report);

/// A readable report of `plan` on `chain`, in three parts:
///  1. one row per stage: its forward and backward time, output and saved
///     bytes, how often it runs forward, and what the plan keeps of it;
///  2. one row per op, in plan order: "live after" (bytes live once the op
///     is done) and "peak in op" (highest live bytes inside it), each as
///     exact bytes and in binary units; these are simulate()'s
///     Simulation::live_after_bytes and Simulation::op_peak_bytes;
///  3. the predicted peak and time next to storing everything.
/// An invalid plan is reported ("invalid plan: <simulate()'s error>"), not
/// thrown. Never throws except std::bad_alloc. to_text(explain_report()).
///
/// Example:
// clang-format off
///   std::cout << remat::planner::explain(chain, solve_sqrt(chain));
// clang-format on
std::string explain(const Chain& chain, const Plan& plan);

/// The report of a plan on a graph (explain_report(graph, plan) as text).
std::string explain(const Graph& graph, const Plan& plan);
/// The same report written to `out`.
void explain(std::ostream& out, const Chain& chain, const Plan& plan);

/// The memory of one training step of a chain by kind, with and without
/// checkpointing: what "profile first" asks (do activations or the model
/// state dominate, and how much can checkpointing save at most).
struct StepMemory {
  /// Parameters, gradients and optimizer state (Chain::model_state()).
  ModelState model_state;
  int64_t input_bytes = 0;
  /// Activations + input (+ resident bytes) storing everything: the
  /// store-all peak, simulate()'s units.
  int64_t store_all_peak_bytes = 0;
  /// The least any plan needs: min_feasible_budget_bytes(); std::nullopt
  /// for a chain longer than kMaxExactStages (not computed: too slow).
  std::optional<int64_t> least_peak_bytes;

  /// The whole step without checkpointing: model state + store-all peak.
  int64_t total_store_all_bytes() const {
    return model_state.total_bytes() + store_all_peak_bytes;
  }
  /// The most checkpointing can save: store-all peak - least peak (0 when
  /// the least is not known).
  int64_t max_saving_bytes() const {
    return least_peak_bytes ? store_all_peak_bytes - *least_peak_bytes : 0;
  }
  /// max_saving_bytes() as a fraction of total_store_all_bytes().
  double max_saving_fraction() const;
};

/// The step memory of `chain`. Never throws except std::bad_alloc.
StepMemory step_memory(const Chain& chain);
/// The step memory of `graph` (the least peak: the graph solvers'
/// min_feasible_budget_bytes). Never throws except std::bad_alloc.
StepMemory step_memory(const Graph& graph);

/// step_memory() as the lines people read: each kind, the totals, and
/// whether checkpointing can help ("activations dominate" when it can save
/// at least a quarter of the step, "the model state dominates" when it can
/// save under a tenth), e.g.
///   parameters and buffers               1.78 MiB
///   ...
///   checkpointing can save at most 29.7 MiB of the 48.6 MiB step (61%):
///   activations dominate, checkpointing helps
/// `optimizer` names the optimizer in its row ("adamw").
std::string to_text(const StepMemory& memory, const std::string& optimizer);

}  // namespace remat::planner
