// self_correct.cpp: measured stage times and the switch between plans, for
// chains and graphs (self_correct.h; the contracts are remat/planned_chain.h
// and remat/graph.h, "Self-correction").
#include "self_correct.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include <c10/util/Exception.h>

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

std::vector<planner::StageCost> StageTimes::measured_costs(
    std::vector<planner::StageCost> stages) const {
  const std::lock_guard<std::mutex> lock(mutex_);
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
  return stages;
}

planner::Chain StageTimes::apply_to(const planner::Chain& profiled) const {
  return with_stage_costs(profiled, measured_costs(profiled.stages()));
}

planner::Graph StageTimes::apply_to(const planner::Graph& profiled) const {
  return with_stage_costs(profiled, measured_costs(profiled.stages()));
}

planner::Chain with_stage_costs(
    const planner::Chain& costs, std::vector<planner::StageCost> stages) {
  return planner::Chain(
             std::move(stages),
             costs.input_bytes(),
             costs.resident_bytes(),
             costs.model_state())
      .with_cold_write_ms_per_mib(costs.cold_write_ms_per_mib());
}

planner::Graph with_stage_costs(
    const planner::Graph& costs, std::vector<planner::StageCost> stages) {
  std::vector<std::vector<int64_t>> inputs;
  for (int64_t i = 0; i < costs.size(); ++i) {
    inputs.push_back(costs.inputs(i));
  }
  return planner::Graph(
             std::move(stages),
             std::move(inputs),
             costs.input_bytes(),
             costs.model_state())
      .with_cold_write_ms_per_mib(costs.cold_write_ms_per_mib());
}

template <class Costs>
Costs without_selective_costs(const Costs& costs) {
  std::vector<planner::StageCost> stages = costs.stages();
  for (auto& stage : stages) {
    stage.selective.reset();
  }
  return with_stage_costs(costs, std::move(stages));
}

void check_correction_options(
    const char* who, int64_t correction_steps, double correction_threshold) {
  TORCH_CHECK(
      correction_steps >= 1,
      who,
      ": expected options.correction_steps >= 1, got ",
      correction_steps);
  TORCH_CHECK(
      std::isfinite(correction_threshold) && correction_threshold >= 0,
      who,
      ": expected options.correction_threshold finite and >= 0, got ",
      correction_threshold);
}

template <class Costs>
Correction<Costs> start_correction(
    std::vector<int64_t> shape,
    Costs costs,
    int64_t budget_bytes,
    std::vector<BasicPlanCorrection<Costs>> log) {
  const int64_t stages = costs.size();
  return Correction<Costs>{
      std::move(shape),
      std::move(costs),
      budget_bytes,
      std::make_shared<StageTimes>(stages),
      0,
      std::nullopt,
      std::move(log)};
}

template <class Costs>
std::optional<planner::Plan> corrected_plan(
    const Costs& measured,
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

template <class Costs>
bool correct_before_step(
    Correction<Costs>& correction,
    planner::Plan& plan,
    const CorrectionRule& rule) {
  bool switched = false;
  if (correction.times->steps() >= rule.window_steps) {
    Costs measured = correction.times->apply_to(correction.costs);
    double from_ms = 0;
    double to_ms = 0;
    std::optional<planner::Plan> next = corrected_plan(
        measured,
        plan,
        correction.budget_bytes,
        rule.threshold,
        rule.solver,
        from_ms,
        to_ms);
    if (next) {
      correction.log.push_back(BasicPlanCorrection<Costs>{
          correction.steps_under_plan, plan, *next, from_ms, to_ms, measured});
      plan = std::move(*next);
      correction.steps_under_plan = 0;
      switched = true;
    }
    correction.measured = std::move(measured);
    correction.times->clear();
  }
  ++correction.steps_under_plan;
  return switched;
}

template <class Costs>
Costs with_cold_writes_within(
    Costs costs, int64_t budget_bytes, int64_t max_bytes, c10::Device device) {
  int64_t working_set_bytes = costs.input_bytes();
  for (int64_t i = 0; i < costs.size(); ++i) {
    working_set_bytes += costs.stage(i).saved_bytes;
  }
  // The measurement holds its buffers and one more of at most their size.
  const int64_t within = std::min(
      {working_set_bytes, (budget_bytes - costs.input_bytes()) / 2, max_bytes});
  return costs.with_cold_write_ms_per_mib(
      cold_write_ms_per_mib(within, device));
}

#define REMAT_SELF_CORRECT_FOR(Costs)                          \
  template Costs without_selective_costs<Costs>(const Costs&); \
  template Costs with_cold_writes_within<Costs>(               \
      Costs, int64_t, int64_t, c10::Device);                   \
  template Correction<Costs> start_correction<Costs>(          \
      std::vector<int64_t>,                                    \
      Costs,                                                   \
      int64_t,                                                 \
      std::vector<BasicPlanCorrection<Costs>>);                \
  template std::optional<planner::Plan> corrected_plan<Costs>( \
      const Costs&,                                            \
      const planner::Plan&,                                    \
      int64_t,                                                 \
      double,                                                  \
      const planner::SolverOptions&,                           \
      double&,                                                 \
      double&);                                                \
  template bool correct_before_step<Costs>(                    \
      Correction<Costs>&, planner::Plan&, const CorrectionRule&);

REMAT_SELF_CORRECT_FOR(planner::Chain)
REMAT_SELF_CORRECT_FOR(planner::Graph)
#undef REMAT_SELF_CORRECT_FOR

}  // namespace remat::detail
