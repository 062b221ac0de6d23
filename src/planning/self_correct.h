// self_correct.h (private): self-correcting plans, for chains and graphs
// alike (remat/planned_chain.h and remat/graph.h, "Self-correction"; the
// mechanism: docs/planned_execution.md, "Self-correcting plans").
//
// The executor fills StageTimes while it runs a plan; before each training
// step the planned module calls correct_before_step, which, after a full
// window of steps, builds the costs with the measured times (StageTimes::
// apply_to) and decides on them (corrected_plan). Everything here is written
// once over `Costs`, a planner::Chain or a planner::Graph (explicitly
// instantiated for both in self_correct.cpp): a chain is not converted to a
// graph, because a Graph has no resident bytes and the graph solver's
// budgets are exact bytes rather than the chain solver's memory slots.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "remat/planned_chain.h"
#include "remat/planner/chain.h"
#include "remat/planner/graph.h"
#include "remat/planner/plan.h"
#include "remat/planner/solvers.h"

namespace remat::detail {

/// Milliseconds per MiB that writing into memory not in cache costs beyond
/// writing into memory that is, measured on `working_set_bytes` of buffers
/// (all allocated at once) on a CPU; 0 on other devices or for no bytes
/// (profile.cpp; the cost model's cold_write_ms_per_mib).
double cold_write_ms_per_mib(int64_t working_set_bytes, c10::Device device);

/// `costs` (a Chain or a Graph, profiled with
/// ProfileOptions::cold_write_max_bytes(0) inside a training step, for want
/// of a given cost model) with its cold-write rate measured on its working
/// set (input plus every stage's saved_bytes) but at most half of
/// `budget_bytes` minus the input (which the step holds anyway; the
/// measurement allocates its buffers and one more) and at most `max_bytes`:
/// the measurement's buffers then stay within the budget the step keeps.
template <typename Costs>
Costs with_cold_writes_within(
    Costs costs, int64_t budget_bytes, int64_t max_bytes, c10::Device device);

/// Wall times of a planned module's ops over a window of training steps.
/// Filled by the executor (which may run the backward on another thread).
class StageTimes {
 public:
  explicit StageTimes(int64_t stages);
  /// A forward op of `stage` (any kind) took `ms`.
  void add_forward(int64_t stage, double ms);
  /// The backward of `stage` after a full record (kForwardRecord) took `ms`.
  void add_backward(int64_t stage, double ms);
  /// One training step's backward phase has ended.
  void step_done();
  /// Training steps completed in this window.
  int64_t steps() const;
  /// `profiled` with each stage's forward_ms and backward_ms replaced by the
  /// medians of this window (a stage without a sample keeps the profile's;
  /// a backward without a sample, and a selective recompute_ms, are scaled
  /// by the stage's measured / profiled forward). Bytes, a graph's inputs,
  /// resident bytes and the model state stay the profile's.
  planner::Chain apply_to(const planner::Chain& profiled) const;
  planner::Graph apply_to(const planner::Graph& profiled) const;
  /// Starts a new window.
  void clear();

 private:
  std::vector<planner::StageCost> measured_costs(
      std::vector<planner::StageCost> profiled) const;

  mutable std::mutex mutex_;
  std::vector<std::vector<double>> forward_ms_;
  std::vector<std::vector<double>> backward_ms_;
  int64_t steps_ = 0;
};

/// `costs` with its stages' costs replaced by `stages` (one per stage).
planner::Chain with_stage_costs(
    const planner::Chain& costs, std::vector<planner::StageCost> stages);
planner::Graph with_stage_costs(
    const planner::Graph& costs, std::vector<planner::StageCost> stages);

/// `costs` without selective costs: what a module without a selective
/// policy re-solves on (its plans cannot run a stage selectively).
template <class Costs>
Costs without_selective_costs(const Costs& costs);

/// Throws c10::Error, naming `who`, unless `correction_steps` >= 1 and
/// `correction_threshold` is finite and >= 0 (the options'
/// correction_steps and correction_threshold).
void check_correction_options(
    const char* who, int64_t correction_steps, double correction_threshold);

/// When and how a self-correcting module re-solves (from its options).
struct CorrectionRule {
  int64_t window_steps = 3;  ///< correction_steps
  double threshold = 0.05;   ///< correction_threshold
  planner::SolverOptions solver;
};

/// What a self-correcting module keeps between steps.
template <class Costs>
struct Correction {
  std::vector<int64_t> shape;  ///< the input shape it corrects
  Costs costs;                 ///< the bytes (and the profiled times)
  int64_t budget_bytes = 0;    ///< what every re-solve stays within
  std::shared_ptr<StageTimes> times;
  int64_t steps_under_plan = 0;   ///< steps run under the plan in force
  std::optional<Costs> measured;  ///< the last window's costs
  std::vector<BasicPlanCorrection<Costs>> log;
};

/// A new correction for inputs of `shape` on `costs` within `budget_bytes`
/// (its window empty), continuing `log`.
template <class Costs>
Correction<Costs> start_correction(
    std::vector<int64_t> shape,
    Costs costs,
    int64_t budget_bytes,
    std::vector<BasicPlanCorrection<Costs>> log);

/// The plan to switch to from `current` on `measured` within
/// `budget_bytes`: solve_optimal's, when simulate() puts it faster than
/// `current` by more than `threshold` (a fraction of current's time); else
/// nullopt. Fills `from_ms`/`to_ms` with both predicted times.
template <class Costs>
std::optional<planner::Plan> corrected_plan(
    const Costs& measured,
    const planner::Plan& current,
    int64_t budget_bytes,
    double threshold,
    const planner::SolverOptions& solver,
    double& from_ms,
    double& to_ms);

/// Self-correction before a training step under `plan`: after a full window
/// of rule.window_steps measured steps, builds the measured costs, replaces
/// `plan` by corrected_plan's (logging the switch) if there is one, and
/// starts a new window. Returns true when `plan` was replaced. The step
/// about to run is counted under the plan then in force; its times go to
/// correction.times.
template <class Costs>
bool correct_before_step(
    Correction<Costs>& correction,
    planner::Plan& plan,
    const CorrectionRule& rule);

}  // namespace remat::detail
