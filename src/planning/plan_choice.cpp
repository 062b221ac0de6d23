// plan_choice.cpp: choose_plan and plan_within (rules in remat/plan_choice.h).
#include "remat/plan_choice.h"

#include <string>
#include <utility>

#include <c10/util/Exception.h>

#include "remat/planner/units.h"

namespace remat {
namespace {

std::string infeasible_message(
    const PlanChoice& choice, const std::string& what) {
  const std::string minimum = choice.min_feasible_bytes
      ? "the minimum feasible budget is " +
          planner::format_bytes(*choice.min_feasible_bytes) + " (" +
          std::to_string(*choice.min_feasible_bytes) +
          " bytes; the optimal strategy reaches it)"
      : "the minimum feasible budget is not computed for chains of more "
        "than " +
          std::to_string(planner::kMaxExactStages) + " stages";
  return "budget " + planner::format_bytes(*choice.budget_bytes) + " (" +
         std::to_string(*choice.budget_bytes) + " bytes) is infeasible: " +
         what + "; " + minimum;
}

}  // namespace

PlanChoice choose_plan(
    const planner::Chain& chain,
    const planner::Strategy& strategy,
    const Budget& budget,
    BudgetOrigin origin,
    const planner::SolverOptions& solver) {
  PlanChoice choice;
  choice.strategy = strategy;
  const planner::Simulation store_all =
      planner::simulate(chain, planner::solve_store_all(chain));
  choice.store_all_peak_bytes = store_all.peak_bytes;
  choice.store_all_time_ms = store_all.time_ms;
  if (chain.size() <= planner::kMaxExactStages) {
    choice.min_feasible_bytes = planner::min_feasible_budget_bytes(chain);
  }
  if (!budget.is_none() &&
      (strategy.uses_budget() || origin == BudgetOrigin::kGiven)) {
    choice.budget_bytes = budget.resolve_bytes(chain);
    choice.budget_text = budget.to_string();
    if (origin == BudgetOrigin::kDefault && choice.min_feasible_bytes &&
        *choice.budget_bytes < *choice.min_feasible_bytes) {
      choice.budget_bytes = *choice.min_feasible_bytes;
      choice.budget_text = "the minimum feasible budget (the default, " +
                           budget.to_string() + ", is below it)";
    }
  }
  std::optional<planner::Plan> plan = planner::solve(
      chain,
      strategy,
      choice.budget_bytes.value_or(choice.store_all_peak_bytes),
      solver);
  if (!plan) {
    throw InfeasibleBudgetError(
        infeasible_message(
            choice, "no " + strategy.to_string() + " plan fits it"),
        choice.min_feasible_bytes);
  }
  choice.plan = std::move(*plan);
  choice.simulation = planner::simulate(chain, choice.plan);
  if (choice.budget_bytes &&
      choice.simulation.peak_bytes > *choice.budget_bytes) {
    throw InfeasibleBudgetError(
        infeasible_message(
            choice,
            strategy.to_string() + " is predicted to peak at " +
                planner::format_bytes(choice.simulation.peak_bytes)),
        choice.min_feasible_bytes);
  }
  return choice;
}

planner::Plan plan_within(
    const planner::Chain& chain,
    const Budget& budget,
    const planner::SolverOptions& solver) {
  // The library's contract for this case: c10::Error naming both numbers.
  const int64_t budget_bytes = budget.resolve_bytes(chain);
  const int64_t minimum_bytes = planner::min_feasible_budget_bytes(chain);
  TORCH_CHECK(
      budget_bytes >= minimum_bytes,
      "remat::plan_within: expected a budget of at least ",
      minimum_bytes,
      " bytes (the minimum feasible for this model and input), got ",
      budget_bytes,
      " bytes (",
      budget.to_string(),
      ")");
  return choose_plan(
             chain,
             planner::Strategy::parse("optimal"),
             budget,
             BudgetOrigin::kGiven,
             solver)
      .plan;
}

}  // namespace remat
