// checkpoint.cpp: remat::checkpoint's entry points and the non-reentrant
// mechanism.
//
// Non-reentrant checkpoint, in brief. A `Frame` is the state of one
// checkpointed call. In forward, the region's inputs are saved as autograd
// `SavedVariable`s (so an enclosing checkpoint's hooks pack them too, which is
// what makes nesting free memory), then `fn` runs under hooks whose pack step
// records only metadata and hands each saved tensor a `Slot`. In backward, the
// first unpack of an empty slot re-runs `fn` on the unpacked inputs under
// recording hooks that fill every live, empty slot in save order, stopping
// early once the last one is filled (NOTE: [Early stop]). Each unpack moves the
// tensor out of its slot, so a recomputed tensor lives only until its node's
// backward has used it; backward with retain_graph recomputes again.
//
// Lifetime: saved-variable hooks own their slot and a reference to the frame;
// the frame owns the inputs and the function. When autograd releases the
// region's nodes, the frame and the inputs go with them.
//
// NOTE: [Early stop]
// Recomputation aborts by throwing `StopRecompute` out of the recording pack
// hook once the highest-numbered slot still needed is filled; the exception
// unwinds through `fn` and is caught here. A function that swallows all
// exceptions (catch (...)) defeats it; set early_stop(false) for such code.
//
// NOTE: [Gradients inside a region]
// `fn` may call torch::autograd::grad itself (a gradient penalty, a
// derivative the model uses). In the forward, that backward unpacks tensors
// the region saved moments ago: their slots are empty, so the region is
// recomputed then, from its inputs, up to the last slot still needed (with
// early stop; without it, to the end, and the tensors the forward has not
// saved yet are not needed and not compared). In a recomputation, the inner
// backward runs through the recomputation's own graph, whose saved tensors
// the recording hooks keep as they are. PyTorch's non-reentrant checkpoint
// does the same; the reentrant mode runs `fn` without grad mode and cannot.
// With a policy it is refused: the forward's operator log, which the
// recomputation is checked against, is still being written.
#include "remat/checkpoint.h"

#include <mutex>

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/saved_variable.h>

#include "checkpoint_impl.h"
#include "compat/compat.h"
#include "hook_stack.h"
#include "recompute_check.h"
#include "recompute_context.h"
#include "remat/saved_tensor_hooks.h"
#include "selective/selective.h"

namespace remat {
namespace detail {
namespace {

using torch::autograd::SavedVariable;
using torch::autograd::SavedVariableHooks;
using torch::autograd::variable_list;

/// Where the recomputation of one saved tensor is put for its unpack hook.
struct Slot {
  at::Tensor recomputed;
};

/// One saved tensor of the forward pass.
struct SavedEntry {
  TensorRecord record;
  std::weak_ptr<Slot> slot;  // expired once autograd released the tensor
};

struct StopRecompute {};

class Frame final : public PackSink {
 public:
  Frame(Function fn, CheckpointOptions options, RecomputeContext replay)
      : fn_(std::move(fn)),
        options_(std::move(options)),
        replay_(std::move(replay)) {
    if (options_.policy()) {
      selective_ = std::make_unique<SelectiveRegion>(options_.policy());
    }
  }

  /// Saves the region's inputs under the hooks ambient at the call (an
  /// enclosing checkpoint's, for nested regions).
  void save_inputs(const variable_list& inputs) {
    input_savers_.reserve(inputs.size());
    for (const auto& input : inputs) {
      if (input.defined() && input.is_leaf() && input.requires_grad()) {
        // A saved leaf must find its gradient accumulator alive at unpack;
        // inside the graph the consuming node's edge keeps it, here we do.
        input_accumulators_.push_back(
            torch::autograd::impl::grad_accumulator(input));
      }
      input_savers_.emplace_back(input, /*is_output=*/false);
    }
  }

  variable_list run_forward(const variable_list& inputs);

  /// Forward pack: remembers what was saved, not the tensor itself.
  void record(const at::Tensor& tensor, const std::shared_ptr<Slot>& slot) {
    // Bookkeeping, not the region's work (only a region with a policy
    // intercepts operators).
    const SelectiveBypass bypass(selective_ != nullptr);
    entries_.push_back(
        {TensorRecord(tensor, options_.determinism_check()), slot});
    if (selective_) {
      selective_->on_pack(tensor);
    }
  }

  /// Unpack: the recomputed tensor of `slot`, recomputing if needed.
  at::Tensor take(Slot& slot) {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(
        forward_done_ || selective_ == nullptr,
        "remat::checkpoint: a region with a policy cannot run a backward "
        "through its own operators during its forward (torch::autograd::grad "
        "inside the checkpointed function); checkpoint it without a policy");
    if (!slot.recomputed.defined()) {
      recompute();
    }
    // With DeterminismCheck::kNone nothing compared the recomputation with
    // the forward: one that saved fewer tensors ends here.
    TORCH_CHECK(
        slot.recomputed.defined(),
        "remat::checkpoint: the recomputation saved fewer tensors than the "
        "forward did, so backward lacks one: the checkpointed function is "
        "not deterministic (run it with DeterminismCheck::kMetadata to see "
        "where it differs)");
    return std::exchange(slot.recomputed, at::Tensor());
  }

  /// fill(), then the tensor as a recording hook keeps it: detached, since
  /// an output saved by its own node must not hold that node.
  at::Tensor fill_and_keep(const at::Tensor& tensor) {
    fill(tensor);
    const SelectiveBypass bypass(selective_ != nullptr);
    return tensor.detach();
  }

  /// Recording pack during recomputation: the `index`-th saved tensor.
  void fill(const at::Tensor& tensor) override {
    // Bookkeeping, not the region's work (only a region with a policy
    // intercepts operators).
    const SelectiveBypass bypass(selective_ != nullptr);
    const int64_t index = recompute_count_++;
    if (!forward_done_ && index >= static_cast<int64_t>(entries_.size())) {
      // NOTE: [Gradients inside a region]: past what the forward has saved
      // so far, nothing is needed.
      return;
    }
    TORCH_CHECK(
        index < static_cast<int64_t>(entries_.size()),
        "remat::checkpoint: recomputation saved more tensors than the forward "
        "pass (",
        entries_.size(),
        "): the checkpointed function must do the same work on both runs");
    const auto& entry = entries_[index];
    entry.record.check(
        tensor, options_.determinism_check(), "saved tensor", index);
    if (auto slot = entry.slot.lock(); slot && !slot->recomputed.defined()) {
      slot->recomputed = tensor.detach();
    }
    if (options_.early_stop() && index == last_needed_) {
      throw StopRecompute{};
    }
  }

 private:
  void recompute();

  Function fn_;
  CheckpointOptions options_;
  RecomputeContext replay_;
  std::vector<SavedVariable> input_savers_;
  std::vector<compat::NodePtr> input_accumulators_;
  std::vector<TensorRecord> outputs_;
  std::vector<SavedEntry> entries_;
  bool forward_done_ = false;  // fn has returned from the region's forward
  std::unique_ptr<SelectiveRegion> selective_;  // with a policy only
  // State of the recomputation in progress (guarded by mutex_).
  std::mutex mutex_;
  int64_t recompute_count_ = 0;
  int64_t last_needed_ = -1;
};

class ForwardHooks final : public SavedVariableHooks {
 public:
  explicit ForwardHooks(std::shared_ptr<Frame> frame)
      : frame_(std::move(frame)), slot_(std::make_shared<Slot>()) {}
  void call_pack_hook(const at::Tensor& tensor) override {
    frame_->record(tensor, slot_);
  }
  at::Tensor call_unpack_hook() override {
    return frame_->take(*slot_);
  }

 private:
  std::shared_ptr<Frame> frame_;
  std::shared_ptr<Slot> slot_;
};

// The hooks of a recomputation: each saved tensor fills its slot and is kept
// as it is, for a backward through the recomputation's own graph (a
// torch::autograd::grad that `fn` itself calls; NOTE: [Gradients inside a
// region]). The recomputation's graph dies with its outputs.
class RecordingHooks final : public SavedVariableHooks {
 public:
  explicit RecordingHooks(Frame* frame) : frame_(frame) {}
  void call_pack_hook(const at::Tensor& tensor) override {
    kept_ = frame_->fill_and_keep(tensor);
  }
  at::Tensor call_unpack_hook() override {
    return kept_;
  }

 private:
  Frame* frame_;  // valid while packing: during recompute() only
  at::Tensor kept_;
};

template <typename Hooks, typename FramePtr>
class FrameHookFactory final : public HookFactory {
 public:
  explicit FrameHookFactory(FramePtr frame) : frame_(std::move(frame)) {}
  std::unique_ptr<SavedVariableHooks> make_hooks() override {
    return std::make_unique<Hooks>(frame_);
  }

 private:
  FramePtr frame_;
};

variable_list Frame::run_forward(const variable_list& inputs) {
  variable_list outputs;
  {
    // Without a policy the scope still suspends an enclosing region's.
    SelectiveScope selective(selective_.get(), /*sink=*/nullptr);
    outputs = fn_(inputs);
  }
  forward_done_ = true;
  check_outputs(outputs);
  for (const auto& output : outputs) {
    outputs_.emplace_back(output, options_.determinism_check());
  }
  return outputs;
}

void Frame::recompute() {
  // The highest-numbered slot that backward can still ask for.
  last_needed_ = -1;
  for (int64_t i = static_cast<int64_t>(entries_.size()) - 1; i >= 0; --i) {
    auto slot = entries_[i].slot.lock();
    if (slot && !slot->recomputed.defined()) {
      last_needed_ = i;
      break;
    }
  }
  if (last_needed_ < 0) {
    return;
  }
  recompute_count_ = 0;

  variable_list inputs;
  inputs.reserve(input_savers_.size());
  for (const auto& saver : input_savers_) {
    inputs.push_back(saver.unpack());
  }
  inputs = detach_inputs(inputs);

  replay_.check_parameters("remat::checkpoint", "a module of the region");
  RecomputeGuard replay_guard(replay_, options_.preserve_buffers_of());
  HookStackGuard hooks(
      std::make_shared<FrameHookFactory<RecordingHooks, Frame*>>(this));
  // Kept outputs serve this recomputation only (NOTE: [Selective
  // checkpointing] in selective.h).
  struct ReleaseKept {
    SelectiveRegion* region;
    ~ReleaseKept() {
      if (region != nullptr) {
        region->release();
      }
    }
  } release_kept{selective_.get()};
  try {
    variable_list outputs;
    {
      SelectiveScope selective(selective_.get(), this);
      outputs = fn_(inputs);
    }
    if (!forward_done_) {
      return;  // NOTE: [Gradients inside a region]: nothing to compare yet
    }
    check_recomputed_outputs(outputs, outputs_, options_.determinism_check());
    TORCH_CHECK(
        options_.determinism_check() == DeterminismCheck::kNone ||
            recompute_count_ == static_cast<int64_t>(entries_.size()),
        "remat::checkpoint: recomputation saved ",
        recompute_count_,
        " tensors but the forward pass saved ",
        entries_.size(),
        ": the checkpointed function must do the same work on both runs");
  } catch (const StopRecompute&) {
    // NOTE: [Early stop]: every needed slot is filled.
  }
}

}  // namespace

variable_list checkpoint_nonreentrant(
    const Function& fn,
    const variable_list& inputs,
    const CheckpointOptions& options) {
  install_engine();
  auto frame = std::make_shared<Frame>(
      fn,
      options,
      RecomputeContext(
          inputs, options.preserve_rng_state(), options.preserve_buffers_of()));
  frame->save_inputs(inputs);
  HookStackGuard hooks(
      std::make_shared<FrameHookFactory<ForwardHooks, std::shared_ptr<Frame>>>(
          frame));
  return frame->run_forward(inputs);
}

}  // namespace detail

namespace {

void check_options(const CheckpointOptions& options) {
  TORCH_CHECK(
      !options.policy() || options.mode() == Mode::kNonReentrant,
      "remat::checkpoint: a policy (selective checkpointing) needs "
      "Mode::kNonReentrant, got Mode::kReentrant");
  for (size_t i = 0; i < options.preserve_buffers_of().size(); ++i) {
    TORCH_CHECK(
        options.preserve_buffers_of()[i] != nullptr,
        "remat::checkpoint: expected modules in preserve_buffers_of, got a "
        "null module at position ",
        i);
  }
}

}  // namespace

torch::autograd::variable_list checkpoint(
    const detail::FunctionArg& fn_arg,
    const torch::autograd::variable_list& inputs,
    const CheckpointOptions& options) {
  const Function& fn = fn_arg;
  TORCH_CHECK(fn, "remat::checkpoint: expected a function, got an empty one");
  check_options(options);
  if (!c10::GradMode::is_enabled()) {
    // Nothing is saved without grad mode: run plainly.
    auto outputs = fn(inputs);
    detail::check_outputs(outputs);
    return outputs;
  }
  switch (options.mode()) {
    case Mode::kNonReentrant:
      return detail::checkpoint_nonreentrant(fn, inputs, options);
    case Mode::kReentrant:
      return detail::checkpoint_reentrant(fn, inputs, options);
  }
  TORCH_CHECK(
      false,
      "remat::checkpoint: unknown mode ",
      static_cast<int>(options.mode()));
}

torch::Tensor checkpoint(
    const std::function<torch::Tensor(const torch::Tensor&)>& fn,
    const torch::Tensor& input,
    const CheckpointOptions& options) {
  TORCH_CHECK(fn, "remat::checkpoint: expected a function, got an empty one");
  auto outputs = checkpoint(
      [fn](const torch::autograd::variable_list& in) {
        return torch::autograd::variable_list{fn(in[0])};
      },
      {input},
      options);
  return outputs[0];
}

torch::Tensor checkpoint_sequential(
    torch::nn::Sequential sequential,
    int64_t segments,
    const torch::Tensor& input,
    const CheckpointOptions& options) {
  TORCH_CHECK(
      sequential.ptr() != nullptr && !sequential->is_empty(),
      "remat::checkpoint_sequential: expected a non-empty Sequential, got an "
      "empty one");
  const auto size = static_cast<int64_t>(sequential->size());
  TORCH_CHECK(
      segments >= 1 && segments <= size,
      "remat::checkpoint_sequential: expected 1 <= segments <= ",
      size,
      " (the Sequential's size), got segments = ",
      segments);
  const int64_t segment_size = size / segments;
  // Runs children [first, last) of the Sequential.
  auto run_children = [impl = sequential.ptr()](
                          int64_t first, int64_t last, torch::Tensor x) {
    for (auto it = impl->begin() + first; it != impl->begin() + last; ++it) {
      x = it->forward(x);
    }
    return x;
  };
  torch::Tensor x = input;
  const int64_t checkpointed_end = segment_size * (segments - 1);
  for (int64_t first = 0; first < checkpointed_end; first += segment_size) {
    const int64_t last = first + segment_size;
    CheckpointOptions segment_options = options;
    for (int64_t i = first; i < last; ++i) {
      segment_options.preserve_buffers_of().push_back(sequential->ptr(i));
    }
    x = checkpoint(
        [run_children, first, last](const torch::Tensor& segment_input) {
          return run_children(first, last, segment_input);
        },
        x,
        segment_options);
  }
  // The last segment runs plainly: its activations are needed first anyway.
  return run_children(checkpointed_end, size, x);
}

}  // namespace remat
