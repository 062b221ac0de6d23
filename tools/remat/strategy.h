// strategy.h: how the tool names and summarizes plans. The plan a command
// runs comes from the library: remat::choose_plan (remat/plan_choice.h) with
// its rules for budgets, which the commands call with their parsed flags.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <remat/plan_choice.h>
#include <remat/planner.h>
#include <CLI/CLI.hpp>

namespace remat::cli {

// The library's plan choice, as the commands name it.
using remat::BudgetOrigin;
using remat::choose_plan;
using remat::InfeasibleBudgetError;
using remat::PlanChoice;

/// The plan in brief: "N stages, F forwards (R record, C checkpoint, N
/// no-save), E recomputed: C0 N1 R2 ..." limited to about `max_chars`
/// characters of plan text.
std::string plan_brief(const planner::Plan& plan, size_t max_chars = 72);

/// Number of stage forwards a plan runs beyond one per stage.
int64_t extra_forwards(const planner::Plan& plan);

/// A note for a budget above the store-all (no-checkpoint) peak, which
/// changes nothing: "note: the budget is 247x the no-checkpoint peak 41.5
/// MiB: nothing is recomputed, checkpointing is not needed at this size".
/// std::nullopt otherwise (no budget, or at most the peak).
std::optional<std::string> budget_note(const PlanChoice& choice);

/// For a budget text that is a bare number ("50", "total:50"), whose unit a
/// user must say: "'50' has no unit; did you mean 50% (of the
/// no-checkpoint peak), 50MiB or 50B (bytes)?" (without the percentage when
/// `percentages` is false: a cap). std::nullopt for any other text (left to
/// Budget::parse).
std::optional<std::string> bare_number_hint(
    const std::string& text, bool percentages = true);

/// Validates a budget flag's value (--budget, --budgets; --cap with
/// `percentages` false): refuses a bare number with bare_number_hint(), then
/// anything Budget::parse refuses, with its message.
CLI::Validator budget_validator(bool percentages = true);

}  // namespace remat::cli
