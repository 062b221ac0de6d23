// remat/profile.h: measure the cost model of a torch::nn::Sequential or of
// any chain of stages.
//
// profile_chain() turns a Sequential and a sample input into a
// planner::Chain: per child (stage), forward and backward times and the byte
// sizes of the memory model (docs/planner.md, "The memory model"). Bytes are
// measured exactly with MemoryMeter on the sample's device, in the model's
// sense:
//   output_bytes        bytes of the stage output x_{i+1} (= of its gradient)
//   saved_bytes         live bytes after a recorded forward minus before it:
//                       CONTAINS x_{i+1}, EXCLUDES the input x_i
//   forward_tmp_bytes   transient peak of a no-grad forward (kForwardNoSave,
//                       kForwardCheckpoint) above before + output_bytes
//   record_tmp_bytes    transient peak of a recorded forward (kForwardRecord)
//                       above before + saved_bytes; always set. It differs
//                       from forward_tmp_bytes when recording changes what
//                       the forward allocates (dropout: the no-grad forward
//                       frees its mask inside the op, the recorded one keeps
//                       it in saved_bytes)
//   backward_tmp_bytes  transient peak of a backward above before + |g_i|
//                       (negative, down to -|g_i|, when the backward frees
//                       more than it allocates before g_i exists)
//   selective           with ProfileOptions::selective_policy: the same
//                       four sizes for a forward run under the policy
//                       (saved, forward tmp, backward tmp) and the extra
//                       backward time of its recomputation, recompute_ms =
//                       max(0, its backward's median - backward_ms)
// Both tmp terms include the bytes of the stage module's buffers, which a
// recomputation backs up while it runs (so that buffers move once per step).
// Times are the median of `repeats` runs after `warmup` runs.
//
// Profiling runs the model, so it leaves no trace: module buffers (BatchNorm
// running statistics), parameter gradients and the RNG state are restored.
// It is not for a model another thread is training meanwhile (that thread's
// gradients, buffer updates and draws would be overwritten by the restore),
// and its bytes are the process's (MemoryMeter): tensors another thread
// allocates while it runs are counted in the stages' costs. Profiling the
// graph of remat/graph.h (profile_graph) is the same.
// Not supported: children that take or return anything but one Tensor; for
// those, build a std::vector<Stage> (remat/stage.h) and profile that.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/arg.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>

#include "remat/planner/chain.h"
#include "remat/policy.h"
#include "remat/stage.h"

namespace remat {

/// Options of profile_chain().
struct ProfileOptions {
  /// Untimed runs of each measurement before the timed ones. Default: 1.
  TORCH_ARG(int64_t, warmup) = 1;
  /// Timed runs of each measurement; times are their median. Default: 3.
  TORCH_ARG(int64_t, repeats) = 3;
  /// A per-op policy (remat/policy.h): when set, every stage is also
  /// measured run selectively under it (StageCost::selective: what a
  /// forward that keeps only the policy's tensors leaves alive, and what its
  /// backward, recomputation included, costs), so the planner may choose
  /// kForwardSelective. Default: empty (no selective costs).
  TORCH_ARG(Policy, selective_policy) = {};
  /// Bytes of optimizer state per byte of trainable parameters, for the
  /// chain's model state (planner::ModelState: what a total budget,
  /// Budget::total, subtracts): 2 for Adam and AdamW (two moments), 1 for
  /// SGD with momentum, 0 for plain SGD. Default: 2.
  TORCH_ARG(double, optimizer_state_ratio) = 2;
  /// The most bytes of buffers the measurement of cold writes allocates on
  /// a CPU (cold_write_ms_per_mib(): buffers as large as the working set,
  /// the input plus every stage's saved_bytes, up to this; the profile's
  /// peak is at least that much). 0: not measured (the rate is then 0).
  /// Default: 256 MiB.
  TORCH_ARG(int64_t, cold_write_max_bytes) = int64_t{256} << 20;
};

/// The model state of a training step of `stages` (planner::ModelState):
/// parameter_bytes, the distinct parameter and buffer storages of the
/// stages' modules (a module shared by stages counted once);
/// gradient_bytes, the bytes of the parameters that require grad (their
/// gradients' size, allocated or not); optimizer_bytes,
/// `optimizer_state_ratio` times gradient_bytes, rounded down. Stages
/// without a module hold none.
///
/// Throws c10::Error if optimizer_state_ratio is negative, above 64 or not
/// finite.
planner::ModelState model_state_of(
    const std::vector<Stage>& stages, double optimizer_state_ratio = 2);

/// Measures the cost of every child of `model` on `sample` (the chain input
/// x_0, whose bytes become input_bytes) and returns the chain the planner
/// solves. The stage-0 backward computes an input gradient only if `sample`
/// requires grad, as the runtime does.
///
/// The chain's model_state() is model_state_of(the children,
/// options.optimizer_state_ratio()). On a CPU its cold_write_ms_per_mib()
/// is measured for a working set of the input plus every stage's
/// saved_bytes (up to options.cold_write_max_bytes() of buffers, allocated
/// for a few milliseconds at the end); on other devices it is 0
/// (docs/planner.md, "Time").
///
/// REQUIRES: every child takes one Tensor and returns one Tensor.
/// Throws c10::Error if `model` is empty or null, `sample` is undefined,
/// warmup < 0, repeats < 1 or cold_write_max_bytes < 0, or as
/// model_state_of().
///
/// Example:
// clang-format off
///   auto chain = remat::profile_chain(model, torch::randn({64, 512}));
///   auto plan = remat::planner::solve_optimal(chain, 256LL << 20);
// clang-format on
planner::Chain profile_chain(
    torch::nn::Sequential model,
    const torch::Tensor& sample,
    const ProfileOptions& options = {});

/// The same for any chain of stages (remat/stage.h): stage i's cost measured
/// on x_i, the sample run through stages 0..i-1. Restores the buffers and
/// parameter gradients of the stages' modules, and the RNG state.
///
/// Throws c10::Error if `stages` is empty, a stage has no forward, `sample`
/// is undefined, warmup < 0, repeats < 1 or cold_write_max_bytes < 0, or as
/// model_state_of().
planner::Chain profile_chain(
    const std::vector<Stage>& stages,
    const torch::Tensor& sample,
    const ProfileOptions& options = {});

}  // namespace remat
