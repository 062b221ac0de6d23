// strategy.h: the plan a command runs, for a --strategy and a --budget.
//
// The library does the work: planner::Strategy parses --strategy and
// planner::solve() makes the plan; remat::Budget parses --budget and resolves
// it against the chain (100% = the simulated store-all peak). What the tool
// adds is its rule for explicit budgets and its error:
//  - optimal and chen are driven by the budget; no plan of theirs fits
//    -> InfeasibleBudgetError (exit 2) stating the minimum feasible budget.
//  - sqrt, uniform:K and none ignore the budget when planning; a budget given
//    explicitly is still a constraint: a plan predicted above it is an
//    InfeasibleBudgetError too. A budget the user did not give is not.
//  - A command's default budget (50%) below the chain's minimum feasible
//    budget is raised to that minimum, and the report says so: the default
//    must work on any model. A given budget is never changed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <remat/budget.h>
#include <remat/planner.h>
#include <remat/policy.h>

namespace remat::cli {

/// Where a command's budget comes from, which decides how it binds (see the
/// top of this header).
enum class BudgetOrigin {
  kGiven,    ///< the user gave it: binds every strategy, never changed
  kDefault,  ///< the command's default: raised to the minimum when below it
  kSweep,    ///< one of bench's budgets: binds optimal and chen only
};

/// A plan chosen for a chain, with its prediction and the numbers around it.
struct PlanChoice {
  planner::Strategy strategy;
  /// The budget in bytes (simulate()'s units); std::nullopt when there is
  /// none, or when it does not apply (a fixed strategy, budget not given).
  std::optional<int64_t> budget_bytes;
  /// The budget as reports name it: "none", Budget::to_string(), or, for a
  /// default raised to the minimum, "the minimum feasible budget (the
  /// default, 50% of the store-all peak, is below it)".
  std::string budget_text = "none";
  planner::Plan plan;
  /// simulate(chain, plan): valid, peak_bytes, time_ms.
  planner::Simulation simulation;
  /// Predicted peak and time of storing everything (no checkpointing).
  int64_t store_all_peak_bytes = 0;
  double store_all_time_ms = 0;
  /// The smallest budget at which any plan fits; std::nullopt for a chain
  /// longer than planner::kMaxExactStages (not computed: too slow).
  std::optional<int64_t> min_feasible_bytes;
  /// The policy the plan's kForwardSelective ops run under: the one the
  /// chain was profiled with (empty: the chain has no selective costs).
  Policy selective_policy;
};

/// Solves `chain` with `strategy` under `budget`, bound as `origin` says.
/// Throws InfeasibleBudgetError as described at the top of this header
/// (budget and minimum in bytes), std::invalid_argument from the solvers.
///
/// Example:
// clang-format off
///   PlanChoice choice = choose_plan(chain, planner::Strategy::parse("optimal"),
///                                   Budget::parse("50%"), BudgetOrigin::kGiven);
// clang-format on
PlanChoice choose_plan(
    const planner::Chain& chain,
    const planner::Strategy& strategy,
    const Budget& budget,
    BudgetOrigin origin,
    int64_t memory_slots = planner::SolverOptions{}.memory_slots);

/// The plan in brief: "N stages, F forwards (R record, C checkpoint, N
/// no-save), E recomputed: C0 N1 R2 ..." limited to about `max_chars`
/// characters of plan text.
std::string plan_brief(const planner::Plan& plan, size_t max_chars = 72);

/// Number of stage forwards a plan runs beyond one per stage.
int64_t extra_forwards(const planner::Plan& plan);

}  // namespace remat::cli
