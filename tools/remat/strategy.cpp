// strategy.cpp: --strategy parsing and plan choice (rules in strategy.h).
#include "strategy.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <set>
#include <stdexcept>

#include "cli_error.h"

namespace remat::cli {
namespace {

constexpr const char* kExpected =
    "expected optimal, chen, sqrt, uniform:K (K >= 1 segments) or none";

[[noreturn]] void reject(std::string_view text, const std::string& why) {
  std::string message =
      std::string(kExpected) + "; got '" + std::string(text) + "'";
  if (!why.empty()) {
    message += " (" + why + ")";
  }
  throw std::invalid_argument(message);
}

std::string infeasible_message(
    const PlanChoice& choice, const std::string& what) {
  return "budget " + format_bytes(*choice.budget_bytes) + " (" +
         std::to_string(*choice.budget_bytes) +
         " bytes) is infeasible: " + what +
         "; the minimum feasible budget is " +
         format_bytes(choice.min_feasible_bytes) + " (" +
         std::to_string(choice.min_feasible_bytes) +
         " bytes; --strategy optimal reaches it)";
}

}  // namespace

StrategySpec parse_strategy(std::string_view text) {
  StrategySpec strategy;
  if (text == "optimal") {
    strategy.kind = StrategySpec::Kind::kOptimal;
  } else if (text == "chen") {
    strategy.kind = StrategySpec::Kind::kChen;
  } else if (text == "sqrt") {
    strategy.kind = StrategySpec::Kind::kSqrt;
  } else if (text == "none") {
    strategy.kind = StrategySpec::Kind::kNone;
  } else if (text.substr(0, 7) == "uniform") {
    const std::string_view count = text.substr(7);
    if (count.empty() || count[0] != ':' || count.size() == 1) {
      reject(text, "uniform needs a segment count, e.g. uniform:4");
    }
    const std::string digits(count.substr(1));
    for (char c : digits) {
      if (!std::isdigit(static_cast<unsigned char>(c))) {
        reject(text, "the segment count must be a whole number >= 1");
      }
    }
    if (digits.size() > 9 || std::atoll(digits.c_str()) < 1) {
      reject(text, "the segment count must be between 1 and 999999999");
    }
    strategy.kind = StrategySpec::Kind::kUniform;
    strategy.segments = std::atoll(digits.c_str());
  } else {
    reject(text, "");
  }
  return strategy;
}

std::string StrategySpec::to_string() const {
  switch (kind) {
    case Kind::kOptimal:
      return "optimal";
    case Kind::kChen:
      return "chen";
    case Kind::kSqrt:
      return "sqrt";
    case Kind::kUniform:
      return "uniform:" + std::to_string(segments);
    case Kind::kNone:
      return "none";
  }
  return "?";
}

BudgetFrame planner_frame(const planner::Chain& chain) {
  BudgetFrame frame;
  frame.reference_peak_bytes =
      planner::simulate(chain, planner::solve_store_all(chain)).peak_bytes;
  return frame;
}

PlanChoice choose_plan(
    const planner::Chain& chain,
    const StrategySpec& strategy,
    const BudgetSpec& budget,
    bool budget_is_constraint,
    const BudgetFrame& frame,
    int64_t memory_slots) {
  PlanChoice choice;
  choice.strategy = strategy;
  choice.frame = frame;
  const planner::Plan store_all = planner::solve_store_all(chain);
  const planner::Simulation store_all_simulation =
      planner::simulate(chain, store_all);
  choice.store_all_peak_bytes = store_all_simulation.peak_bytes;
  choice.store_all_time_ms = store_all_simulation.time_ms;
  choice.min_feasible_bytes =
      planner::min_feasible_budget_bytes(chain) - frame.offset_bytes;

  const bool has_budget = budget.kind != BudgetSpec::Kind::kNone &&
                          (strategy.uses_budget() || budget_is_constraint);
  if (has_budget) {
    choice.budget_bytes =
        resolve_budget_bytes(budget, frame.reference_peak_bytes);
    choice.planner_budget_bytes =
        std::max<int64_t>(1, *choice.budget_bytes + frame.offset_bytes);
  }

  switch (strategy.kind) {
    case StrategySpec::Kind::kOptimal:
    case StrategySpec::Kind::kChen: {
      const int64_t budget_bytes =
          choice.planner_budget_bytes.value_or(choice.store_all_peak_bytes);
      std::optional<planner::Plan> plan;
      if (strategy.kind == StrategySpec::Kind::kOptimal) {
        planner::SolverOptions options;
        options.memory_slots = memory_slots;
        plan = planner::solve_optimal(chain, budget_bytes, options);
      } else {
        plan = planner::solve_chen_greedy(chain, budget_bytes);
      }
      if (!plan) {
        throw InfeasibleBudgetError(
            infeasible_message(
                choice, "no " + strategy.to_string() + " plan fits it"),
            choice.min_feasible_bytes);
      }
      choice.plan = std::move(*plan);
      break;
    }
    case StrategySpec::Kind::kSqrt:
      choice.plan = planner::solve_sqrt(chain);
      break;
    case StrategySpec::Kind::kUniform:
      choice.plan = planner::solve_uniform(chain, strategy.segments);
      break;
    case StrategySpec::Kind::kNone:
      choice.plan = store_all;
      break;
  }
  choice.simulation = planner::simulate(chain, choice.plan);
  if (choice.planner_budget_bytes &&
      choice.simulation.peak_bytes > *choice.planner_budget_bytes) {
    throw InfeasibleBudgetError(
        infeasible_message(
            choice,
            strategy.to_string() + " is predicted to peak at " +
                format_bytes(
                    choice.simulation.peak_bytes - frame.offset_bytes)),
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
  int64_t recorded = 0, checkpointed = 0, no_save = 0;
  std::set<int64_t> stages;
  for (const planner::Op& op : plan.ops) {
    switch (op.kind) {
      case planner::OpKind::kForwardRecord:
        ++recorded;
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
  return std::to_string(stages.size()) + " stages, " +
         std::to_string(recorded + checkpointed + no_save) + " forwards (" +
         std::to_string(recorded) + " record, " + std::to_string(checkpointed) +
         " checkpoint, " + std::to_string(no_save) + " no-save), " +
         std::to_string(extra_forwards(plan)) + " recomputed: " + text;
}

}  // namespace remat::cli
