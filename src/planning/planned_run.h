// planned_run.h (private): what PlannedChain and PlannedSequential share: the
// plan check and the forward with its input-shape policy.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

#include "plan_executor.h"
#include "remat/planned_chain.h"
#include "self_correct.h"

namespace remat::detail {

/// A planned chain's state: its stages, the plan in use, the plans by shape.
struct PlannedRun {
  std::shared_ptr<const std::vector<Stage>> stages;
  planner::Plan plan;
  std::map<std::vector<int64_t>, planner::Plan> plans_by_shape;
  /// The chain of each planned shape whose chain is known.
  std::map<std::vector<int64_t>, planner::Chain> chains_by_shape;
  /// Self-correction's state (options.self_correct), from the first
  /// training forward on.
  std::optional<Correction<planner::Chain>> correction;
  /// The program of `plan` over `stages`, made on the first training
  /// forward and again when the plan in force changes.
  std::shared_ptr<const PlanProgram> program;
};

/// The switches of `run`'s self-correction (empty without one).
const std::vector<PlanCorrection>& corrections_of(const PlannedRun& run);

/// The last measured window's chain of `run` (nullopt without one).
const std::optional<planner::Chain>& measured_chain_of(const PlannedRun& run);

/// "ops=8, plan=R0 R1 ..." (the plan's text cut at 60 characters).
std::string plan_summary(const planner::Plan& plan);

/// Throws c10::Error, naming `who`, unless `run.plan` is valid for the
/// stages and a kReplan policy has a budget. Records the plan under
/// options.input_shape when that is set.
void check_planned_run(
    const char* who, PlannedRun& run, const PlannedChainOptions& options);

/// The forward of a planned chain: applies the shape policy (which may
/// re-plan, updating `run` and options.input_shape), then runs the plan
/// when training needs gradients (grad mode on and the input or a parameter
/// of `owner` requiring grad), else the stages plainly. With
/// options.self_correct a training forward first applies self-correction
/// (remat/planned_chain.h), which may replace run.plan, and times the run.
torch::Tensor planned_forward(
    const char* who,
    PlannedRun& run,
    PlannedChainOptions& options,
    const torch::nn::Module& owner,
    const torch::Tensor& input);

}  // namespace remat::detail
