// strategy.cpp: the plan a command runs (rules in strategy.h).
#include "strategy.h"

#include <algorithm>
#include <set>

#include "cli_error.h"

namespace remat::cli {
namespace {

std::string infeasible_message(
    const PlanChoice& choice, const std::string& what) {
  const std::string minimum = choice.min_feasible_bytes
      ? "the minimum feasible budget is " +
          planner::format_bytes(*choice.min_feasible_bytes) + " (" +
          std::to_string(*choice.min_feasible_bytes) +
          " bytes; --strategy optimal reaches it)"
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
    int64_t memory_slots) {
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

  planner::SolverOptions options;
  options.memory_slots = memory_slots;
  std::optional<planner::Plan> plan = planner::solve(
      chain,
      strategy,
      choice.budget_bytes.value_or(choice.store_all_peak_bytes),
      options);
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

int64_t extra_forwards(const planner::Plan& plan) {
  int64_t forwards = 0;
  std::set<int64_t> stages;
  for (const planner::Op& op : plan.ops) {
    if (op.kind != planner::OpKind::kBackward) {
      ++forwards;
      stages.insert(op.stage);
    }
  }
  return forwards - static_cast<int64_t>(stages.size());
}

std::string plan_brief(const planner::Plan& plan, size_t max_chars) {
  int64_t recorded = 0, selective = 0, checkpointed = 0, no_save = 0;
  std::set<int64_t> stages;
  for (const planner::Op& op : plan.ops) {
    switch (op.kind) {
      case planner::OpKind::kForwardRecord:
        ++recorded;
        break;
      case planner::OpKind::kForwardSelective:
        ++selective;
        break;
      case planner::OpKind::kForwardCheckpoint:
        ++checkpointed;
        break;
      case planner::OpKind::kForwardNoSave:
        ++no_save;
        break;
      case planner::OpKind::kBackward:
        stages.insert(op.stage);
        break;
    }
  }
  std::string text = plan.to_string();
  if (text.size() > max_chars) {
    const size_t cut = text.rfind(' ', max_chars);
    text = text.substr(0, cut == std::string::npos ? max_chars : cut) + " ...";
  }
  const std::string selective_part =
      selective > 0 ? std::to_string(selective) + " selective, " : "";
  return std::to_string(stages.size()) + " stages, " +
         std::to_string(recorded + selective + checkpointed + no_save) +
         " forwards (" + std::to_string(recorded) + " record, " +
         selective_part + std::to_string(checkpointed) + " checkpoint, " +
         std::to_string(no_save) + " no-save), " +
         std::to_string(extra_forwards(plan)) + " recomputed: " + text;
}

}  // namespace remat::cli
