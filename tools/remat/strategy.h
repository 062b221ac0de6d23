// strategy.h: how the tool names and summarizes plans. The plan a command
// runs comes from the library: remat::choose_plan (remat/plan_choice.h) with
// its rules for budgets, which the commands call with their parsed flags.
#pragma once

#include <cstdint>
#include <string>

#include <remat/plan_choice.h>
#include <remat/planner.h>

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

}  // namespace remat::cli
