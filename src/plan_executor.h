// plan_executor.h (private): executes a planner::Plan over a Sequential with
// LibTorch autograd. See NOTE: [Plan execution] in plan_executor.cpp.
#pragma once

#include <cstdint>

#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>

#include "remat/planner/chain.h"
#include "remat/planner/plan.h"

namespace remat::detail {

/// A chain of `stages` stages with unit costs: simulate() on it checks a
/// plan's structure (stage range, order, completeness) for that many stages.
planner::Chain unit_chain(int64_t stages);

/// Runs the forward phase of `plan` (every op before the first backward) over
/// the children of `sequential` on `input` and returns the chain output. Its
/// grad_fn runs the rest of the plan. REQUIRES: grad mode on; `plan` valid for
/// sequential->size() stages (checked by the caller).
torch::Tensor run_plan(
    const torch::nn::Sequential& sequential,
    const planner::Plan& plan,
    const torch::Tensor& input);

}  // namespace remat::detail
