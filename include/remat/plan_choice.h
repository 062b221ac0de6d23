// remat/plan_choice.h: the plan to run, for a strategy and a budget: what
// plan_within does for the optimal strategy, for every strategy, with the
// rules the remat tool applies (it only parses flags and calls this).
//
//  - optimal and chen are driven by the budget; when no plan of theirs fits
//    it, choose_plan throws InfeasibleBudgetError stating the budget and the
//    minimum feasible budget.
//  - sqrt, uniform:K and none ignore the budget when planning; a budget given
//    explicitly (BudgetOrigin::kGiven) still binds them: a plan predicted to
//    peak above it is an InfeasibleBudgetError too. Otherwise it does not.
//  - A default budget (BudgetOrigin::kDefault) below the chain's minimum
//    feasible budget is raised to that minimum, and budget_text says so: a
//    program's default must work on any model. If the strategy (chen's
//    greedy) fits no plan there, it is raised further, to the least budget
//    the strategy fits. A given budget is never changed.
//  - Budget::none() plans with the store-all peak as the budget.
//
// The same rules hold on a graph (remat/planner/graph.h), whose strategies are
// the optimal plan (driven by the budget) and fixed stage modes
// (planner::schedule_graph: every stage kCheckpoint is per-block
// checkpointing), which ignore it when planning.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "remat/budget.h"
#include "remat/planner/chain.h"
#include "remat/planner/graph.h"
#include "remat/planner/plan.h"
#include "remat/planner/simulate.h"
#include "remat/planner/solvers.h"
#include "remat/planner/strategy.h"
#include "remat/policy.h"

namespace remat {

/// Where a budget comes from, which decides how it binds (see the top).
enum class BudgetOrigin {
  kGiven,    ///< given by the user: binds every strategy, never changed
  kDefault,  ///< a program's default: raised to the minimum when below it
  kSweep,    ///< one of a sweep's budgets: binds optimal and chen only
};

/// A plan chosen for a chain or a graph, with its prediction and the numbers
/// around it.
struct PlanChoice {
  /// The chain strategy; on a graph, kOptimal for the optimal plan and kNone
  /// for fixed stage modes (the caller names those).
  planner::Strategy strategy;
  /// The budget in bytes (simulate()'s units); std::nullopt when there is
  /// none, or when it does not apply (a fixed strategy, budget not given).
  std::optional<int64_t> budget_bytes;
  /// The budget as reports name it: "none", Budget::to_string(), or, for a
  /// default raised to the minimum, "the minimum feasible budget (the
  /// default, 50% of the store-all peak, is below it)".
  std::string budget_text = "none";
  planner::Plan plan;
  /// simulate(chain, plan): valid, peak_bytes, time_ms, step_ms.
  planner::Simulation simulation;
  /// Predicted peak and step time (Simulation::step_ms) of storing
  /// everything (no checkpointing).
  int64_t store_all_peak_bytes = 0;
  double store_all_step_ms = 0;
  /// The smallest budget at which any plan fits; std::nullopt for a chain
  /// longer than planner::kMaxExactStages (not computed: too slow). Always
  /// computed on a graph.
  std::optional<int64_t> min_feasible_bytes;
  /// The policy the plan's kForwardSelective ops run under: the one the
  /// chain was profiled with (empty: the chain has no selective costs).
  /// choose_plan leaves it empty; the caller sets it.
  Policy selective_policy;
};

/// No plan of the requested strategy fits the budget. The message states the
/// budget and the minimum feasible budget (where it is computed), in bytes.
class InfeasibleBudgetError : public std::runtime_error {
 public:
  InfeasibleBudgetError(
      const std::string& message, std::optional<int64_t> min_feasible_bytes)
      : std::runtime_error(message), min_feasible_bytes_(min_feasible_bytes) {}
  /// The smallest budget (bytes) at which some plan fits; std::nullopt for a
  /// chain longer than the exact solvers take.
  std::optional<int64_t> min_feasible_bytes() const {
    return min_feasible_bytes_;
  }

 private:
  std::optional<int64_t> min_feasible_bytes_;
};

/// Solves `chain` with `strategy` under `budget`, bound as `origin` says (see
/// the top). Throws InfeasibleBudgetError as described there,
/// std::invalid_argument from the solvers (an exact solver on a chain over
/// planner::kMaxExactStages stages, for example).
///
/// Example:
// clang-format off
///   remat::PlanChoice choice = remat::choose_plan(
///       chain, remat::planner::Strategy::parse("sqrt"),
///       remat::Budget::parse("60%"), remat::BudgetOrigin::kGiven);
///   remat::PlannedChain net(stages, choice.plan);
// clang-format on
PlanChoice choose_plan(
    const planner::Chain& chain,
    const planner::Strategy& strategy,
    const Budget& budget,
    BudgetOrigin origin,
    const planner::SolverOptions& solver = {});

/// The optimal plan (planner::solve_optimal) for `chain` within `budget`:
/// choose_plan with the optimal strategy and a given budget. 100% is the
/// predicted store-all peak; Budget::none() gives the store-all plan.
///
/// Example:
// clang-format off
///   auto chain = remat::profile_chain(model, sample);
///   remat::PlannedSequential net(model, remat::plan_within(chain, Budget::parse("50%")));
// clang-format on
///
/// Throws c10::Error if the budget is below
/// planner::min_feasible_budget_bytes(chain), naming the minimum and the
/// requested bytes.
planner::Plan plan_within(
    const planner::Chain& chain,
    const Budget& budget,
    const planner::SolverOptions& solver = {});

/// The optimal plan for `graph` (planner::solve_optimal on the graph) under
/// `budget`, bound as `origin` says (see the top). Throws
/// InfeasibleBudgetError naming the budget and
/// planner::min_feasible_budget_bytes(graph) when no plan fits.
PlanChoice choose_plan(
    const planner::Graph& graph,
    const Budget& budget,
    BudgetOrigin origin,
    const planner::SolverOptions& solver = {});

/// The fixed plan planner::schedule_graph(graph, modes) (one mode per
/// stage), with the rules of a fixed strategy: the budget does not shape it,
/// a given one binds it (InfeasibleBudgetError when it is predicted to peak
/// above). Throws std::invalid_argument as schedule_graph for bad modes.
///
/// Example (per-block checkpointing, as MONAI's):
// clang-format off
///   remat::PlanChoice choice = remat::choose_plan(
///       graph, std::vector<remat::planner::StageMode>(
///                  graph.size(), remat::planner::StageMode::kCheckpoint),
///       remat::Budget::parse("2GiB"), remat::BudgetOrigin::kGiven);
// clang-format on
PlanChoice choose_plan(
    const planner::Graph& graph,
    const std::vector<planner::StageMode>& modes,
    const Budget& budget,
    BudgetOrigin origin);

/// The optimal plan for `graph` within `budget`: choose_plan(graph, budget,
/// BudgetOrigin::kGiven).plan. 100% is the predicted store-all peak;
/// Budget::none() gives the store-all plan.
///
/// Example:
// clang-format off
///   auto graph = remat::profile_graph(stages, sample);
///   remat::PlannedGraph net(stages, remat::plan_within(graph, remat::Budget::parse("50%")));
// clang-format on
///
/// Throws c10::Error naming the requested and the minimum bytes if the
/// budget is below planner::min_feasible_budget_bytes(graph), and as
/// Budget::resolve_bytes.
planner::Plan plan_within(
    const planner::Graph& graph,
    const Budget& budget,
    const planner::SolverOptions& solver = {});

}  // namespace remat
