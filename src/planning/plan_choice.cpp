// plan_choice.cpp: choose_plan and plan_within (rules in remat/plan_choice.h).
#include "remat/plan_choice.h"

#include <algorithm>
#include <string>
#include <utility>

#include <c10/util/Exception.h>

#include "remat/planner/units.h"

namespace remat {
namespace {

std::string infeasible_message(
    const PlanChoice& choice, const std::string& what) {
  const std::string minimum =
      choice.min_feasible_bytes
          ? "the minimum feasible budget is " +
                planner::format_bytes(*choice.min_feasible_bytes) + " (" +
                std::to_string(*choice.min_feasible_bytes) +
                " bytes; the optimal strategy reaches it)"
          : "the minimum feasible budget is not computed for chains of more "
            "than " +
                std::to_string(planner::kMaxExactStages) + " stages";
  return "budget " + planner::format_bytes(*choice.budget_bytes) + " (" +
         std::to_string(*choice.budget_bytes) +
         " bytes) is infeasible: " + what + "; " + minimum;
}

// Stores `plan` and its simulation in the choice; throws when no plan was
// found or a bound budget is below its predicted peak. `name` names the
// strategy in the message.
template <typename Model>
void take_plan(
    PlanChoice& choice,
    const Model& model,
    std::optional<planner::Plan> plan,
    const std::string& name) {
  if (!plan) {
    throw InfeasibleBudgetError(
        infeasible_message(choice, "no " + name + " plan fits it"),
        choice.min_feasible_bytes);
  }
  choice.plan = std::move(*plan);
  choice.simulation = planner::simulate(model, choice.plan);
  if (choice.budget_bytes &&
      choice.simulation.peak_bytes > *choice.budget_bytes) {
    throw InfeasibleBudgetError(
        infeasible_message(
            choice,
            name + " is predicted to peak at " +
                planner::format_bytes(choice.simulation.peak_bytes)),
        choice.min_feasible_bytes);
  }
}

// The least budget of a chain (exact, in bytes) or of a graph (found by the
// graph solvers with `solver`'s search work).
int64_t least_bytes(
    const planner::Chain& chain, const planner::SolverOptions&) {
  return planner::min_feasible_budget_bytes(chain);
}
int64_t least_bytes(
    const planner::Graph& graph, const planner::SolverOptions& solver) {
  return planner::min_feasible_budget_bytes(graph, solver);
}

// A choice up to its plan: the store-all prediction, the minimum (when
// `with_minimum`) and the budget, bound under the rules of the top of
// remat/plan_choice.h.
template <typename Model>
PlanChoice start_choice(
    const Model& model,
    planner::Strategy strategy,
    const Budget& budget,
    BudgetOrigin origin,
    bool with_minimum,
    const planner::SolverOptions& solver = {}) {
  PlanChoice choice;
  choice.strategy = std::move(strategy);
  const planner::Simulation store_all =
      planner::simulate(model, planner::solve_store_all(model));
  choice.store_all_peak_bytes = store_all.peak_bytes;
  choice.store_all_step_ms = store_all.step_ms;
  if (with_minimum) {
    choice.min_feasible_bytes = least_bytes(model, solver);
  }
  if (budget.is_none() ||
      (!choice.strategy.uses_budget() && origin != BudgetOrigin::kGiven)) {
    return choice;
  }
  choice.budget_bytes = budget.resolve_bytes(model);
  choice.budget_text = budget.to_string();
  if (origin == BudgetOrigin::kDefault && choice.min_feasible_bytes &&
      *choice.budget_bytes < *choice.min_feasible_bytes) {
    choice.budget_bytes = *choice.min_feasible_bytes;
    choice.budget_text = "the minimum feasible budget (the default, " +
                         budget.to_string() + ", is below it)";
  }
  return choice;
}

// Both plan_within()s: the library's contract for a budget below the
// minimum is a c10::Error naming both numbers.
[[noreturn]] void throw_below_minimum(
    int64_t minimum_bytes, int64_t budget_bytes, const Budget& budget) {
  TORCH_CHECK(
      false,
      "remat::plan_within: expected a budget of at least ",
      minimum_bytes,
      " bytes (the minimum feasible for this model and input), got ",
      budget_bytes,
      " bytes (",
      budget.to_string(),
      ")");
}

}  // namespace

PlanChoice choose_plan(
    const planner::Chain& chain,
    const planner::Strategy& strategy,
    const Budget& budget,
    BudgetOrigin origin,
    const planner::SolverOptions& solver) {
  PlanChoice choice = start_choice(
      chain,
      strategy,
      budget,
      origin,
      chain.size() <= planner::kMaxExactStages);
  const auto solve_at = [&](int64_t bytes) {
    return planner::solve(chain, strategy, bytes, solver);
  };
  std::optional<planner::Plan> plan = solve_at(choice.budget_bytes.value_or(
      std::max<int64_t>(1, choice.store_all_peak_bytes)));
  if (!plan && origin == BudgetOrigin::kDefault && choice.budget_bytes &&
      *choice.budget_bytes < choice.store_all_peak_bytes) {
    // A default must work on any model: raised to the least budget this
    // strategy fits (a heuristic such as chen's may need more than the
    // optimal minimum). Its plans fit every budget from there on, up to the
    // store-all peak, where it records everything.
    int64_t infeasible = *choice.budget_bytes;
    int64_t feasible = choice.store_all_peak_bytes;
    while (feasible - infeasible > 1) {
      const int64_t middle = infeasible + (feasible - infeasible) / 2;
      (solve_at(middle) ? feasible : infeasible) = middle;
    }
    plan = solve_at(feasible);
    if (plan) {
      choice.budget_bytes = feasible;
      choice.budget_text = "the least budget " + strategy.to_string() +
                           " fits (the default, " + budget.to_string() +
                           ", is below it)";
    }
  }
  take_plan(choice, chain, std::move(plan), strategy.to_string());
  return choice;
}

PlanChoice choose_plan(
    const planner::Graph& graph,
    const Budget& budget,
    BudgetOrigin origin,
    const planner::SolverOptions& solver) {
  PlanChoice choice = start_choice(
      graph, planner::Strategy::parse("optimal"), budget, origin, true, solver);
  take_plan(
      choice,
      graph,
      planner::solve_optimal(
          graph,
          choice.budget_bytes.value_or(
              std::max<int64_t>(1, choice.store_all_peak_bytes)),
          solver),
      "optimal");
  return choice;
}

PlanChoice choose_plan(
    const planner::Graph& graph,
    const std::vector<planner::StageMode>& modes,
    const Budget& budget,
    BudgetOrigin origin) {
  PlanChoice choice = start_choice(
      graph, planner::Strategy::parse("none"), budget, origin, true);
  take_plan(
      choice, graph, planner::schedule_graph(graph, modes), "the fixed plan");
  return choice;
}

planner::Plan plan_within(
    const planner::Chain& chain,
    const Budget& budget,
    const planner::SolverOptions& solver) {
  const int64_t budget_bytes = budget.resolve_bytes(chain);
  const int64_t minimum_bytes = planner::min_feasible_budget_bytes(chain);
  if (budget_bytes < minimum_bytes) {
    throw_below_minimum(minimum_bytes, budget_bytes, budget);
  }
  return choose_plan(
             chain,
             planner::Strategy::parse("optimal"),
             budget,
             BudgetOrigin::kGiven,
             solver)
      .plan;
}

planner::Plan plan_within(
    const planner::Graph& graph,
    const Budget& budget,
    const planner::SolverOptions& solver) {
  try {
    return choose_plan(graph, budget, BudgetOrigin::kGiven, solver).plan;
  } catch (const InfeasibleBudgetError& error) {
    throw_below_minimum(
        *error.min_feasible_bytes(), budget.resolve_bytes(graph), budget);
  }
}

}  // namespace remat
