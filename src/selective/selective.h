// selective.h (private): selective checkpointing, the operator-level half of
// a checkpoint region with a per-op policy (see remat/policy.h).
//
// NOTE: [Selective checkpointing]
// LibTorch has no Python dispatch modes, so remat sees a region's operators
// through a boxed dispatcher fallback on a dispatch key that no LibTorch
// registers anything for (compat::kSelectiveKey). The key sits above
// autograd; a thread-local include guard enables it while a region with a
// policy runs. The fallback acts only on calls made at autograd level (not
// from inside a kernel, where autograd keys are excluded), so it sees the
// operators autograd records, composite operators and the operators they
// decompose into, in a deterministic pre-order.
//
// Forward: every operator call is logged (name, how many calls nest in it,
// and which of the region's saved tensors autograd packed while it ran).
// After the call, the policy is asked; for a kept call, its outputs are held,
// and each tensor packed during it is traced to where it can be found again
// without running it: one of the call's inputs or a view of one (rebuilt from
// the input the recomputation produces), or, for anything else, the tensor
// itself (held; free when it aliases a kept output). A later call of the
// forward that writes in place into the storage of a kept output (a composite
// adding a bias to its matmul's result, say) un-keeps that call: it is
// recomputed like the others.
//
// Recomputation: the region re-runs under the same guard. A kept call is not
// executed: the tensors it packed in the forward are handed to the frame in
// order, as its pack hooks would have, and its held outputs are pushed in
// place of its results (detached; where the forward's required grad, they
// get a grad_fn of their own that never runs, not leaf status: a leaf's
// gradient accumulator would keep the tensor alive as long as the recomputed
// operators after it). The frame's saved-tensor bookkeeping is therefore the
// same as for a full recomputation, early stop included. Calls, names and the
// policy's answers are checked against the forward; a held output modified in
// place since the forward (its version counter moved) is refused. The region
// drops a kept call's tensors as soon as they are handed over, so an output
// that backward does not need is freed once the recomputation has used it,
// as a recomputed one would be; those an early stop does not reach are
// released after the recomputation. A second recomputation (backward with
// retain_graph) recomputes every operator.
//
// Never kept: calls that draw random numbers (or nest one), that write to an
// input or return an alias of one, or that return anything but tensors. A
// call draws random numbers if its operator is tagged nondeterministic_seeded,
// a call nested in it does, or the default CPU generator moved during it (a
// custom operator whose own autograd kernel draws below the fallback).
// Nested checkpoint regions suspend the enclosing region's interception, and
// so do saved-tensor hooks (remat/saved_tensor_hooks.h: offload, compression,
// a user's) while they pack or unpack: their operators depend on the hook's
// state, not on the region's code.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "remat/policy.h"

namespace c10 {
class OperatorHandle;
}

namespace remat::detail {

/// Receives, during a recomputation, the saved tensors a skipped call would
/// have packed (the checkpoint frame's recording step).
class PackSink {
 public:
  virtual ~PackSink() = default;
  virtual void fill(const at::Tensor& tensor) = 0;
};

class SelectiveScope;

/// The operator log of one checkpointed region with a policy.
class SelectiveRegion {
 public:
  explicit SelectiveRegion(Policy policy);

  /// Forward: autograd packed `tensor` for this region (called for every
  /// saved tensor of the region, in save order).
  void on_pack(const at::Tensor& tensor);
  /// Drops every held tensor; later recomputations run every operator.
  void release();

  // The dispatcher fallback's entry points (selective.cpp).
  void forward_call(
      const c10::OperatorHandle& op,
      c10::DispatchKeySet below,
      torch::jit::Stack* stack);
  void recompute_call(
      SelectiveScope& scope,
      const c10::OperatorHandle& op,
      c10::DispatchKeySet below,
      torch::jit::Stack* stack);

 private:
  /// Where a tensor packed during a kept call is found without running it.
  struct PackSource {
    enum class Kind {
      kInput,      // input `index` itself
      kInputView,  // a view of input `index`: rebuilt with as_strided
      kHeld,       // anything else: `held` (free if it aliases an output)
    };
    Kind kind = Kind::kHeld;
    int64_t index = 0;
    std::vector<int64_t> sizes, strides;  // kInputView
    int64_t offset_from_input = 0;  // kInputView: storage offset - input's
    // kInputView: the input's layout in the forward. A recomputed input may
    // come back with another one (a saved-tensor hook that returns a dense
    // copy of a non-dense tensor: SaveToFile, CompressActivations).
    std::vector<int64_t> input_sizes, input_strides;
    int64_t input_offset = 0;
    at::Tensor held;  // kHeld
  };
  struct LoggedCall {
    std::string name;
    int64_t end_call = 0;       // one past the last call nested in this one
    int64_t first_pack = 0;     // packs made while it ran: [first_pack,
    int64_t end_pack = 0;       //   end_pack)
    bool random = false;        // it or a nested call drew random numbers
    bool asked = false;         // the policy was asked (an eligible call)
    bool policy_saves = false;  // what the policy answered
    bool kept = false;          // kept: the policy saves it and nothing wrote
                                // into its outputs during the forward
    int64_t output_bytes = 0;   // tensor outputs, as measured in the forward
    std::vector<c10::IValue> returns;  // kept: the call's results
    std::vector<at::Tensor> outputs;   // kept: the tensors among them
    std::vector<int64_t> output_versions;
    std::vector<PackSource> sources;  // kept: one per pack in its range
  };

  /// Where `packed` is found again in a recomputation that does not run the
  /// call with these `inputs`.
  static PackSource trace(
      const at::Tensor& packed, const std::vector<at::Tensor>& inputs);
  void keep(
      int64_t index,
      const std::vector<at::Tensor>& inputs,
      std::vector<c10::IValue> returns,
      std::vector<at::Tensor> outputs);
  /// A call about to write into `written`: calls whose kept outputs share its
  /// storage are recomputed instead.
  void forget_kept_storage(const at::Tensor& written);
  static void clear_kept(LoggedCall& call);

  Policy policy_;
  std::vector<LoggedCall> calls_;
  std::vector<at::Tensor> packs_;  // held only while a call is open
  std::vector<int64_t> open_;  // forward: calls in progress, outermost first
  // Forward: the calls whose kept outputs live in each storage.
  std::unordered_map<const c10::StorageImpl*, std::vector<int64_t>>
      kept_storages_;
};

/// RAII: this thread's operators go through `region` for the guard's
/// lifetime: logged (forward, `sink` null) or replayed (recomputation). A
/// null `region` suspends an enclosing region's interception (a nested
/// checkpoint region).
class SelectiveScope {
 public:
  SelectiveScope(SelectiveRegion* region, PackSink* sink);
  ~SelectiveScope();
  SelectiveScope(const SelectiveScope&) = delete;
  SelectiveScope& operator=(const SelectiveScope&) = delete;

 private:
  friend class SelectiveRegion;
  friend void intercept_call(
      const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack*);
  SelectiveRegion* region_;
  PackSink* sink_;
  int64_t cursor_ = 0;  // recomputation: index of the next logged call
  std::optional<c10::impl::IncludeDispatchKeyGuard> include_;
};

/// RAII: remat's own tensor work (saved-tensor bookkeeping, checks) is not
/// seen by the region: while `active`, the selective key is excluded for the
/// guard's lifetime. Inactive it costs nothing (frames without a policy).
class SelectiveBypass {
 public:
  explicit SelectiveBypass(bool active = true);

 private:
  std::optional<c10::impl::ExcludeDispatchKeyGuard> exclude_;
};

/// The boxed fallback registered on compat::kSelectiveKey.
void intercept_call(
    const c10::OperatorHandle& op,
    c10::DispatchKeySet keys,
    torch::jit::Stack* stack);

}  // namespace remat::detail
