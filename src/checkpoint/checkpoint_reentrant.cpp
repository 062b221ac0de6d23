// checkpoint_reentrant.cpp: the reentrant checkpoint, a custom autograd
// function.
//
// Forward runs the region with grad mode off and keeps only its inputs (as
// saved variables, so an enclosing non-reentrant checkpoint packs them).
// Backward re-runs the region with grad mode on from detached copies of the
// inputs, under the forward's RNG and autocast state, then runs a nested
// ("reentrant") backward through the recomputed graph: input gradients are
// read off the detached inputs, and parameters captured by the region receive
// theirs by accumulation, as in a plain backward.
//
// Limits (documented in checkpoint.h): gradients flow only if some input
// requires grad; torch::autograd::grad / backward(inputs=...) are refused,
// because the nested backward would accumulate into .grad of parameters
// instead of returning them; no early stop; the recomputation check compares
// outputs rather than saved tensors.
#include <algorithm>

#include <ATen/core/ivalue.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>

#include "checkpoint_impl.h"
#include "recompute_check.h"
#include "recompute_context.h"
#include "selective/selective.h"

namespace remat::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// Everything backward needs besides the inputs; carried in the autograd
/// context as a capsule.
struct ReentrantState : torch::CustomClassHolder {
  ReentrantState(
      remat::Function fn, CheckpointOptions options, RecomputeContext replay)
      : fn(std::move(fn)),
        options(std::move(options)),
        replay(std::move(replay)) {}
  remat::Function fn;
  CheckpointOptions options;
  RecomputeContext replay;
  std::vector<TensorRecord> outputs;
  // The first input the forward of the region modified in place, or -1.
  int64_t modified_input = -1;
};

constexpr const char* kStateKey = "remat_state";

/// Replaces each output that is not an input by an alias (detach(): the same
/// storage and version counter). The function becomes the grad_fn of what it
/// returns, so a tensor the region did not compute (a parameter, or any
/// tensor it closes over, with or without requires_grad) would otherwise lose
/// its own history: a parameter would lead every later backward into this
/// function, which then waits on itself, and a constant would come to
/// require grad, lead later backwards into this function and keep its graph
/// alive. The region runs without grad, so requires_grad does not tell the
/// two apart; an alias of a tensor the region computed costs nothing.
void alias_outputs_made_outside(variable_list& outputs, at::TensorList inputs) {
  for (torch::Tensor& output : outputs) {
    const bool is_input =
        std::any_of(inputs.begin(), inputs.end(), [&](const at::Tensor& in) {
          return in.unsafeGetTensorImpl() == output.unsafeGetTensorImpl();
        });
    if (!is_input) {
      output = output.detach();
    }
  }
}

struct ReentrantCheckpoint
    : public torch::autograd::Function<ReentrantCheckpoint> {
  static variable_list forward(
      AutogradContext* ctx,
      c10::intrusive_ptr<ReentrantState> state,
      at::TensorList inputs) {
    ctx->save_for_backward(inputs.vec());
    // An enclosing selective region does not see inside this one.
    SelectiveScope suspend_selective(nullptr, nullptr);
    // Casts made here, without grad, must not be reused by the recomputation.
    UncachedAutocast uncached;
    std::vector<int64_t> versions;
    versions.reserve(inputs.size());
    for (const auto& input : inputs) {
      versions.push_back(version_of(input));
    }
    variable_list outputs = state->fn(inputs.vec());
    // An input the region writes in place would be written again by the
    // recomputation, which would also start from the written value: refused
    // in backward, as the non-reentrant mode refuses it there.
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (state->modified_input < 0 && version_of(inputs[i]) != versions[i]) {
        state->modified_input = static_cast<int64_t>(i);
      }
    }
    check_outputs(outputs);
    alias_outputs_made_outside(outputs, inputs);
    variable_list non_differentiable;
    for (const auto& output : outputs) {
      state->outputs.emplace_back(output, state->options.determinism_check());
      if (!output.is_floating_point() && !output.is_complex()) {
        non_differentiable.push_back(output);
      }
    }
    ctx->mark_non_differentiable(non_differentiable);
    ctx->saved_data[kStateKey] = c10::IValue::make_capsule(state);
    return outputs;
  }

  static variable_list backward(
      AutogradContext* ctx, variable_list grad_outputs) {
    TORCH_CHECK(
        torch::autograd::Engine::get_default_engine().is_checkpoint_valid(),
        "remat::checkpoint: Mode::kReentrant does not support "
        "torch::autograd::grad or backward with explicit inputs; use "
        "Mode::kNonReentrant (the default)");
    // A backward with create_graph runs under grad mode; the region's inner
    // backward would build no graph of its gradients (their own gradients
    // would be missing, silently).
    TORCH_CHECK(
        !c10::GradMode::is_enabled(),
        "remat::checkpoint: Mode::kReentrant does not support "
        "backward(create_graph=true); use Mode::kNonReentrant (the default)");
    auto state = c10::static_intrusive_pointer_cast<ReentrantState>(
        ctx->saved_data.at(kStateKey).toCapsule());
    TORCH_CHECK(
        state->modified_input < 0,
        "remat::checkpoint: the checkpointed function modified its input #",
        state->modified_input,
        " in place in the forward; Mode::kReentrant would modify it again when "
        "recomputing, from the modified value, and give other gradients than "
        "a plain run. Modify a copy (clone()) instead");
    // Unpacking checks that no input was modified in place since forward.
    variable_list inputs = detach_inputs(ctx->get_saved_variables());

    variable_list outputs;
    {
      state->replay.check_parameters(
          "remat::checkpoint", "a module of the region");
      RecomputeGuard guard(state->replay, state->options.preserve_buffers_of());
      SelectiveScope suspend_selective(nullptr, nullptr);
      outputs = state->fn(inputs);
    }
    check_recomputed_outputs(
        outputs, state->outputs, state->options.determinism_check());
    variable_list roots;
    variable_list root_grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outputs[i]);
        root_grads.push_back(grad_outputs[i]);
      }
    }
    if (!roots.empty()) {
      torch::autograd::backward(roots, root_grads);
    }

    variable_list grads;
    grads.reserve(inputs.size() + 1);
    grads.emplace_back();  // the state argument
    for (const auto& input : inputs) {
      grads.push_back(
          input.defined() && input.requires_grad() ? input.grad()
                                                   : at::Tensor());
    }
    return grads;
  }
};

}  // namespace

variable_list checkpoint_reentrant(
    const Function& fn,
    const variable_list& inputs,
    const CheckpointOptions& options) {
  bool any_requires_grad = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TORCH_CHECK(
        inputs[i].defined(),
        "remat::checkpoint: Mode::kReentrant expected defined inputs, got an "
        "undefined tensor as input ",
        i,
        "; leave it out of the inputs, or use Mode::kNonReentrant");
    any_requires_grad |= inputs[i].requires_grad();
  }
  if (!any_requires_grad) {
    TORCH_WARN_ONCE(
        "remat::checkpoint: Mode::kReentrant with no input requiring grad: "
        "no gradient will flow into the region (parameters it uses get "
        "none). Use Mode::kNonReentrant, or make an input require grad");
  }
  auto state = c10::make_intrusive<ReentrantState>(
      fn,
      options,
      RecomputeContext(
          inputs, options.preserve_rng_state(), options.preserve_buffers_of()));
  return ReentrantCheckpoint::apply(state, at::TensorList(inputs));
}

}  // namespace remat::detail
