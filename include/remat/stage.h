// remat/stage.h: one stage of a chain of blocks, for models that are not a
// torch::nn::Sequential of one-tensor children.
//
// A Stage is what the planner plans over: a callable from the stage's input
// to its output, and the module whose parameters and buffers it uses. The
// callable may close over anything else the block needs (an attention mask,
// positions, a flag): only the tensor passed in and the tensor returned are
// the chain's values. Stages are run in order, stage i's output is stage
// i+1's input.
//
// What a stage closes over that changes from batch to batch (a per-batch
// padding mask, a sequence length) must be captured by reference or through
// a shared pointer and set before each forward: a copy captured by value is
// the value at construction, for every batch. A recomputation during
// backward runs the stage again and reads that state again, so it must stay
// as it was for the forward until that batch's backward has finished.
//
// Example (blocks that take a causal mask; `mutable`, because a module
// holder captured by value is const inside a plain lambda):
// clang-format off
///   std::vector<remat::Stage> stages;
///   stages.push_back({[=](const torch::Tensor& t) mutable { return embed(t); }, embed.ptr()});
///   for (auto& block : blocks) {
///     stages.push_back({[=](const torch::Tensor& x) mutable { return block(x, mask); }, block.ptr()});
///   }
///   auto net = remat::auto_checkpoint(stages, tokens, remat::Budget::parse("50%"));
// clang-format on
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>

namespace remat {

/// One stage of a chain: `forward` maps the stage input to its output;
/// `module` owns the parameters and buffers `forward` uses (may be null for a
/// parameter-free stage; several stages may share one module).
///
/// Contract: `forward` takes and returns one defined tensor and reads no
/// tensor that another stage produced except its argument (what it closes
/// over must be constant during a step: a mask, positions). It leaves its
/// argument unchanged (no in-place operation on it: a plan runs the stage
/// again on the same tensor); the executors and profilers check this and
/// throw c10::Error naming the stage. Its randomness comes from LibTorch's
/// default generators, so recomputation can replay it. It runs no backward
/// of its own: a forward whose graph a plan does not keep runs with grad
/// mode off, where torch::autograd::grad inside the stage (a gradient
/// penalty) cannot work; that error gets the stage's index and "grad mode
/// off" as context. Checkpoint such a block with remat::checkpoint
/// (non-reentrant) instead.
struct Stage {
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  std::shared_ptr<torch::nn::Module> module;
};

/// The children of `sequential` as stages (each child's forward, and the
/// child as its module). Throws c10::Error if `sequential` is null.
std::vector<Stage> stages_of(const torch::nn::Sequential& sequential);

}  // namespace remat
