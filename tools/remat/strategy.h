// strategy.h: how the tool names and summarizes plans. The plan a command
// runs comes from the library: remat::choose_plan (remat/plan_choice.h) with
// its rules for budgets, which the commands call with their parsed flags. A
// graph model (a U-Net) is planned by the graph strategies: optimal
// (planner::solve_optimal on the graph), none (store-all), per-block (every
// stage checkpointed: planner::StageMode::kCheckpoint, as MONAI's per-block
// checkpointing) and encoder (only the encoder's stages checkpointed),
// through choose_plan on the graph.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <remat/plan_choice.h>
#include <remat/planner.h>
#include <CLI/CLI.hpp>

namespace remat::cli {

// The library's plan choice, as the commands name it.
using remat::BudgetOrigin;
using remat::choose_plan;
using remat::InfeasibleBudgetError;
using remat::PlanChoice;

/// The ways --strategy plans a graph model.
enum class GraphStrategy {
  kOptimal,   ///< "optimal": the fastest plan the graph solver finds
  kNone,      ///< "none": no checkpointing (the stages run plainly)
  kPerBlock,  ///< "per-block": every stage checkpointed
  kEncoder,   ///< "encoder": the encoder's stages checkpointed, the rest kept
};

/// Parses "optimal", "none", "per-block" or "encoder". Throws UsageError
/// naming the value and the accepted ones otherwise.
GraphStrategy parse_graph_strategy(const std::string& text);

/// The text parse_graph_strategy() accepts.
std::string to_string(GraphStrategy strategy);

/// The stage modes of a fixed graph strategy on a graph of `stages` stages
/// whose first `encoder_stages` are the encoder: per-block, every stage
/// kCheckpoint; encoder, those kCheckpoint and the rest kRecord; none, every
/// stage kRecord. REQUIRES: not kOptimal.
std::vector<planner::StageMode> stage_modes(
    GraphStrategy strategy, int64_t stages, int64_t encoder_stages);

/// The library's choose_plan on a graph (remat/plan_choice.h) for a graph
/// strategy: the optimal plan (searched as `solver` says), or the fixed
/// stage_modes(). Throws as choose_plan.
PlanChoice choose_graph_plan(
    const planner::Graph& graph,
    GraphStrategy strategy,
    int64_t encoder_stages,
    const Budget& budget,
    BudgetOrigin origin,
    const planner::SolverOptions& solver = {});

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
