// selective.cpp: the dispatcher fallback and operator log of selective
// checkpointing. NOTE: [Selective checkpointing] in selective.h says how it
// works and what it does not support.
#include "selective.h"

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include "compat/compat.h"

namespace remat::detail {
namespace {

/// Where the default CPU generator stands: changes with every number drawn
/// (the Mersenne Twister's position, a word of its state for draws that are
/// a multiple of its period apart, and the cached normal samples). A call
/// whose kernel draws random numbers below autograd (a custom operator with
/// an autograd kernel of its own) is not tagged nondeterministic_seeded and
/// calls nothing the fallback sees; comparing this before and after the call
/// still finds it.
struct CpuRngMark {
  int left = 0;
  uint32_t next = 0;
  uint32_t first_word = 0;
  bool float_sample = false;
  bool double_sample = false;
  bool operator==(const CpuRngMark& other) const {
    return left == other.left && next == other.next &&
           first_word == other.first_word &&
           float_sample == other.float_sample &&
           double_sample == other.double_sample;
  }
};

CpuRngMark cpu_rng_mark() {
  at::Generator generator =
      at::globalContext().defaultGenerator(c10::Device(c10::kCPU));
  std::lock_guard<std::mutex> lock(generator.mutex());
  auto* cpu = generator.get<at::CPUGeneratorImpl>();
  const at::mt19937 engine = cpu->engine();
  const auto data = engine.data();
  return CpuRngMark{
      data.left_,
      data.next_,
      data.state_[0],
      cpu->next_float_normal_sample().has_value(),
      cpu->next_double_normal_sample().has_value()};
}

/// This thread's selective scopes, innermost last.
thread_local std::vector<SelectiveScope*> tls_scopes;

/// True inside a kernel: autograd kernels exclude the autograd keys before
/// they call the kernel below them, so calls made from there are the
/// kernel's own business, not operators of the region.
bool below_autograd() {
  return c10::impl::tls_local_dispatch_key_set().excluded_.has(
      c10::DispatchKey::AutogradFunctionality);
}

void append_tensors(const c10::IValue& value, std::vector<at::Tensor>& out) {
  if (value.isTensor()) {
    out.push_back(value.toTensor());
  } else if (value.isTensorList()) {
    for (const at::Tensor& tensor : value.toTensorVector()) {
      out.push_back(tensor);
    }
  } else if (value.isList()) {
    for (const c10::IValue& element : value.toListRef()) {
      append_tensors(element, out);
    }
  }
}

std::vector<at::Tensor> tensors_of(
    torch::jit::Stack::const_iterator first,
    torch::jit::Stack::const_iterator last) {
  std::vector<at::Tensor> tensors;
  for (auto it = first; it != last; ++it) {
    append_tensors(*it, tensors);
  }
  return tensors;
}

/// A call may be kept only if keeping it cannot change what the region
/// computes: it writes to no argument, returns no alias of one, and returns
/// only tensors or tensor lists, all defined.
bool keepable(
    const c10::FunctionSchema& schema,
    const std::vector<c10::IValue>& returns) {
  for (const c10::Argument& argument : schema.arguments()) {
    if (argument.alias_info() != nullptr && argument.alias_info()->isWrite()) {
      return false;
    }
  }
  for (const c10::Argument& result : schema.returns()) {
    if (result.alias_info() != nullptr) {
      return false;
    }
  }
  for (const c10::IValue& value : returns) {
    if (value.isTensor()) {
      if (!value.toTensor().defined()) {
        return false;
      }
    } else if (value.isTensorList()) {
      for (const at::Tensor& tensor : value.toTensorVector()) {
        if (!tensor.defined()) {
          return false;
        }
      }
    } else {
      return false;
    }
  }
  return !returns.empty();
}

/// Same tensor as far as a saved tensor's value goes: the same storage,
/// offset, sizes, strides and dtype.
bool same_view(const at::Tensor& a, const at::Tensor& b) {
  if (a.unsafeGetTensorImpl() == b.unsafeGetTensorImpl()) {
    return true;
  }
  if (!a.defined() || !b.defined() || !a.has_storage() || !b.has_storage()) {
    return false;
  }
  return a.storage().is_alias_of(b.storage()) &&
         a.storage_offset() == b.storage_offset() && a.sizes() == b.sizes() &&
         a.strides() == b.strides() && a.dtype() == b.dtype() &&
         a.is_conj() == b.is_conj() && a.is_neg() == b.is_neg();
}

/// Asks `policy` about one call and checks that the answer is one of the
/// four CheckpointPolicy values (a cast integer is not); true for a save.
bool policy_saves(
    const Policy& policy, const OpContext& context, int64_t index) {
  const CheckpointPolicy answer = policy(context);
  const auto value = static_cast<int>(answer);
  TORCH_CHECK(
      value >= static_cast<int>(CheckpointPolicy::kMustSave) &&
          value <= static_cast<int>(CheckpointPolicy::kPreferRecompute),
      "remat::checkpoint: the policy answered CheckpointPolicy value ",
      value,
      " for ",
      context.op_name,
      " (operator ",
      index,
      " of the region); expected kMustSave, kPreferSave, kMustRecompute or "
      "kPreferRecompute");
  return is_save(answer);
}

/// `tensor`'s values (the same storage and version counter) without its
/// autograd history, requiring grad as it does. What a region's log holds
/// must not hold the region's graph: the graph's saved tensors hold the
/// frame that owns the log, a cycle that only a recomputation would break.
at::Tensor held_value(const at::Tensor& tensor) {
  if (!tensor.defined()) {
    return tensor;
  }
  at::Tensor value = tensor.tensor_data();
  if (tensor.requires_grad()) {
    value.set_requires_grad(true);
  }
  return value;
}

c10::IValue held_value(const c10::IValue& value) {
  if (value.isTensor()) {
    return held_value(value.toTensor());
  }
  if (value.isTensorList()) {
    c10::List<at::Tensor> list;
    for (const at::Tensor& tensor : value.toTensorVector()) {
      list.push_back(held_value(tensor));
    }
    return list;
  }
  return value;
}

}  // namespace

SelectiveRegion::PackSource SelectiveRegion::trace(
    const at::Tensor& packed, const std::vector<at::Tensor>& inputs) {
  using Kind = PackSource::Kind;
  PackSource source;
  for (size_t j = 0; j < inputs.size(); ++j) {
    if (same_view(packed, inputs[j])) {
      source.kind = Kind::kInput;
      source.index = static_cast<int64_t>(j);
      return source;
    }
  }
  if (packed.defined() && packed.has_storage() &&
      packed.layout() == at::kStrided) {
    for (size_t j = 0; j < inputs.size(); ++j) {
      const at::Tensor& input = inputs[j];
      if (input.defined() && input.has_storage() &&
          input.layout() == at::kStrided && input.dtype() == packed.dtype() &&
          input.device() == packed.device() &&
          input.is_conj() == packed.is_conj() &&
          input.is_neg() == packed.is_neg() &&
          input.storage().is_alias_of(packed.storage())) {
        source.kind = Kind::kInputView;
        source.index = static_cast<int64_t>(j);
        source.sizes = packed.sizes().vec();
        source.strides = packed.strides().vec();
        source.offset_from_input =
            packed.storage_offset() - input.storage_offset();
        source.input_sizes = input.sizes().vec();
        source.input_strides = input.strides().vec();
        source.input_offset = input.storage_offset();
        return source;
      }
    }
  }
  source.kind = Kind::kHeld;
  // Values only: a tensor an operator saves of its own output carries that
  // operator's node, and through its saved tensors the region's frame, which
  // owns this log: holding it would keep the region alive for ever when no
  // recomputation releases it (a graph freed without backward, or a region
  // run inside an enclosing region's recomputation).
  source.held = held_value(packed);
  return source;
}

namespace {

int64_t bytes_of(const std::vector<at::Tensor>& tensors) {
  int64_t bytes = 0;
  for (const at::Tensor& tensor : tensors) {
    bytes += static_cast<int64_t>(tensor.numel()) *
             static_cast<int64_t>(tensor.element_size());
  }
  return bytes;
}

/// A kept output as the recomputation sees it: the forward's values, outside
/// the forward's graph, requiring grad as in the forward so that the
/// recomputed operators after it are recorded as they were. It requires grad
/// through a grad_fn of its own, not as a leaf: a leaf's gradient accumulator
/// would hold the tensor for as long as the recomputed graph after it lives
/// (NOTE: [Selective checkpointing]).
at::Tensor replayed(const at::Tensor& output) {
  at::Tensor tensor = output.detach();
  if (output.requires_grad()) {
    compat::NodePtr node =
        compat::make_node<torch::autograd::Error>(std::string(
            "remat::checkpoint: the graph of a recomputation is not "
            "differentiated (a kept output's placeholder was reached)"));
    const uint32_t input_nr = node->add_input_metadata(tensor);
    torch::autograd::impl::set_gradient_edge(
        tensor, torch::autograd::Edge(std::move(node), input_nr));
  }
  return tensor;
}

c10::IValue replayed(const c10::IValue& value) {
  if (value.isTensor()) {
    return replayed(value.toTensor());
  }
  c10::List<at::Tensor> list;
  for (const at::Tensor& tensor : value.toTensorVector()) {
    list.push_back(replayed(tensor));
  }
  return list;
}

}  // namespace

SelectiveRegion::SelectiveRegion(Policy policy) : policy_(std::move(policy)) {}

void SelectiveRegion::on_pack(const at::Tensor& tensor) {
  // Held only while a call is open: what a kept call packed is traced when
  // the call returns, the rest is dropped then.
  packs_.push_back(open_.empty() ? at::Tensor() : tensor);
}

void SelectiveRegion::release() {
  kept_storages_.clear();
  for (LoggedCall& call : calls_) {
    clear_kept(call);
  }
}

void SelectiveRegion::forward_call(
    const c10::OperatorHandle& op,
    c10::DispatchKeySet below,
    torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const auto argument_count =
      static_cast<std::ptrdiff_t>(schema.arguments().size());
  const std::vector<at::Tensor> inputs =
      tensors_of(stack->end() - argument_count, stack->end());

  for (const c10::Argument& argument : schema.arguments()) {
    if (argument.alias_info() != nullptr && argument.alias_info()->isWrite()) {
      const auto position = &argument - schema.arguments().data();
      std::vector<at::Tensor> written;
      append_tensors(*(stack->end() - argument_count + position), written);
      for (const at::Tensor& tensor : written) {
        forget_kept_storage(tensor);
      }
    }
  }

  const auto index = static_cast<int64_t>(calls_.size());
  calls_.emplace_back();
  calls_.back().name = schema.name();
  calls_.back().first_pack = static_cast<int64_t>(packs_.size());
  // NOTE: [Random calls and other threads] The default CPU generator is
  // shared by every thread: another thread's draws move it too. ATen tags
  // every operator that draws random numbers (nondeterministic_seeded; a
  // composite one nests a tagged call), so the generator is watched only
  // around other operators (a custom operator whose autograd kernel draws),
  // where a draw of another thread may still mark a call random (it is then
  // recomputed, which is only the policy's saving lost).
  const bool watch_rng = schema.name().rfind("aten::", 0) != 0;
  const CpuRngMark rng_before = watch_rng ? cpu_rng_mark() : CpuRngMark{};
  {
    open_.push_back(index);
    struct Close {
      std::vector<int64_t>& open;
      ~Close() {
        open.pop_back();
      }
    } close{open_};
    op.redispatchBoxed(below, stack);
  }

  LoggedCall& call = calls_[index];  // calls_ may have grown meanwhile
  call.end_call = static_cast<int64_t>(calls_.size());
  call.end_pack = static_cast<int64_t>(packs_.size());
  call.random = call.random || op.hasTag(at::Tag::nondeterministic_seeded) ||
                (watch_rng && !(cpu_rng_mark() == rng_before));
  if (call.random && !open_.empty()) {
    calls_[open_.back()].random = true;
  }

  const auto return_count =
      static_cast<std::ptrdiff_t>(schema.returns().size());
  std::vector<c10::IValue> returns(stack->end() - return_count, stack->end());
  if (!call.random && keepable(schema, returns)) {
    std::vector<at::Tensor> outputs =
        tensors_of(returns.cbegin(), returns.cend());
    call.asked = true;
    call.output_bytes = bytes_of(outputs);
    call.policy_saves = policy_saves(
        policy_,
        OpContext{call.name, /*is_recompute=*/false, call.output_bytes},
        index);
    if (call.policy_saves) {
      keep(index, inputs, std::move(returns), std::move(outputs));
    }
  }
  if (open_.empty()) {
    for (int64_t i = call.first_pack; i < call.end_pack; ++i) {
      packs_[i] = at::Tensor();
    }
  }
}

void SelectiveRegion::keep(
    int64_t index,
    const std::vector<at::Tensor>& inputs,
    std::vector<c10::IValue> returns,
    std::vector<at::Tensor> outputs) {
  // Calls nested in a kept call are never reached by the recomputation.
  for (int64_t nested = index + 1; nested < calls_[index].end_call; ++nested) {
    clear_kept(calls_[nested]);
  }
  LoggedCall& call = calls_[index];
  call.kept = true;
  call.sources.clear();
  for (int64_t i = call.first_pack; i < call.end_pack; ++i) {
    call.sources.push_back(trace(packs_[i], inputs));
  }
  call.output_versions.clear();
  for (const at::Tensor& output : outputs) {
    call.output_versions.push_back(output._version());
    if (output.has_storage()) {
      kept_storages_[output.storage().unsafeGetStorageImpl()].push_back(index);
    }
  }
  // Held without their autograd history (held_value): the forward's outputs
  // carry the region's graph, whose saved tensors hold the frame that owns
  // this log.
  call.returns.clear();
  for (const c10::IValue& value : returns) {
    call.returns.push_back(held_value(value));
  }
  call.outputs.clear();
  for (const at::Tensor& output : outputs) {
    call.outputs.push_back(held_value(output));
  }
}

void SelectiveRegion::clear_kept(LoggedCall& call) {
  call.kept = false;
  call.returns.clear();
  call.outputs.clear();
  call.output_versions.clear();
  call.sources.clear();
}

void SelectiveRegion::forget_kept_storage(const at::Tensor& written) {
  if (kept_storages_.empty() || !written.defined() || !written.has_storage()) {
    return;
  }
  const auto found =
      kept_storages_.find(written.storage().unsafeGetStorageImpl());
  if (found == kept_storages_.end()) {
    return;
  }
  for (const int64_t index : found->second) {
    clear_kept(calls_[index]);
  }
  kept_storages_.erase(found);
}

void SelectiveRegion::recompute_call(
    SelectiveScope& scope,
    const c10::OperatorHandle& op,
    c10::DispatchKeySet below,
    torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const int64_t index = scope.cursor_;
  const auto logged_count = static_cast<int64_t>(calls_.size());
  TORCH_CHECK(
      index < logged_count && calls_[index].name == schema.name(),
      "remat::checkpoint: with a policy, the recomputation must run the "
      "operators of the forward in the same order, but operator ",
      index,
      " of the region was ",
      schema.name(),
      " in the recomputation and ",
      index < logged_count ? calls_[index].name : std::string("absent"),
      " in the forward");
  LoggedCall& call = calls_[index];
  if (call.asked) {
    const bool save = policy_saves(
        policy_,
        OpContext{call.name, /*is_recompute=*/true, call.output_bytes},
        index);
    TORCH_CHECK(
        save == call.policy_saves,
        "remat::checkpoint: the policy answered ",
        save ? "save" : "recompute",
        " for ",
        call.name,
        " (operator ",
        index,
        " of the region) in the recomputation but ",
        call.policy_saves ? "save" : "recompute",
        " in the forward: a policy must answer the same on both runs");
  }

  if (call.kept) {
    const SelectiveBypass bypass;  // as_strided, detach: not region calls
    for (size_t j = 0; j < call.outputs.size(); ++j) {
      const int64_t version = call.outputs[j]._version();
      TORCH_CHECK(
          version == call.output_versions[j],
          "remat::checkpoint: output ",
          j,
          " of ",
          call.name,
          " (operator ",
          index,
          " of the region), kept by the policy, was modified in place after "
          "the forward (version ",
          call.output_versions[j],
          ", now ",
          version,
          "); recompute ",
          call.name,
          " (policies::recompute_ops) or avoid the in-place operation");
    }
    const auto argument_count =
        static_cast<std::ptrdiff_t>(schema.arguments().size());
    const std::vector<at::Tensor> inputs =
        tensors_of(stack->end() - argument_count, stack->end());
    for (const PackSource& source : call.sources) {
      switch (source.kind) {
        case PackSource::Kind::kInput:
          scope.sink_->fill(inputs.at(source.index));
          break;
        case PackSource::Kind::kInputView: {
          const at::Tensor& input = inputs.at(source.index);
          if (input.sizes() == source.input_sizes &&
              input.strides() == source.input_strides) {
            scope.sink_->fill(input.as_strided(
                source.sizes,
                source.strides,
                input.storage_offset() + source.offset_from_input));
            break;
          }
          // Another layout than the forward's: lay the input out as in the
          // forward, in a buffer as long as the forward's storage needed.
          auto extent = [](at::IntArrayRef sizes,
                           at::IntArrayRef strides,
                           int64_t offset) {
            int64_t end = offset + 1;
            for (size_t d = 0; d < sizes.size(); ++d) {
              if (sizes[d] == 0) {
                return offset;
              }
              end += (sizes[d] - 1) * strides[d];
            }
            return end;
          };
          const int64_t view_offset =
              source.input_offset + source.offset_from_input;
          TORCH_CHECK(
              view_offset >= 0,
              "remat::checkpoint: cannot rebuild a tensor saved by ",
              call.name,
              " (operator ",
              index,
              " of the region) from its recomputed input");
          const int64_t length = std::max(
              extent(
                  source.input_sizes,
                  source.input_strides,
                  source.input_offset),
              extent(source.sizes, source.strides, view_offset));
          const at::NoGradGuard no_grad;  // values only: fill() detaches
          at::Tensor buffer = at::empty({length}, input.options());
          buffer
              .as_strided(
                  source.input_sizes, source.input_strides, source.input_offset)
              .copy_(input);
          scope.sink_->fill(
              buffer.as_strided(source.sizes, source.strides, view_offset));
          break;
        }
        case PackSource::Kind::kHeld:
          scope.sink_->fill(source.held);
          break;
      }
    }
    torch::jit::drop(*stack, argument_count);
    for (const c10::IValue& value : call.returns) {
      stack->push_back(replayed(value));
    }
    // Handed over: from here the recomputation holds what it still needs,
    // and a kept output it only passes on is freed as soon as it is used.
    clear_kept(call);
    scope.cursor_ = call.end_call;
    return;
  }

  scope.cursor_ = index + 1;
  op.redispatchBoxed(below, stack);
  TORCH_CHECK(
      scope.cursor_ == calls_[index].end_call,
      "remat::checkpoint: with a policy, the recomputation must run the "
      "operators of the forward, but ",
      schema.name(),
      " (operator ",
      index,
      " of the region) ran ",
      scope.cursor_ - index - 1,
      " nested operators in the recomputation and ",
      calls_[index].end_call - index - 1,
      " in the forward");
}

SelectiveBypass::SelectiveBypass(bool active) {
  if (active) {
    exclude_.emplace(c10::DispatchKeySet(compat::kSelectiveKey));
  }
}

SelectiveScope::SelectiveScope(SelectiveRegion* region, PackSink* sink)
    : region_(region), sink_(sink) {
  if (region_ != nullptr) {
    include_.emplace(c10::DispatchKeySet(compat::kSelectiveKey));
  }
  tls_scopes.push_back(this);
}

SelectiveScope::~SelectiveScope() {
  TORCH_INTERNAL_ASSERT(
      !tls_scopes.empty() && tls_scopes.back() == this,
      "remat: selective scopes must nest");
  tls_scopes.pop_back();
}

void intercept_call(
    const c10::OperatorHandle& op,
    c10::DispatchKeySet keys,
    torch::jit::Stack* stack) {
  const c10::DispatchKeySet below =
      keys & c10::DispatchKeySet(
                 c10::DispatchKeySet::FULL_AFTER, compat::kSelectiveKey);
  SelectiveScope* scope = tls_scopes.empty() ? nullptr : tls_scopes.back();
  if (scope == nullptr || scope->region_ == nullptr || below_autograd()) {
    op.redispatchBoxed(below, stack);
  } else if (scope->sink_ == nullptr) {
    scope->region_->forward_call(op, below, stack);
  } else {
    scope->region_->recompute_call(*scope, op, below, stack);
  }
}

}  // namespace remat::detail

TORCH_LIBRARY_IMPL(_, REMAT_SELECTIVE_DISPATCH_KEY, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<
             &remat::detail::intercept_call>());
}
