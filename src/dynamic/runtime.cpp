// runtime.cpp: recording, tracking, eviction and recomputation of dynamic
// rematerialization. NOTE: [Dynamic rematerialization] in runtime.h says how
// it works and what it does not track.
#include "runtime.h"

#include <algorithm>
#include <limits>
#include <utility>

#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include "compat/compat.h"
#include "remat/planner/units.h"

namespace remat::detail {
namespace {

/// An operator call in progress on this thread (recording), with the
/// storages it saved so far: what it needs of the budget.
struct OpenCall {
  const c10::OperatorHandle* op;
  int64_t saved_bytes = 0;
  std::vector<const c10::StorageImpl*> saved_storages;
  bool nested_random = false;
  // Packs of tensors not known yet (the call's own outputs): resolved when
  // the call returns.
  std::vector<std::shared_ptr<DynamicSaved>> pending;
};

thread_local std::vector<OpenCall> tls_open_calls;

/// remat's own tensor work (detach, clone, re-runs) is neither recorded nor
/// seen by a selective region.
c10::DispatchKeySet own_work_keys() {
  return c10::DispatchKeySet(compat::kDynamicKey) |
         c10::DispatchKeySet(compat::kSelectiveKey);
}

bool recordable_tensor(const at::Tensor& tensor) {
  return tensor.defined() && tensor.has_storage() &&
         tensor.layout() == at::kStrided &&
         !tensor.unsafeGetTensorImpl()->is_wrapped_number();
}

bool same_geometry(const DynamicValue& value, const at::Tensor& tensor) {
  return value.storage_offset == tensor.storage_offset() &&
         value.dtype == tensor.dtype() && value.is_conj == tensor.is_conj() &&
         value.is_neg == tensor.is_neg() && tensor.sizes() == value.sizes &&
         tensor.strides() == value.strides;
}

/// True if `value` holds no tensor, also inside containers.
bool holds_tensor(const c10::IValue& value) {
  if (value.isTensor() || value.isTensorList()) {
    return true;
  }
  if (value.isList()) {
    for (const c10::IValue& element : value.toListRef()) {
      if (holds_tensor(element)) {
        return true;
      }
    }
    return false;
  }
  if (value.isTuple()) {
    for (const c10::IValue& element : value.toTupleRef().elements()) {
      if (holds_tensor(element)) {
        return true;
      }
    }
    return false;
  }
  return value.isObject() || value.isGenericDict() || value.isFuture();
}

void flatten_tensors(const c10::IValue& value, std::vector<at::Tensor>& out) {
  if (value.isTensor()) {
    out.push_back(value.toTensor());
  } else if (value.isTensorList()) {
    for (const at::Tensor& tensor : value.toTensorVector()) {
      out.push_back(tensor);
    }
  }
}

at::Tensor tensor_of(
    const c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>&
        weak) {
  auto strong = weak.lock();
  if (!strong) {
    return at::Tensor();
  }
  return at::Tensor(std::move(strong));
}

/// A copy of `tensor`'s whole storage, viewed as `tensor` is: a re-run that
/// writes into it leaves the rest of the storage as the aliases of `tensor`
/// see it (NOTE: [Aliases rebuilt from their storage]).
at::Tensor clone_storage(const at::Tensor& tensor) {
  const auto numel = static_cast<int64_t>(
      tensor.storage().nbytes() / tensor.dtype().itemsize());
  const at::Tensor whole = tensor.as_strided({numel}, {1}, 0).clone();
  return whole.as_strided(
      tensor.sizes(), tensor.strides(), tensor.storage_offset());
}

/// Arguments LibTorch writes without its schema saying so and without
/// moving their version counters: a batch norm's running statistics
/// (LibTorch 1.13's native_batch_norm) and rrelu's noise (rrelu_with_noise
/// fills it with the slopes it draws, and saves it for backward).
bool hidden_write(
    const c10::FunctionSchema& schema, const c10::Argument& declared) {
  if (declared.name() == "running_mean" || declared.name() == "running_var") {
    return true;
  }
  return declared.name() == "noise" &&
         (schema.name() == "aten::rrelu_with_noise" ||
          schema.name() == "aten::rrelu_with_noise_");
}

int64_t elapsed_ns(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

DynamicCall::~DynamicCall() {
  // The first call destroyed on this thread drains a work list; calls it
  // destroys meanwhile only append their inputs to it.
  thread_local std::vector<std::shared_ptr<DynamicValue>>* draining = nullptr;
  std::vector<std::shared_ptr<DynamicValue>> inputs;
  for (DynamicSlot& slot : slots) {
    if (slot.value) {
      inputs.push_back(std::move(slot.value));
    }
  }
  if (draining != nullptr) {
    for (auto& input : inputs) {
      draining->push_back(std::move(input));
    }
    return;
  }
  draining = &inputs;
  while (!inputs.empty()) {
    std::shared_ptr<DynamicValue> input = std::move(inputs.back());
    inputs.pop_back();
    input.reset();  // may destroy its producer, which appends to `inputs`
  }
  draining = nullptr;
}

DynamicRuntime::DynamicRuntime(int64_t budget_bytes)
    : budget_bytes_(budget_bytes) {}

DynamicRematStats DynamicRuntime::stats() const {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  return stats_;
}

void DynamicRuntime::close() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  open_ = false;
  registry_.clear();
}

// ---- recording --------------------------------------------------------------

const std::vector<std::shared_ptr<DynamicValue>>* DynamicRuntime::registered_on(
    const at::Tensor& tensor) const {
  if (!recordable_tensor(tensor)) {
    return nullptr;
  }
  const auto found = registry_.find(tensor.storage().unsafeGetStorageImpl());
  return found == registry_.end() || found->second.unversioned
             ? nullptr
             : &found->second.values;
}

std::shared_ptr<DynamicValue> DynamicRuntime::find(
    const at::Tensor& tensor) const {
  const auto* values = registered_on(tensor);
  if (values == nullptr) {
    return nullptr;
  }
  const int64_t version = version_of(tensor);
  for (auto it = values->rbegin(); it != values->rend(); ++it) {
    if ((*it)->version == version && same_geometry(**it, tensor)) {
      return *it;
    }
  }
  return nullptr;
}

std::shared_ptr<DynamicValue> DynamicRuntime::find_or_view(
    const at::Tensor& tensor) {
  if (auto value = find(tensor)) {
    return value;
  }
  // NOTE: [Aliases rebuilt from their storage]
  // A tensor that no recorded call returned at its version: a view made
  // below autograd (inside a kernel), or the base of a view that was written
  // in place (h.narrow(0, 0, 2).sin_() moves h's version too, but only the
  // view is the call's output). It is rebuilt with as_strided from the latest
  // value recorded on the same storage at the same version, whatever part of
  // the storage that value covers: a materialization holds its whole storage
  // at its value's version (a re-run writes into its own recomputation or
  // into a clone_storage copy, never into a copy of the view alone), and one
  // version of the counter the aliases share is one state of the storage.
  const auto* values = registered_on(tensor);
  if (values == nullptr) {
    return nullptr;
  }
  const int64_t version = version_of(tensor);
  for (auto it = values->rbegin(); it != values->rend(); ++it) {
    const DynamicValue& base = **it;
    // as_strided keeps the base's conjugate and negative bits: an alias
    // with other bits is not rebuilt from it.
    if (base.version != version || base.dtype != tensor.dtype() ||
        base.is_conj != tensor.is_conj() || base.is_neg != tensor.is_neg()) {
      continue;
    }
    auto call = std::make_shared<DynamicCall>();
    DynamicSlot slot;
    slot.value = *it;
    call->slots.push_back(std::move(slot));
    call->view_sizes = tensor.sizes().vec();
    call->view_strides = tensor.strides().vec();
    call->view_offset_delta = tensor.storage_offset() - base.storage_offset;
    call->cost_ns = 1;
    register_output(call, 0, tensor);
    return find(tensor);
  }
  return nullptr;
}

void DynamicRuntime::register_output(
    const std::shared_ptr<DynamicCall>& call,
    int64_t index,
    const at::Tensor& tensor) {
  if (static_cast<int64_t>(call->outputs.size()) <= index) {
    call->outputs.resize(index + 1);
  }
  if (!recordable_tensor(tensor)) {
    return;
  }
  if (auto known = find(tensor)) {
    return;  // an alias of a known value (an outer composite's output)
  }
  Registered& registered = entry_of(tensor);
  if (registered.unversioned) {
    return;  // its state is not known by version
  }
  auto value = std::make_shared<DynamicValue>();
  value->producer = call;
  value->output_index = index;
  value->storage_offset = tensor.storage_offset();
  value->sizes = tensor.sizes().vec();
  value->strides = tensor.strides().vec();
  value->dtype = tensor.dtype();
  value->is_conj = tensor.is_conj();
  value->is_neg = tensor.is_neg();
  value->version = version_of(tensor);
  value->materialized_version = value->version;
  value->live =
      c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(
          tensor.getIntrusivePtr());
  value->last_use = clock_;
  call->outputs[index] = value;
  registered.values.push_back(std::move(value));
}

DynamicRuntime::Registered& DynamicRuntime::entry_of(const at::Tensor& tensor) {
  Registered& registered = registry_[tensor.storage().unsafeGetStorageImpl()];
  if (registered.storage.expired()) {
    registered = Registered{};  // new, or a dead storage's address reused
    registered.storage = tensor.storage().getWeakStorageImpl();
  }
  return registered;
}

// NOTE: [Writes version counters miss]
// Values are found by version because the aliases of a storage share one
// version counter, so that one version is one state of the storage. Two
// kinds of write break that, and a value on such a storage could then be
// taken for a state it is not in (its held tensor read after the write, or a
// rebuilt alias of the wrong state):
//  - a write through an alias with a counter of its own: unsafe_split's
//    chunks (the CPU LSTM and GRU cells write them in place) and
//    _unsafe_view's outputs alias their input without sharing its counter;
//  - a write LibTorch makes without moving any counter (hidden_write: rrelu
//    fills a noise tensor it made with empty_like just before).
// Such a storage is marked unversioned before the write (the call may save
// what it writes): it is no longer looked up, so what is saved or made on it
// from then on is held as it is (untracked, as a plain run holds it), and a
// later call that reads it is not recorded (a constant aliasing the storage
// would see later writes through any alias; what the call makes is held as
// it is, like the output of any call the scope does not record); its values
// recorded before are never evicted (what autograd saved of them is what a
// plain backward reads), and a re-run that reads one of them recomputes it
// from its recipe, which gives its recorded state. A write the recording does
// not see (grad mode off, a call it cannot record) through an alias with a
// counter of its own is not caught.
void DynamicRuntime::note_write(const at::Tensor& tensor, bool hidden) {
  if (!recordable_tensor(tensor)) {
    return;
  }
  const auto found = registry_.find(tensor.storage().unsafeGetStorageImpl());
  if (found != registry_.end() && !found->second.unversioned &&
      (hidden || found->second.own_counters)) {
    mark_unversioned(found->second);
  }
}

void DynamicRuntime::mark_unversioned(Registered& entry) {
  entry.unversioned = true;
  for (const std::shared_ptr<DynamicValue>& value : entry.values) {
    value->unversioned = true;
  }
}

void DynamicRuntime::note_own_counters(
    const std::vector<at::Tensor>& arguments,
    const std::vector<at::Tensor>& outputs,
    const std::vector<bool>& declared_aliases) {
  for (size_t k = 0; k < outputs.size(); ++k) {
    const at::Tensor& output = outputs[k];
    // A view shares its base's counter, and a declared alias (an in-place or
    // out= call's result, detach) is one of the arguments or shares theirs.
    if (declared_aliases[k] || !recordable_tensor(output) || output.is_view()) {
      continue;
    }
    for (const at::Tensor& argument : arguments) {
      if (argument.defined() && argument.has_storage() &&
          !argument.is_same(output) &&
          argument.storage().is_alias_of(output.storage())) {
        entry_of(output).own_counters = true;
        break;
      }
    }
  }
}

void DynamicRuntime::purge_registry() {
  // Storages that died can no longer be seen again; their values live on in
  // the recipes and saved tensors that refer to them.
  for (auto it = registry_.begin(); it != registry_.end();) {
    if (it->second.storage.expired()) {
      it = registry_.erase(it);
    } else {
      ++it;
    }
  }
  registry_purge_at_ = std::max<size_t>(1024, 2 * registry_.size());
}

void DynamicRuntime::record_call(
    const c10::OperatorHandle& op,
    c10::DispatchKeySet below,
    torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const auto argument_count =
      static_cast<std::ptrdiff_t>(schema.arguments().size());
  auto call = std::make_shared<DynamicCall>();
  bool recordable = true;
  // The argument tensors and their versions, while the call runs: a version
  // that moves marks a write the schema may not declare (LibTorch 1.13's
  // native_batch_norm writes its running statistics without saying so).
  std::vector<std::pair<at::Tensor, int64_t>> argument_versions;
  const bool random = op.hasTag(at::Tag::nondeterministic_seeded);
  {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    const c10::impl::ExcludeDispatchKeyGuard own_work(own_work_keys());
    call->arguments.assign(stack->end() - argument_count, stack->end());
    for (std::ptrdiff_t i = 0; i < argument_count; ++i) {
      c10::IValue& argument = call->arguments[i];
      const c10::Argument& declared = schema.arguments()[i];
      const bool hidden = hidden_write(schema, declared);
      const bool written = (declared.alias_info() != nullptr &&
                            declared.alias_info()->isWrite()) ||
                           hidden;
      auto add_slot = [&](const at::Tensor& tensor, bool in_list) {
        DynamicSlot slot;
        slot.argument = i;
        slot.in_list = in_list;
        slot.written = written;
        slot.value = find_or_view(tensor);
        // Before the call, which may save what it writes (NOTE: [Writes
        // version counters miss]).
        if (written) {
          note_write(tensor, hidden);
        }
        if (recordable_tensor(tensor)) {
          const auto found =
              registry_.find(tensor.storage().unsafeGetStorageImpl());
          // A read of an unversioned storage would be held as a constant
          // aliasing it, which a later write through any alias could change
          // under a re-run (the copy of `self` an in-place call makes for
          // its backward is such a read): not recorded, what the call makes
          // is held as it is.
          if (!written && found != registry_.end() &&
              found->second.unversioned) {
            recordable = false;
          }
        }
        argument_versions.emplace_back(
            tensor, tensor.defined() ? version_of(tensor) : 0);
        if (!slot.value && tensor.defined()) {
          // Detached: the recipe holds the data, not the autograd graph
          // behind it, whose saved tensors would otherwise live as long as
          // the recipe (until the scope ends, or for good once their hooks
          // hold the recipe).
          slot.constant = tensor.detach();
          slot.constant_version = version_of(tensor);
        }
        call->slots.push_back(std::move(slot));
      };
      if (argument.isTensor()) {
        add_slot(argument.toTensor(), false);
        argument = c10::IValue();
      } else if (argument.isTensorList()) {
        for (const at::Tensor& tensor : argument.toTensorVector()) {
          add_slot(tensor, true);
        }
        argument = c10::List<at::Tensor>();
      } else if (holds_tensor(argument)) {
        recordable = false;
        break;
      }
    }
    if (!recordable) {
      call->arguments.clear();
      call->slots.clear();
    } else if (random) {
      torch::autograd::variable_list inputs;
      for (auto it = stack->end() - argument_count; it != stack->end(); ++it) {
        flatten_tensors(*it, inputs);
      }
      inputs.erase(
          std::remove_if(
              inputs.begin(),
              inputs.end(),
              [](const at::Tensor& tensor) { return !tensor.defined(); }),
          inputs.end());
      call->rng.emplace(inputs, /*preserve_rng=*/true);
    }
  }

  tls_open_calls.push_back(OpenCall{&op, 0, {}, false, {}});
  struct Close {
    ~Close() {
      tls_open_calls.pop_back();
    }
  } close;
  const auto start = std::chrono::steady_clock::now();
  op.redispatchBoxed(below, stack);
  call->cost_ns = std::max<int64_t>(1, elapsed_ns(start));
  std::vector<at::Tensor> arguments;  // for note_own_counters, then let go
  if (recordable) {
    for (size_t j = 0; j < call->slots.size(); ++j) {
      const auto& [tensor, version] = argument_versions[j];
      if (tensor.defined() && version_of(tensor) != version) {
        call->slots[j].written = true;
      }
      arguments.push_back(tensor);
    }
  }
  argument_versions.clear();
  const bool nested_random = tls_open_calls.back().nested_random;
  if (random && tls_open_calls.size() > 1) {
    tls_open_calls[tls_open_calls.size() - 2].nested_random = true;
  }
  if (nested_random && !random) {
    if (tls_open_calls.size() > 1) {
      tls_open_calls[tls_open_calls.size() - 2].nested_random = true;
    }
    recordable = false;  // its RNG state was not captured
  }
  std::vector<at::Tensor> outputs;
  std::vector<bool> declared_aliases;  // per output: its return is annotated
  if (recordable) {
    const std::vector<c10::Argument>& returns = schema.returns();
    const auto return_count = static_cast<std::ptrdiff_t>(returns.size());
    for (std::ptrdiff_t r = 0; r < return_count; ++r) {
      flatten_tensors(*(stack->end() - return_count + r), outputs);
      declared_aliases.resize(
          outputs.size(), returns[r].alias_info() != nullptr);
    }
  }
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  const c10::impl::ExcludeDispatchKeyGuard own_work(own_work_keys());
  if (recordable && open_) {
    // A write only the version counters saw (undeclared), then the aliases
    // with counters of their own this call made. (`arguments` is let go
    // before the packs below are tracked: held, its storages could not be
    // evicted.)
    for (size_t j = 0; j < call->slots.size(); ++j) {
      if (call->slots[j].written) {
        note_write(arguments[j], /*hidden=*/false);
      }
    }
    note_own_counters(arguments, outputs, declared_aliases);
    ++stats_.recorded_calls;
    ++clock_;
    call->op = op;
    for (size_t k = 0; k < outputs.size(); ++k) {
      // An output aliasing a tensor from outside the scope stays outside: a
      // view of a parameter (a transposed weight) holds no activation
      // memory, and a buffer the call wrote would be re-run on a copy.
      bool external = false;
      for (const DynamicSlot& slot : call->slots) {
        external =
            external ||
            (!slot.value && slot.constant.defined() && outputs[k].defined() &&
             outputs[k].has_storage() && slot.constant.has_storage() &&
             slot.constant.storage().is_alias_of(outputs[k].storage()));
      }
      if (external) {
        if (call->outputs.size() <= k) {
          call->outputs.resize(k + 1);
        }
        continue;
      }
      register_output(call, static_cast<int64_t>(k), outputs[k]);
    }
    if (registry_.size() >= registry_purge_at_) {
      purge_registry();
    }
  }
  arguments.clear();
  // Tensors the call saved before its outputs were known.
  std::vector<std::shared_ptr<DynamicSaved>> pending =
      std::move(tls_open_calls.back().pending);
  for (const std::shared_ptr<DynamicSaved>& saved : pending) {
    std::shared_ptr<DynamicValue> value =
        saved.use_count() > 1 && open_ ? find(saved->plain) : nullptr;
    if (!value) {
      ++stats_.untracked_saved_tensors;
      continue;
    }
    attach(*saved, value, saved->plain);
  }
}

// ---- tracking ---------------------------------------------------------------

void DynamicRuntime::note_tracked() {
  stats_.tracked_peak_bytes =
      std::max(stats_.tracked_peak_bytes, stats_.tracked_bytes);
}

void DynamicRuntime::make_resident(
    DynamicValue& value, const at::Tensor& tensor) {
  if (value.resident.defined()) {
    return;
  }
  value.resident = tensor;
  value.materialized_version = version_of(tensor);
  value.live =
      c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(
          tensor.getIntrusivePtr());
  const c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  value.resident_storage = storage;
  Resident& entry = resident_[storage];
  if (entry.values.empty()) {
    entry.bytes = static_cast<int64_t>(tensor.storage().nbytes());
    stats_.tracked_bytes += entry.bytes;
    note_tracked();
  }
  entry.values.push_back(&value);
}

void DynamicRuntime::drop_resident(DynamicValue& value) {
  if (!value.resident.defined()) {
    return;
  }
  const auto found = resident_.find(value.resident_storage);
  TORCH_INTERNAL_ASSERT(
      found != resident_.end(), "remat::DynamicRemat: resident storage lost");
  auto& values = found->second.values;
  values.erase(std::find(values.begin(), values.end(), &value));
  if (values.empty()) {
    stats_.tracked_bytes -= found->second.bytes;
    resident_.erase(found);
  }
  value.resident = at::Tensor();
  value.resident_storage = nullptr;
}

void DynamicRuntime::pack(
    const at::Tensor& tensor, const std::shared_ptr<DynamicSaved>& saved) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  const c10::impl::ExcludeDispatchKeyGuard own_work(own_work_keys());
  ++stats_.saved_tensors;
  std::shared_ptr<DynamicValue> value = open_ ? find_or_view(tensor) : nullptr;
  if (value) {
    attach(*saved, value, tensor);
    return;
  }
  saved->plain = tensor.detach();
  if (open_ && !tls_open_calls.empty()) {
    tls_open_calls.back().pending.push_back(saved);
  } else {
    ++stats_.untracked_saved_tensors;
  }
}

void DynamicRuntime::attach(
    DynamicSaved& saved,
    const std::shared_ptr<DynamicValue>& value,
    const at::Tensor& tensor) {
  const c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  if (!value->resident.defined() && resident_.count(storage) == 0 &&
      !tls_open_calls.empty()) {
    // What this operator alone needs: the storages it saved so far and this
    // one. Refused before anything is tracked for it.
    OpenCall& open = tls_open_calls.back();
    const auto bytes = static_cast<int64_t>(tensor.storage().nbytes());
    const bool counted =
        std::find(
            open.saved_storages.begin(), open.saved_storages.end(), storage) !=
        open.saved_storages.end();
    const int64_t needed = open.saved_bytes + (counted ? 0 : bytes);
    TORCH_CHECK(
        needed <= budget_bytes_,
        "remat::DynamicRemat: budget ",
        planner::format_bytes(budget_bytes_),
        " is below what ",
        open.op->schema().name(),
        " needs (",
        planner::format_bytes(needed),
        " of tensors it saves for backward); raise budget_bytes to at least ",
        needed);
    if (!counted) {
      open.saved_bytes = needed;
      open.saved_storages.push_back(storage);
    }
    stats_.largest_call_bytes = std::max(stats_.largest_call_bytes, needed);
  }
  ++value->saved_refs;
  value->last_use = ++clock_;
  make_resident(*value, tensor.detach());
  saved.value = value;
  saved.plain = at::Tensor();
  if (stats_.tracked_bytes > budget_bytes_) {
    evict_within_budget();
  }
}

void DynamicRuntime::release(DynamicSaved& saved) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (!saved.value) {
    return;
  }
  DynamicValue& value = *saved.value;
  --value.saved_refs;
  if (value.saved_refs == 0) {
    drop_resident(value);
  }
}

bool DynamicRuntime::evictable(const Resident& entry) const {
  // Only remat's resident aliases hold the storage: each alias is held only
  // by remat, and the storage only by those aliases.
  for (const DynamicValue* value : entry.values) {
    if (value->resident.use_count() != 1 || value->unversioned) {
      return false;
    }
  }
  return !entry.values.empty() &&
         entry.values.front()->resident.storage().use_count() ==
             entry.values.size();
}

bool DynamicRuntime::materialized(const DynamicValue& value) const {
  if (value.resident.defined()) {
    return version_of(value.resident) == value.materialized_version;
  }
  const at::Tensor live = tensor_of(value.live);
  return live.defined() && version_of(live) == value.materialized_version;
}

double DynamicRuntime::eviction_score(const Resident& entry) const {
  // DTR's heuristic: what a recomputation would cost (the values' own calls
  // and those of their inputs that are evicted too), per byte freed and per
  // tick since last use.
  double cost_ns = 0;
  int64_t last_use = 0;
  for (const DynamicValue* value : entry.values) {
    cost_ns += static_cast<double>(value->producer->cost_ns);
    for (const DynamicSlot& slot : value->producer->slots) {
      if (slot.value && !materialized(*slot.value)) {
        cost_ns += static_cast<double>(slot.value->producer->cost_ns);
      }
    }
    last_use = std::max(last_use, value->last_use);
  }
  const auto staleness = static_cast<double>(clock_ - last_use + 1);
  return cost_ns / (static_cast<double>(entry.bytes) * staleness);
}

void DynamicRuntime::evict_within_budget() {
  while (stats_.tracked_bytes > budget_bytes_) {
    const Resident* best = nullptr;
    double best_score = std::numeric_limits<double>::infinity();
    for (const auto& [storage, entry] : resident_) {
      if (!evictable(entry)) {
        continue;
      }
      const double score = eviction_score(entry);
      if (best == nullptr || score < best_score) {
        best = &entry;
        best_score = score;
      }
    }
    if (best == nullptr) {
      return;  // what is left is held by the caller's code: evicted later
    }
    // drop_resident erases the entry: copy its values first.
    const std::vector<DynamicValue*> values = best->values;
    for (DynamicValue* value : values) {
      drop_resident(*value);
    }
    ++stats_.evictions;
  }
}

// ---- recomputation ----------------------------------------------------------

at::Tensor DynamicRuntime::unpack(DynamicSaved& saved) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (!saved.value) {
    return saved.plain;
  }
  DynamicValue& value = *saved.value;
  const c10::impl::ExcludeDispatchKeyGuard own_work(own_work_keys());
  value.last_use = ++clock_;
  bool fresh = false;
  at::Tensor tensor = materialize(value, &fresh, /*as_recorded=*/false);
  if (value.saved_refs > 0 && !value.resident.defined()) {
    make_resident(value, tensor);
  }
  if (stats_.tracked_bytes > budget_bytes_) {
    evict_within_budget();  // `tensor` is held here, so it stays
  }
  return tensor;
}

at::Tensor DynamicRuntime::materialize(
    DynamicValue& value, bool* fresh, bool as_recorded) {
  *fresh = false;
  // What is held of an unversioned value is what autograd saved, not
  // necessarily its recorded state (NOTE: [Writes version counters miss]).
  const bool held_is_recorded = !(as_recorded && value.unversioned);
  if (held_is_recorded && value.resident.defined()) {
    if (version_of(value.resident) == value.materialized_version) {
      return value.resident;
    }
    drop_resident(value);  // written since: recomputed below
  }
  at::Tensor live = tensor_of(value.live);
  if (held_is_recorded && live.defined() &&
      version_of(live) == value.materialized_version) {
    return live.detach();
  }
  std::vector<at::Tensor> outputs = rerun(*value.producer);
  TORCH_INTERNAL_ASSERT(
      value.output_index < static_cast<int64_t>(outputs.size()),
      "remat::DynamicRemat: a recomputation returned fewer tensors than the "
      "forward");
  const at::Tensor& result = outputs[value.output_index];
  TORCH_CHECK(
      result.defined(),
      "remat::DynamicRemat: a recomputation of ",
      value.producer->op ? value.producer->op->schema().name()
                         : std::string("a view"),
      " gave no tensor as its output ",
      value.output_index,
      ", which the forward gave and backward needs");
  // Fresh, and writable unless it is resident (saved) now.
  *fresh = !(value.resident.defined() && value.resident.is_same(result));
  return result;
}

std::vector<at::Tensor> DynamicRuntime::rerun(DynamicCall& call) {
  // The inputs, materialized first (recursively); held until the call ran.
  std::vector<at::Tensor> inputs;
  inputs.reserve(call.slots.size());
  for (const DynamicSlot& slot : call.slots) {
    at::Tensor input;
    if (slot.value) {
      bool fresh = false;
      input = materialize(*slot.value, &fresh, /*as_recorded=*/true);
      if (slot.written && !fresh) {
        // Never write into a tensor someone holds; the copy keeps the rest
        // of the storage, which the written view's aliases are rebuilt from.
        input = clone_storage(input);
      }
    } else {
      input = slot.constant;
      if (input.defined() && slot.written) {
        // A tensor from outside the scope that the call writes (BatchNorm's
        // running statistics): re-run on a copy of its current value, so
        // that module state moves once, as in the forward.
        input = input.clone();
      } else if (input.defined()) {
        TORCH_CHECK(
            version_of(input) == slot.constant_version,
            "remat::DynamicRemat: cannot recompute ",
            call.op ? call.op->schema().name() : std::string("a view"),
            ": its input ",
            slot.argument,
            " was modified in place after the forward used it (version ",
            slot.constant_version,
            ", now ",
            version_of(input),
            ")");
      }
    }
    inputs.push_back(std::move(input));
  }

  std::vector<at::Tensor> outputs;
  {
    const at::AutoDispatchBelowAutograd below_autograd;
    // Grad mode as in the forward (only calls made with it on are recorded):
    // some kernels read it (LibTorch 2.x's mkldnn_rnn_layer makes the
    // workspace its backward reads only then). Below autograd, no graph is
    // built either way.
    const c10::AutoGradMode grad_mode(true);
    if (!call.op) {
      const at::Tensor& base = inputs.at(0);
      outputs.push_back(base.as_strided(
          call.view_sizes,
          call.view_strides,
          base.storage_offset() + call.view_offset_delta));
    } else {
      torch::jit::Stack stack = call.arguments;
      size_t next = 0;
      for (size_t i = 0; i < stack.size(); ++i) {
        if (next < call.slots.size() &&
            call.slots[next].argument == static_cast<int64_t>(i)) {
          if (call.slots[next].in_list) {
            c10::List<at::Tensor> list;
            while (next < call.slots.size() &&
                   call.slots[next].argument == static_cast<int64_t>(i)) {
              list.push_back(inputs[next]);
              ++next;
            }
            stack[i] = std::move(list);
          } else {
            stack[i] = inputs[next];
            ++next;
          }
        }
      }
      std::optional<RecomputeGuard> rng;
      if (call.rng) {
        rng.emplace(
            *call.rng, std::vector<std::shared_ptr<torch::nn::Module>>{});
      }
      call.op->callBoxed(&stack);
      for (const c10::IValue& result : stack) {
        flatten_tensors(result, outputs);
      }
    }
  }
  ++stats_.rematerializations;
  for (size_t k = 0; k < call.outputs.size() && k < outputs.size(); ++k) {
    const std::shared_ptr<DynamicValue> value = call.outputs[k].lock();
    if (!value || !outputs[k].defined()) {
      continue;  // (an undefined one is refused where it is needed)
    }
    if (value->resident.defined() &&
        version_of(value->resident) == value->materialized_version) {
      continue;  // still valid: keep the one autograd may hold
    }
    drop_resident(*value);
    value->live =
        c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(
            outputs[k].getIntrusivePtr());
    value->materialized_version = version_of(outputs[k]);
    if (value->saved_refs > 0) {
      make_resident(*value, outputs[k]);
    }
  }
  // Within the budget again before the caller goes on: what the recursion
  // still needs is held by its frames (`inputs`, `outputs`), so it stays.
  if (stats_.tracked_bytes > budget_bytes_) {
    evict_within_budget();
  }
  return outputs;
}

}  // namespace remat::detail
