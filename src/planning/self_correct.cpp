// self_correct.cpp: measured stage times and the switch between plans
// (self_correct.h; the contract is remat/planned_chain.h, "Self-correction").
#include "self_correct.h"

#include <utility>

#include "remat/planner/simulate.h"
#include "remat/planner/statistics.h"

namespace remat::detail {

StageTimes::StageTimes(int64_t stages)
    : forward_ms_(static_cast<size_t>(stages)),
      backward_ms_(static_cast<size_t>(stages)) {}

void StageTimes::add_forward(int64_t stage, double ms) {
  const std::lock_guard<std::mutex> lock(mutex_);
  forward_ms_.at(static_cast<size_t>(stage)).push_back(ms);
}

void StageTimes::add_backward(int64_t stage, double ms) {
  const std::lock_guard<std::mutex> lock(mutex_);
  backward_ms_.at(static_cast<size_t>(stage)).push_back(ms);
}

void StageTimes::step_done() {
  const std::lock_guard<std::mutex> lock(mutex_);
  ++steps_;
}

int64_t StageTimes::steps() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return steps_;
}

void StageTimes::clear() {
  const std::lock_guard<std::mutex> lock(mutex_);
  for (auto& samples : forward_ms_) {
    samples.clear();
  }
  for (auto& samples : backward_ms_) {
    samples.clear();
  }
  steps_ = 0;
}

planner::Chain StageTimes::apply_to(const planner::Chain& profiled) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  std::vector<planner::StageCost> stages = profiled.stages();
  for (size_t i = 0; i < stages.size() && i < forward_ms_.size(); ++i) {
    planner::StageCost& stage = stages[i];
    const double profiled_forward = stage.forward_ms;
    if (!forward_ms_[i].empty()) {
      stage.forward_ms = planner::median(forward_ms_[i]);
    }
    // How much slower (or faster) the stage runs than profiled: what a
    // cost measured only through the forward is scaled by.
    const double scale =
        profiled_forward > 0 ? stage.forward_ms / profiled_forward : 1.0;
    if (!backward_ms_[i].empty()) {
      stage.backward_ms = planner::median(backward_ms_[i]);
    } else {
      stage.backward_ms *= scale;
    }
    if (stage.selective) {
      stage.selective->recompute_ms *= scale;
    }
  }
  return planner::Chain(
      std::move(stages),
      profiled.input_bytes(),
      profiled.resident_bytes(),
      profiled.model_state());
}

std::optional<planner::Plan> corrected_plan(
    const planner::Chain& measured,
    const planner::Plan& current,
    int64_t budget_bytes,
    double threshold,
    const planner::SolverOptions& solver,
    double& from_ms,
    double& to_ms) {
  const planner::Simulation now = planner::simulate(measured, current);
  from_ms = now.time_ms;
  to_ms = now.time_ms;
  std::optional<planner::Plan> candidate =
      planner::solve_optimal(measured, budget_bytes, solver);
  if (!candidate || !now.valid) {
    return std::nullopt;
  }
  const planner::Simulation next = planner::simulate(measured, *candidate);
  if (!next.valid || next.peak_bytes > budget_bytes ||
      next.time_ms >= now.time_ms * (1.0 - threshold)) {
    return std::nullopt;
  }
  to_ms = next.time_ms;
  return candidate;
}

}  // namespace remat::detail
