// self_correct.h (private): the measured stage times of a planned chain and
// the decision to switch plans on them (remat/planned_chain.h, "Self-
// correction"). The executor fills StageTimes; planned_forward decides.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "remat/planned_chain.h"
#include "remat/planner/chain.h"
#include "remat/planner/plan.h"
#include "remat/planner/solvers.h"

namespace remat::detail {

/// Wall times of a planned chain's ops over a window of training steps.
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
  /// by the stage's measured / profiled forward).
  planner::Chain apply_to(const planner::Chain& profiled) const;
  /// Starts a new window.
  void clear();

 private:
  mutable std::mutex mutex_;
  std::vector<std::vector<double>> forward_ms_;
  std::vector<std::vector<double>> backward_ms_;
  int64_t steps_ = 0;
};

/// What a self-correcting chain keeps between steps.
struct Correction {
  std::vector<int64_t> shape;  ///< the input shape it corrects
  planner::Chain chain;        ///< the bytes (and the profiled times)
  int64_t budget_bytes = 0;    ///< what every re-solve stays within
  std::shared_ptr<StageTimes> times;
  int64_t steps_under_plan = 0;  ///< steps run under the plan in force
  std::optional<planner::Chain> measured;  ///< the last window's chain
  std::vector<PlanCorrection> log;
};

/// The plan to switch to from `current` on `measured` within
/// `budget_bytes`: solve_optimal's, when simulate() puts it faster than
/// `current` by more than `threshold` (a fraction of current's time); else
/// nullopt. Fills `from_ms`/`to_ms` with both predicted times.
std::optional<planner::Plan> corrected_plan(
    const planner::Chain& measured,
    const planner::Plan& current,
    int64_t budget_bytes,
    double threshold,
    const planner::SolverOptions& solver,
    double& from_ms,
    double& to_ms);

}  // namespace remat::detail
