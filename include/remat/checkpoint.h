// remat/checkpoint.h: activation checkpointing for LibTorch.
//
// `checkpoint(fn, inputs)` runs `fn` so that the tensors autograd would keep
// for backward inside it are not kept; backward recomputes them by running
// `fn` again. Gradients are those of running `fn` plainly (bitwise on CPU for
// deterministic ops), at the cost of one extra forward of the region.
//
// Two modes (see docs/checkpoint.md):
//  - Mode::kNonReentrant (default): saved-tensor hooks through remat's engine.
//    Supports torch::autograd::grad (also called by `fn` itself, as a
//    gradient penalty does, except with a policy), nesting, backward through
//    part of a region, parameters captured by `fn` when no input requires
//    grad, and backward twice with retain_graph. Recomputation stops as soon
//    as every tensor backward still needs exists again (early_stop).
//  - Mode::kReentrant: a custom autograd function that re-runs `fn` and
//    backpropagates through it inside backward. Limits: gradients reach only
//    through inputs that require grad (captured parameters get none if no
//    input requires grad); torch::autograd::grad, backward(inputs=...) and
//    backward(create_graph=true) are refused with an error when the backward
//    reaches the region (a backward(inputs={w}) naming only a parameter `fn`
//    captures never does: w gets no gradient, without an error), and so are
//    undefined inputs; `fn` runs without grad mode in the forward, so it
//    cannot call torch::autograd::grad itself; no early stop. An input that
//    the region reads more than once and that the caller also uses elsewhere
//    gets its gradient summed in another order than a plain run's (the
//    region's own terms first, as PyTorch's reentrant checkpoint does): equal
//    to rounding, not bitwise.
//
// Both replay the RNG state (CPU generator and the CUDA generator of every
// device the inputs live on) and the autocast state, and check the
// recomputation (see DeterminismCheck and docs/checkpoint.md). Only
// LibTorch's default generators are replayed: a torch::Generator of the
// caller's (torch::bernoulli(p, generator)) draws new numbers in the
// recomputation, and so does a region whose random draws interleave with
// another thread's (the default CPU generator is shared by every thread;
// a recomputation also rewinds it for the other threads while it runs).
// Either gives gradients that differ from the plain run's without an error
// under DeterminismCheck::kMetadata (kValues reports it).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/arg.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include "remat/policy.h"

namespace remat {

/// How a checkpointed region is recomputed in backward.
enum class Mode {
  kNonReentrant,  ///< saved-tensor hooks; full feature set (default)
  kReentrant,     ///< custom autograd function; fewer features
};

/// What is compared between the original forward and its recomputation.
enum class DeterminismCheck {
  kNone,      ///< nothing
  kMetadata,  ///< count, shape, dtype, device of every saved tensor
  kValues,    ///< kMetadata plus bitwise values (debug aid: keeps a copy of
              ///< every saved tensor until backward, so saves no memory)
};

/// Options of `checkpoint` and `checkpoint_sequential`.
struct CheckpointOptions {
  /// Recomputation style. Default: Mode::kNonReentrant.
  TORCH_ARG(Mode, mode) = Mode::kNonReentrant;
  /// Replay the CPU and CUDA RNG states of the forward during recomputation,
  /// so dropout recomputes identically. Default: true.
  TORCH_ARG(bool, preserve_rng_state) = true;
  /// Check the recomputation against the forward. Default: kMetadata.
  TORCH_ARG(DeterminismCheck, determinism_check) = DeterminismCheck::kMetadata;
  /// Non-reentrant only: stop recomputing once every tensor backward still
  /// needs has been recomputed. Default: true.
  TORCH_ARG(bool, early_stop) = true;
  /// Modules whose buffers (BatchNorm running statistics, ...) recomputation
  /// must leave untouched: they are saved before each recomputation of the
  /// region and restored after it, so they are updated exactly once per step
  /// as without checkpointing. The recomputation also runs them (and their
  /// submodules) in the training mode they had in the forward, and refuses,
  /// in backward, parameters of theirs modified in place since. The module
  /// forms of `checkpoint` and `checkpoint_sequential` fill this in
  /// themselves. Default: none.
  TORCH_ARG(
      std::vector<std::shared_ptr<torch::nn::Module>>,
      preserve_buffers_of) = {};
  /// Selective checkpointing (remat/policy.h): asked for every operator the
  /// region runs whether to keep its outputs or recompute it. Non-reentrant
  /// mode only. Default: empty (recompute everything).
  TORCH_ARG(Policy, policy) = {};
};

/// A checkpointable region: tensors in, tensors out.
using Function = std::function<torch::autograd::variable_list(
    const torch::autograd::variable_list&)>;

namespace detail {
/// The `fn` of the list form of `checkpoint`: a Function, or anything a
/// Function can be made from, except a module holder (the module form takes
/// those). LibTorch's ModuleHolder::operator() fails to compile, instead of
/// dropping out of overload resolution, when asked whether it accepts a list;
/// testing for a module holder first keeps `checkpoint(my_module, x)`
/// compiling for modules whose forward takes one tensor.
class FunctionArg {
 public:
  template <
      typename F,
      std::enable_if_t<
          !torch::detail::is_module_holder<std::decay_t<F>>::value,
          int> = 0,
      std::enable_if_t<std::is_constructible_v<Function, F&&>, int> = 0>
  FunctionArg(F&& fn) : fn_(std::forward<F>(fn)) {}  // NOLINT: implicit
  operator const Function&() const {                 // NOLINT: implicit
    return fn_;
  }

 private:
  Function fn_;
};
}  // namespace detail

/// Runs `fn(inputs)` without keeping its internal activations; backward
/// recomputes them. Returns fn's outputs, which carry gradients to `inputs`
/// and to every parameter `fn` uses. An output `fn` did not compute (a
/// parameter, a tensor it closes over) is returned, in Mode::kReentrant, as
/// an alias of it (same storage and version counter), so that the tensor
/// itself keeps its own history.
///
/// Example:
// clang-format off
///   auto outs = remat::checkpoint(
///       [&](const torch::autograd::variable_list& in) {
///         return torch::autograd::variable_list{block->forward(in[0])};
///       },
///       {x});
// clang-format on
///
/// REQUIRES: `fn` is deterministic given the RNG state (and autocast state),
/// and everything it captures outside `inputs` is unchanged until backward.
/// Throws c10::Error if `fn` returns no or undefined tensors, if a
/// recomputation differs from the forward (see DeterminismCheck), if an input
/// was modified in place before backward (by `fn` itself too: in backward,
/// as the recomputation would write it again), or (non-reentrant) if another
/// autograd engine is installed; with a policy, also if the mode is
/// kReentrant, or if `fn` calls torch::autograd::grad on what it computed,
/// or in backward if the recomputation runs other operators than
/// the forward, the policy answers differently, or an output it kept was
/// modified in place. Exceptions thrown by `fn` propagate; the hook
/// stack, RNG state, grad mode and module buffers are restored first.
torch::autograd::variable_list checkpoint(
    const detail::FunctionArg& fn,
    const torch::autograd::variable_list& inputs,
    const CheckpointOptions& options = {});

/// Tensor-to-tensor convenience form of `checkpoint`.
///
/// Example:
// clang-format off
///   auto y = remat::checkpoint(
///       [&](const torch::Tensor& x) { return block->forward(x); }, x);
// clang-format on
torch::Tensor checkpoint(
    const std::function<torch::Tensor(const torch::Tensor&)>& fn,
    const torch::Tensor& input,
    const CheckpointOptions& options = {});

/// Module form: checkpoints `module->forward(input)` and preserves the
/// module's buffers across recomputation (BatchNorm running statistics are
/// updated exactly once per step; PyTorch's own checkpoint updates them twice).
/// It recomputes in the training mode (train()/eval()) the module and its
/// submodules had in the forward, whatever it is at backward (the caller's is
/// put back after), and throws c10::Error in backward if one of the module's
/// parameters was modified in place since the forward (the recomputation
/// would read the new values).
///
/// Example:
// clang-format off
///   torch::nn::Sequential block(torch::nn::Conv2d(3, 8, 3), torch::nn::BatchNorm2d(8));
///   auto y = remat::checkpoint(block, x);
// clang-format on
template <typename ModuleType>
torch::Tensor checkpoint(
    const torch::nn::ModuleHolder<ModuleType>& module,
    const torch::Tensor& input,
    CheckpointOptions options = {}) {
  options.preserve_buffers_of().push_back(module.ptr());
  auto impl = module.ptr();
  return checkpoint(
      [impl](const torch::Tensor& x) -> torch::Tensor {
        return impl->forward(x);
      },
      input,
      options);
}

/// Splits `sequential` into `segments` consecutive segments of size
/// size / segments (the last one takes the remainder) and checkpoints every
/// segment but the last, as PyTorch's `checkpoint_sequential` does. Buffers of
/// the modules are preserved across recomputation, and training modes and
/// parameters are treated as by the module form.
///
/// Example:
// clang-format off
///   auto y = remat::checkpoint_sequential(model, 4, x);
// clang-format on
///
/// Throws c10::Error if the Sequential is empty, or segments < 1 or
/// segments > sequential->size().
torch::Tensor checkpoint_sequential(
    torch::nn::Sequential sequential,
    int64_t segments,
    const torch::Tensor& input,
    const CheckpointOptions& options = {});

/// True on this thread while remat re-runs a checkpointed region during
/// backward. User code may use it to skip side effects (logging, counters).
bool is_recomputing();

}  // namespace remat
