// chain_plans.h — what the planned-execution scenarios (E1, E2, E2-variants)
// share: how a chain is profiled for them, and counts read off plans.
#pragma once

#include <cstdint>

#include <torch/torch.h>

#include "remat/planner.h"
#include "remat/remat.h"

namespace remat::bench {

/// profile_chain with 3 warm-up and 11 timed runs (more than its default):
/// single stage times of a few ms vary by tens of percent on a shared
/// machine, and plans follow the times.
planner::Chain profile_for_planning(
    torch::nn::Sequential model, const torch::Tensor& input);

/// `chain` with every stage's forward and backward time replaced by the
/// median over its stages: for chains of identical stages, where what
/// differs between their measured times is noise the plan should not follow.
planner::Chain with_equal_stage_times(const planner::Chain& chain);

/// Stage forwards a plan executes (every op but the backwards).
int64_t stage_forwards(const planner::Plan& plan);

}  // namespace remat::bench
