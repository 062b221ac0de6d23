// gradient_sync.cpp: GradientSync, data-parallel gradient averaging in
// buckets overlapped with backward (remat/distributed/gradient_sync.h).
//
// NOTE: [Gradient buckets]
// GradientSync lays the parameters that require grad out in buckets, walking
// them from the last to the first (backward produces the gradients of the
// last layers first), a bucket holding parameters of one dtype up to about
// bucket_bytes. Each bucket owns one flat buffer; each parameter has a slot
// (its offset in its bucket's buffer) and a ready flag for the current step.
// A hook registered with Tensor::register_hook on the parameter (a leaf)
// receives its gradient when autograd's accumulation node for it runs, which
// happens once per backward that computes that gradient: in the plain graph,
// inside a non-reentrant checkpoint's recomputed graph, inside a reentrant
// checkpoint's inner backward, or inside a planned stage's backward. The hook
// copies the gradient into the slot, marks it ready and returns zeros, so
// that autograd leaves param.grad() as it was (it exists on every LibTorch
// from 1.13 on; post-accumulation hooks do not exist before 2.1).
// A bucket is complete when all its slots are ready. Buckets start their
// allreduce strictly in bucket order: a complete bucket whose predecessors
// have not started waits for them. Gloo matches collectives by the order in
// which each rank issues them, so this keeps every rank issuing the same
// sequence even when the ranks' backwards complete buckets in different
// orders. finish() starts what is left (missing gradients as zeros), waits,
// divides the sums by the world size and adds them to param.grad().
// A second gradient for a ready slot within one step is refused: it means
// the parameter is reached by several backwards (or several reentrant
// regions), and its bucket may already be on the wire.
//
#include "remat/distributed/gradient_sync.h"

#include <exception>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

namespace remat::distributed {

struct GradientSync::State {
  /// One parameter's place (NOTE: [Gradient buckets]).
  struct Slot {
    int64_t bucket = 0;
    int64_t offset = 0;  ///< elements into the bucket's buffer
    bool ready = false;  ///< its gradient of this step is in the buffer
  };
  struct Bucket {
    std::vector<int64_t> members;  ///< parameter indices, in layout order
    torch::Tensor buffer;
    int64_t pending = 0;  ///< members not ready yet
    Work work;
  };

  State(ProcessGroup group_in, std::vector<torch::Tensor> parameters_in)
      : group(std::move(group_in)), parameters(std::move(parameters_in)) {}

  ProcessGroup group;
  std::vector<torch::Tensor> parameters;  ///< those that require grad
  /// Each parameter's index in the list given to the constructor.
  std::vector<int64_t> given_index;
  /// The given parameters that did not require grad, with their indices.
  std::vector<std::pair<torch::Tensor, int64_t>> frozen;
  std::vector<unsigned> hooks;
  std::vector<Slot> slots;
  std::vector<Bucket> buckets;
  int64_t next_to_start = 0;
  int64_t started_in_backward = 0;
  int64_t last_started_in_backward = 0;
  std::mutex mutex;

  /// Throws c10::Error, naming the parameter, if one was frozen or unfrozen
  /// since construction: an unfrozen one's gradient would stay this rank's
  /// own, and a frozen one would get the others' average (and be stepped).
  void check_frozen_unchanged() const {
    for (size_t k = 0; k < parameters.size(); ++k) {
      TORCH_CHECK(
          parameters[k].requires_grad(),
          "remat::distributed::GradientSync: parameter ",
          given_index[k],
          " (",
          parameters[k].sizes(),
          ") no longer requires grad; which parameters are averaged is "
          "fixed when GradientSync is constructed (make a new one)");
    }
    for (const auto& [parameter, index] : frozen) {
      TORCH_CHECK(
          !parameter.requires_grad(),
          "remat::distributed::GradientSync: parameter ",
          index,
          " (",
          parameter.sizes(),
          ") requires grad now but did not when GradientSync was "
          "constructed; its gradient would not be averaged over the ranks "
          "(make a new GradientSync)");
    }
  }

  torch::Tensor slot_view(int64_t index) {
    const Slot& slot = slots[index];
    const torch::Tensor& parameter = parameters[index];
    return buckets[slot.bucket]
        .buffer.narrow(0, slot.offset, parameter.numel())
        .view(parameter.sizes());
  }

  void start(int64_t bucket_index, bool in_backward) {
    Bucket& bucket = buckets[bucket_index];
    bucket.work = group.allreduce_sum(bucket.buffer);
    started_in_backward += in_backward ? 1 : 0;
  }

  /// Starts, in bucket order, every complete bucket whose predecessors have
  /// all started.
  void start_complete_buckets(bool in_backward) {
    while (next_to_start < static_cast<int64_t>(buckets.size()) &&
           buckets[next_to_start].pending == 0) {
      start(next_to_start++, in_backward);
    }
  }

  torch::Tensor on_gradient(int64_t index, const torch::Tensor& grad) {
    std::lock_guard<std::mutex> lock(mutex);
    Slot& slot = slots[index];
    TORCH_CHECK(
        !slot.ready,
        "remat::distributed::GradientSync: parameter ",
        index,
        " (",
        parameters[index].sizes(),
        ") received a second gradient in one step; expected one per "
        "parameter between finish() calls (is it used by several reentrant "
        "checkpoint regions, or was backward() called twice?)");
    TORCH_CHECK(
        !grad.is_sparse(),
        "remat::distributed::GradientSync: expected dense gradients, got a "
        "sparse one for parameter ",
        index);
    {
      torch::NoGradGuard no_grad;
      slot_view(index).copy_(grad);
    }
    slot.ready = true;
    if (--buckets[slot.bucket].pending == 0) {
      start_complete_buckets(/*in_backward=*/true);
    }
    // Autograd adds these zeros to param.grad(), which stays as it was: one
    // zero, broadcast, so that nothing of the gradient's size is allocated
    // when param.grad() exists (AccumulateGrad adds in place).
    return torch::zeros({}, grad.options()).expand(grad.sizes());
  }

  void reset_step() {
    for (Slot& slot : slots) {
      slot.ready = false;
    }
    for (Bucket& bucket : buckets) {
      bucket.pending = static_cast<int64_t>(bucket.members.size());
      bucket.work = Work();
    }
    next_to_start = 0;
    last_started_in_backward = started_in_backward;
    started_in_backward = 0;
  }
};

namespace {

/// The parameters' count, shapes, dtypes and which of them are frozen, for
/// comparing ranks: ranks that freeze different parameters of the same
/// shapes would otherwise average one rank's gradient of a parameter with
/// another rank's gradient of a different one.
std::string layout_of(const std::vector<torch::Tensor>& parameters) {
  std::ostringstream text;
  text << parameters.size() << " parameters:";
  for (const torch::Tensor& parameter : parameters) {
    text << ' ' << parameter.scalar_type() << parameter.sizes()
         << (parameter.requires_grad() ? "" : " (frozen)");
  }
  return text.str();
}

}  // namespace

GradientSync::GradientSync(
    std::vector<torch::Tensor> parameters,
    ProcessGroup group,
    GradientSyncOptions options) {
  TORCH_CHECK(
      options.bucket_bytes() > 0,
      "remat::distributed::GradientSync: expected a positive bucket size, "
      "got ",
      options.bucket_bytes(),
      " bytes");
  std::vector<torch::Tensor> trained;
  std::vector<int64_t> given_index;
  std::vector<std::pair<torch::Tensor, int64_t>> frozen;
  for (size_t index = 0; index < parameters.size(); ++index) {
    const torch::Tensor& parameter = parameters[index];
    TORCH_CHECK(
        parameter.defined() && parameter.device().is_cpu() &&
            parameter.layout() == torch::kStrided,
        "remat::distributed::GradientSync: expected dense CPU parameters, "
        "got ",
        parameter.defined() ? parameter.toString() : std::string("undefined"),
        " at index ",
        index);
    if (parameter.requires_grad()) {
      trained.push_back(parameter);
      given_index.push_back(static_cast<int64_t>(index));
    } else {
      frozen.emplace_back(parameter, static_cast<int64_t>(index));
    }
  }
  if (group.world_size() > 1) {
    // Ranks with different parameters would issue allreduces of different
    // sizes: Gloo aborts the process, or a rank "succeeds" with a partial
    // sum. One exchange through the store tells every rank instead.
    group.check_same(
        "the parameters given to GradientSync (count, shapes, dtypes, which "
        "are frozen)",
        layout_of(parameters));
  }
  state_ = std::make_unique<State>(std::move(group), std::move(trained));
  state_->given_index = std::move(given_index);
  state_->frozen = std::move(frozen);
  State& state = *state_;
  const auto count = static_cast<int64_t>(state.parameters.size());
  state.slots.resize(static_cast<size_t>(count));

  // Layout: from the last parameter to the first.
  std::vector<int64_t> bucket_elements;
  int64_t bucket_bytes = 0;
  for (int64_t index = count - 1; index >= 0; --index) {
    const torch::Tensor& parameter = state.parameters[index];
    const int64_t bytes = static_cast<int64_t>(parameter.nbytes());
    const bool fits =
        !state.buckets.empty() &&
        state.parameters[state.buckets.back().members.front()].scalar_type() ==
            parameter.scalar_type() &&
        bucket_bytes + bytes <= options.bucket_bytes();
    if (!fits) {
      state.buckets.emplace_back();
      bucket_elements.push_back(0);
      bucket_bytes = 0;
    }
    State::Slot& slot = state.slots[index];
    slot.bucket = static_cast<int64_t>(state.buckets.size()) - 1;
    slot.offset = bucket_elements.back();
    state.buckets.back().members.push_back(index);
    bucket_elements.back() += parameter.numel();
    bucket_bytes += bytes;
  }
  for (size_t bucket = 0; bucket < state.buckets.size(); ++bucket) {
    const torch::Tensor& first =
        state.parameters[state.buckets[bucket].members.front()];
    // Gloo (LibTorch 1.13) cannot sum bfloat16: such buckets are summed in
    // fp32, and the averages rounded to bfloat16 when added to the grads.
    const auto wire = first.scalar_type() == torch::kBFloat16
                          ? torch::kFloat
                          : first.scalar_type();
    state.buckets[bucket].buffer =
        torch::empty({bucket_elements[bucket]}, first.options().dtype(wire));
  }
  state.reset_step();
  state.last_started_in_backward = 0;

  State* raw = state_.get();
  for (int64_t index = 0; index < count; ++index) {
    state.hooks.push_back(state.parameters[index].register_hook(
        [raw, index](torch::Tensor grad) -> torch::Tensor {
          return raw->on_gradient(index, grad);
        }));
  }
}

GradientSync::~GradientSync() {
  for (size_t index = 0; index < state_->parameters.size(); ++index) {
    state_->parameters[index].remove_hook(state_->hooks[index]);
  }
}

void GradientSync::finish() {
  State& state = *state_;
  std::lock_guard<std::mutex> lock(state.mutex);
  // However finish() ends, the next backward starts a fresh step.
  struct ResetAtExit {
    State& state;
    ~ResetAtExit() {
      state.reset_step();
    }
  } reset_at_exit{state};

  for (int64_t bucket = state.next_to_start;
       bucket < static_cast<int64_t>(state.buckets.size());
       ++bucket) {
    for (int64_t index : state.buckets[bucket].members) {
      if (!state.slots[index].ready) {
        state.slot_view(index).zero_();
      }
    }
    state.buckets[bucket].pending = 0;
  }
  state.start_complete_buckets(/*in_backward=*/false);

  // Wait for every bucket before reporting the first failure, so that none
  // is left writing into a buffer.
  std::exception_ptr failure;
  for (size_t bucket = 0; bucket < state.buckets.size(); ++bucket) {
    try {
      state.buckets[bucket].work.wait();
    } catch (...) {
      if (!failure) {
        failure = std::current_exception();
      }
    }
  }
  if (failure) {
    std::rethrow_exception(failure);
  }
  // Nothing is in flight now: a refusal leaves no collective writing.
  state.check_frozen_unchanged();

  torch::NoGradGuard no_grad;
  const auto world_size = static_cast<double>(state.group.world_size());
  for (State::Bucket& bucket : state.buckets) {
    bucket.buffer.div_(world_size);
  }
  for (size_t index = 0; index < state.parameters.size(); ++index) {
    const torch::Tensor& parameter = state.parameters[index];
    const torch::Tensor average = state.slot_view(static_cast<int64_t>(index));
    if (parameter.grad().defined()) {
      parameter.mutable_grad().add_(average);
    } else {
      parameter.mutable_grad() = average.to(
          parameter.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
    }
  }
}

int64_t GradientSync::bucket_count() const {
  return static_cast<int64_t>(state_->buckets.size());
}

int64_t GradientSync::buckets_started_in_backward() const {
  return state_->last_started_in_backward;
}

}  // namespace remat::distributed
