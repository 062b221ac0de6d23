// runtime.h (private): the runtime behind remat::DynamicRemat: the recorded
// calls, the tracked tensors, eviction and recomputation.
//
// NOTE: [Dynamic rematerialization]
// Two of remat's mechanisms give a plan-free runtime everything a fork of
// PyTorch was needed for in DTR (Kirisame et al., 2021):
//
// Recording. While a scope is open, a thread-local include guard enables a
// boxed dispatcher fallback on compat::kDynamicKey (a key above autograd that
// LibTorch registers nothing for; see NOTE: [Selective checkpointing] for why
// such a key sees the operators autograd records). Every call made at
// autograd level with grad mode on becomes a `Call`: the operator, its
// arguments with each tensor replaced by a `Slot` (a tracked `Value`, or,
// made outside the scope, the tensor detached), its measured time, and
// for an operator tagged nondeterministic_seeded the RNG state before it
// (NOTE: [Recompute and RNG]). A slot is "written" when the schema says so,
// when its version counter moved during the call, or when LibTorch writes it
// without either (a batch norm's running_mean / running_var in 1.13, rrelu's
// noise). A storage written where its version counters cannot see (that
// hidden write into a tracked value, or a write through an alias with a
// counter of its own, as unsafe_split's chunks) is no longer tracked from
// then on (NOTE: [Writes version counters miss] in runtime.cpp).
// Each tensor output that is not already known, and that is no alias of a
// tensor from outside the scope (a transposed weight, a buffer written in
// place), becomes a `Value`: a recipe (its call and output index), its geometry
// (storage offset, sizes, strides, dtype, conjugate and negative bits) and
// the version of its storage's version counter. Values are found again by
// storage, geometry and version, never by TensorImpl: autograd hands pack hooks
// a detached alias. An alias with no Value of its own (a view made inside a
// kernel, the base of a view written in place) gets one rebuilt from a Value on
// its storage at its version (NOTE: [Aliases rebuilt from their storage] in
// runtime.cpp). Calls nested in a composite call are recorded too; a tensor
// keeps the Value of the innermost call that produced it (the outer composite's
// output matches it and adds nothing).
//
// Tracking. The scope pushes saved-tensor hooks. A pack finds the saved
// tensor's Value and holds a detached alias of it ("resident"). An operator
// that saves its own output (relu, tanh, sigmoid) packs it before the
// fallback has registered it: such a pack waits in the call's frame and is
// resolved when the call returns. Bytes are
// counted per storage, once however many resident values share it. When the
// tracked bytes exceed the budget, storages are evicted, lowest
//   (cost of its values + cost of their evicted inputs) / (bytes x staleness)
// first. A storage is evictable only when remat's resident aliases are all
// that hold it: a tensor the user's code or a running recomputation still
// holds frees nothing, so it waits; use counts are the only lock needed.
// An unpack rematerializes: a valid resident or live tensor is used as it is
// (valid = its version counter still reads the version recorded for it);
// otherwise the call is re-run below autograd (ADInplaceOrView stays, so views
// share version counters and in-place writes bump them as in the forward),
// each input rematerialized first, recursively; every still-tracked output of
// that call gets the new tensor, and saved ones become resident again. A
// write during a re-run goes to a fresh tensor (an input that is a resident or
// live tensor is cloned first, its whole storage), so in-place chains
// (dropout's empty_like/bernoulli_/div_) replay from the start with their RNG
// state.
// When autograd frees a saved tensor (its node ran without retain_graph), the
// hooks are destroyed and the resident alias is dropped. A tensor from
// outside the scope that a call writes is re-run on a copy of it, so that
// module state (running statistics) moves once per step.
//
// Lifetime. Saved-tensor hooks hold the runtime and their values; values
// hold their recipes and recipes their input values, so backward works
// after the scope ended. The registry (storage -> values, to find tensors
// again) holds everything recorded until the scope ends; storages that died
// are purged from it as it grows. Recipe chains are freed iteratively
// (~DynamicCall), as deep graphs would overflow the stack.
//
// Budget errors. The bytes an operator needs are the storages it saves while
// it runs; if they alone exceed the budget, the pack throws (before anything
// is tracked for it), naming the operator and the bytes.
//
// Not tracked: tensors made outside the scope or with grad mode off, outputs
// of calls with arguments other than tensors, tensor lists and values without
// tensors (lists of optional tensors), composite calls that nest a random
// operator without being tagged themselves. Their saved tensors are held as
// they are. A constant input (a tensor the scope does not track) written in
// place after a recorded call used it makes that call's re-run fail.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include "checkpoint/recompute_context.h"
#include "remat/dynamic.h"

namespace remat::detail {

struct DynamicCall;

/// One tensor the scope produced: its recipe and where it is now.
struct DynamicValue {
  std::shared_ptr<DynamicCall> producer;  // never null
  int64_t output_index = 0;               // among the call's tensor outputs
  // Geometry, to find the value again from an alias of it.
  int64_t storage_offset = 0;
  std::vector<int64_t> sizes, strides;
  caffe2::TypeMeta dtype;
  // A conjugate or negative view shares its base's storage and geometry but
  // not its values: the bits are part of what identifies it.
  bool is_conj = false;
  bool is_neg = false;
  int64_t version = 0;  // the version counter right after the call

  // The last materialization (the forward's tensor, or a recomputation's),
  // weakly; valid while alive and its version counter reads
  // materialized_version.
  c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> live{
      c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>()};
  int64_t materialized_version = 0;
  at::Tensor resident;  // held while saved and not evicted (a detached alias)
  const c10::StorageImpl* resident_storage = nullptr;
  int64_t saved_refs = 0;  // saved-tensor hooks that refer to it
  int64_t last_use = 0;    // the runtime's clock at its last pack or unpack
  // Its storage was written where its version counter cannot see (NOTE:
  // [Writes version counters miss] in runtime.cpp): what is held of it may
  // not be its recorded state, so it is never evicted, and a re-run that
  // reads it recomputes it.
  bool unversioned = false;
};

/// Where a recorded call's argument tensor comes from when it is re-run.
struct DynamicSlot {
  int64_t argument = 0;                 // index in the call's arguments
  bool in_list = false;                 // an element of a tensor list
  bool written = false;                 // the schema says the call writes it
  std::shared_ptr<DynamicValue> value;  // tracked; else `constant`
  at::Tensor constant;                  // made outside the scope (detached)
  int64_t constant_version = 0;
};

/// One recorded operator call (or, without `op`, a view of slot 0 rebuilt
/// with as_strided).
struct DynamicCall {
  DynamicCall() = default;
  /// Frees the chain of recipes behind it iteratively: a forward of many
  /// thousand calls would otherwise overflow the stack in destructors.
  ~DynamicCall();
  DynamicCall(const DynamicCall&) = delete;
  DynamicCall& operator=(const DynamicCall&) = delete;

  std::optional<c10::OperatorHandle> op;
  std::vector<c10::IValue> arguments;  // tensors replaced by None
  std::vector<DynamicSlot> slots;
  std::vector<std::weak_ptr<DynamicValue>> outputs;
  std::optional<RecomputeContext> rng;  // random operators only
  int64_t cost_ns = 1;
  // A view without `op`: geometry relative to slot 0's storage offset.
  std::vector<int64_t> view_sizes, view_strides;
  int64_t view_offset_delta = 0;
};

/// What the hooks of one saved tensor hold: its tracked value, or the tensor
/// itself (untracked, or until the call that produced it has returned).
struct DynamicSaved {
  std::shared_ptr<DynamicValue> value;
  at::Tensor plain;
};

/// The state of one DynamicRemat scope, shared with the saved-tensor hooks
/// of everything it saved (so backward may run after the scope ended).
class DynamicRuntime : public std::enable_shared_from_this<DynamicRuntime> {
 public:
  explicit DynamicRuntime(int64_t budget_bytes);

  DynamicRematStats stats() const;

  // Recording (the dispatcher fallback, the scope's thread only).
  void record_call(
      const c10::OperatorHandle& op,
      c10::DispatchKeySet below,
      torch::jit::Stack* stack);
  /// The scope ended: no more recording; forgets the tensor registry.
  void close();

  // Saved-tensor hooks.
  void pack(
      const at::Tensor& tensor, const std::shared_ptr<DynamicSaved>& saved);
  at::Tensor unpack(DynamicSaved& saved);
  void release(DynamicSaved& saved);

 private:
  struct Registered {  // the values recorded on one storage
    c10::weak_intrusive_ptr<c10::StorageImpl> storage{
        c10::intrusive_ptr<c10::StorageImpl>()};
    std::vector<std::shared_ptr<DynamicValue>> values;
    // Aliased by a tensor with a version counter of its own (an output of
    // unsafe_split or _unsafe_view).
    bool own_counters = false;
    // Written where a version counter cannot see: no longer found by
    // version (NOTE: [Writes version counters miss]).
    bool unversioned = false;
  };
  struct Resident {  // one storage held for saved values
    int64_t bytes = 0;
    std::vector<DynamicValue*> values;
  };

  /// The values recorded on `tensor`'s storage (nullptr: none, or a tensor
  /// that cannot be recorded).
  const std::vector<std::shared_ptr<DynamicValue>>* registered_on(
      const at::Tensor& tensor) const;
  std::shared_ptr<DynamicValue> find(const at::Tensor& tensor) const;
  std::shared_ptr<DynamicValue> find_or_view(const at::Tensor& tensor);
  void register_output(
      const std::shared_ptr<DynamicCall>& call,
      int64_t index,
      const at::Tensor& tensor);
  void purge_registry();
  /// The registry's entry for `tensor`'s storage, made if new.
  Registered& entry_of(const at::Tensor& tensor);
  /// A recorded call writes `tensor`: marks its storage unversioned if the
  /// write is one its version counters miss (`hidden`, or a storage with
  /// counters of its own).
  void note_write(const at::Tensor& tensor, bool hidden);
  /// Marks the values on `entry`'s storage unversioned; the storage is no
  /// longer looked up by version.
  void mark_unversioned(Registered& entry);
  /// Notes outputs of `call` that alias an argument's storage with a
  /// version counter of their own.
  void note_own_counters(
      const std::vector<at::Tensor>& arguments,
      const std::vector<at::Tensor>& outputs,
      const std::vector<bool>& declared_aliases);
  /// Tracks `tensor`, saved through `saved`, as `value`; throws if the
  /// operator running now needs more than the budget (nothing changed then).
  void attach(
      DynamicSaved& saved,
      const std::shared_ptr<DynamicValue>& value,
      const at::Tensor& tensor);

  /// The value's tensor, recomputed if needed; `fresh` tells whether it was
  /// made by this call (and so may be written). `as_recorded`: the state the
  /// value was recorded in (a re-run's input), recomputed for an unversioned
  /// value; otherwise what autograd saved (an unpack).
  at::Tensor materialize(DynamicValue& value, bool* fresh, bool as_recorded);
  /// Re-runs `call` below autograd; its tensor outputs, flattened.
  std::vector<at::Tensor> rerun(DynamicCall& call);
  void make_resident(DynamicValue& value, const at::Tensor& tensor);
  void drop_resident(DynamicValue& value);
  bool evictable(const Resident& entry) const;
  bool materialized(const DynamicValue& value) const;
  double eviction_score(const Resident& entry) const;
  void evict_within_budget();
  void note_tracked();

  const int64_t budget_bytes_;
  mutable std::recursive_mutex mutex_;
  bool open_ = true;
  int64_t clock_ = 0;
  std::unordered_map<const c10::StorageImpl*, Registered> registry_;
  size_t registry_purge_at_ = 1024;
  std::unordered_map<const c10::StorageImpl*, Resident> resident_;
  DynamicRematStats stats_;
};

}  // namespace remat::detail
