// strategy.h: the --strategy flag and the choice of a plan for a budget.
//
// Strategies: "optimal" (the rotor dynamic program), "chen" (Chen et al.'s
// greedy segmentation with budget search), "sqrt" (sqrt(L) uniform segments),
// "uniform:K" (checkpoint_sequential with K segments) and "none" (store all).
//
// Budget rules, shared by every command:
//  - optimal and chen are driven by the budget; no plan of theirs fits
//    -> InfeasibleBudgetError (exit 2) stating the minimum feasible budget.
//  - sqrt, uniform:K and none ignore the budget when planning; a budget given
//    explicitly is still a constraint: a plan predicted above it is an
//    InfeasibleBudgetError too. A budget the user did not give is not.
//  - The user's budget lives in a BudgetFrame: what 100% means, and the
//    offset from user bytes to planner bytes (what planner::simulate()
//    counts). plan and explain use the planner's own frame (100% = the
//    simulated store-all peak, offset 0); train and bench measure the model
//    and use a measured frame (100% = the measured no-checkpoint activation
//    peak, offset = simulated store-all peak minus the measured peak of
//    PlannedSequential running the store-all plan; runtime.h), so that a
//    plan solved in planner bytes lands within the budget the user measures.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <remat/planner.h>

#include "budget.h"

namespace remat::cli {

/// A parsed --strategy value.
struct StrategySpec {
  enum class Kind { kOptimal, kChen, kSqrt, kUniform, kNone };
  Kind kind = Kind::kOptimal;
  /// Segments, for kUniform; >= 1.
  int64_t segments = 0;

  /// The flag text: "optimal", "chen", "sqrt", "uniform:4", "none".
  std::string to_string() const;
  /// True for optimal and chen, whose plan depends on the budget.
  bool uses_budget() const {
    return kind == Kind::kOptimal || kind == Kind::kChen;
  }
};

/// Parses a --strategy value. Throws std::invalid_argument naming the value
/// and the accepted forms, e.g. "expected optimal, chen, sqrt, uniform:K
/// (K >= 1 segments) or none; got 'nope'".
///
/// Example:
///   StrategySpec strategy = parse_strategy("uniform:4");  // kUniform, 4
StrategySpec parse_strategy(std::string_view text);

/// How user-facing budget bytes map onto planner bytes (see the top).
struct BudgetFrame {
  /// User bytes that 100% means (a no-checkpoint peak).
  int64_t reference_peak_bytes = 0;
  /// planner bytes = user bytes + offset_bytes.
  int64_t offset_bytes = 0;
};

/// The planner's own frame for `chain`: 100% is the simulated store-all peak.
BudgetFrame planner_frame(const planner::Chain& chain);

/// A plan chosen for a chain, with its prediction and the numbers around it.
struct PlanChoice {
  StrategySpec strategy;
  /// The budget in the user's bytes; std::nullopt when there is none.
  std::optional<int64_t> budget_bytes;
  /// The same budget in planner bytes (what the plan was solved for or
  /// checked against).
  std::optional<int64_t> planner_budget_bytes;
  /// The frame used.
  BudgetFrame frame;
  planner::Plan plan;
  /// simulate(chain, plan): valid, peak_bytes, time_ms.
  planner::Simulation simulation;
  /// Predicted peak and time of storing everything (no checkpointing).
  int64_t store_all_peak_bytes = 0;
  double store_all_time_ms = 0;
  /// The smallest budget at which any plan fits, in the user's bytes.
  int64_t min_feasible_bytes = 0;
};

/// Solves `chain` with `strategy` under `budget` in `frame`.
/// `budget_is_constraint`: whether the budget binds fixed strategies (true
/// when the user gave it). Throws InfeasibleBudgetError as described at the
/// top of this header (the message gives budget and minimum in user bytes),
/// std::invalid_argument from the solvers.
///
/// Example:
///   PlanChoice choice = choose_plan(chain, parse_strategy("optimal"),
///       parse_budget("50%"), true, planner_frame(chain));
PlanChoice choose_plan(
    const planner::Chain& chain,
    const StrategySpec& strategy,
    const BudgetSpec& budget,
    bool budget_is_constraint,
    const BudgetFrame& frame,
    int64_t memory_slots = planner::SolverOptions{}.memory_slots);

/// The plan in brief: "N stages: R 2, C 3, N 5 forwards, 4 recomputed; e.g.
/// C0 N1 R2 ..." limited to about `max_chars` characters of plan text.
std::string plan_brief(const planner::Plan& plan, size_t max_chars = 72);

/// Number of stage forwards a plan runs beyond one per stage.
int64_t extra_forwards(const planner::Plan& plan);

}  // namespace remat::cli
