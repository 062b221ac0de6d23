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

/// The backward of one recorded stage, as the executor runs it (and as
/// profile_chain measures it): `output` (x_{i+1}, carrying the stage's graph)
/// receives `grad_output` (g_{i+1}); leaves accumulate their gradients in
/// .grad. Both arguments are consumed: when the caller holds no other
/// reference to them, autograd frees each as soon as the node that uses it
/// has run, as in a plain backward, not when the stage's backward ends.
/// REQUIRES: output.requires_grad(); grad_output defined, of output's shape.
void run_stage_backward(torch::Tensor output, torch::Tensor grad_output);

/// Runs the forward phase of `plan` (every op before the first backward) over
/// the children of `sequential` on `input` and returns the chain output. Its
/// grad_fn runs the rest of the plan. REQUIRES: grad mode on; `plan` valid for
/// sequential->size() stages (checked by the caller).
torch::Tensor run_plan(
    const torch::nn::Sequential& sequential,
    const planner::Plan& plan,
    const torch::Tensor& input);

}  // namespace remat::detail
