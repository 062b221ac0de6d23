// remat/dynamic.h: dynamic rematerialization, a byte budget on the tensors
// autograd saves, with no stages and no plan.
//
// Inside a `DynamicRemat` scope, any code may run: loops whose length depends
// on the data, branches, inputs of any shape. Every operator called with grad
// mode on is recorded with its arguments (and the RNG state, for operators
// that draw random numbers), and every tensor autograd saves for backward is
// tracked with the call that produced it. When the tracked bytes exceed the
// budget, saved tensors that nothing else holds are evicted (freed), chosen
// by cost / (bytes x staleness); backward recomputes an evicted tensor from
// its recipe when it needs it, recursively, and frees each saved tensor once
// backward no longer needs it. Gradients are bitwise equal to a plain run on
// CPU, dropout included when it draws from LibTorch's default generator and
// no other thread draws from it meanwhile (remat/checkpoint.h says why). How
// it works: docs/dynamic.md.
//
// What counts: the tracked bytes are the bytes of the storages of saved
// tensors that were produced inside the scope and that remat holds. Tensors
// your own code still holds (the activation a forward is working on) cannot
// be freed by an eviction and are evicted once you drop them; so the measured
// peak may exceed the budget by what your code holds at a time (one block's
// working set in a typical forward), and a recomputation in backward adds the
// inputs of the operator being re-run while it runs.
//
// Not tracked (saved as they are, never evicted, not counted against the
// budget, reported by DynamicRematStats::untracked_saved_tensors): tensors
// made before the scope (parameters, inputs) and views of them (a transposed
// weight), tensors made with grad mode off or by custom autograd
// functions, outputs of calls whose arguments cannot be recorded (lists of
// optional tensors, objects), saved views of a storage with no recorded
// tensor of their dtype at their version (one written by an unrecorded call),
// and, from the write on, tensors on a storage written where its version
// counters cannot see (unsafe_chunk's chunks written in place, as LibTorch's
// CPU LSTM and GRU cells do; rrelu's noise).
//
// retain_graph works: a saved tensor is freed when autograd frees it.
//
// In-place writes and views are replayed, not refused: a view is recomputed by
// re-running the view operator on its recomputed base, and a tensor written in
// place by re-running the writes on a fresh recomputation of what they wrote
// to (version counters tell which recorded state a tensor is in). Writing a
// saved tensor in place is refused at backward, as plain autograd refuses it.
// A tensor the scope does not track (made outside it, or by a call it does
// not record, such as index with a list of tensors) that a recorded call used
// and that is written in place afterwards (not by that call) makes that
// call's recomputation throw c10::Error naming the operator; backward at a
// budget that evicts nothing never recomputes. A write through an
// alias that has no version counter in common (Tensor::variable_data(), or
// a tensor's .data in Python terms) is invisible to that check, as it is to
// autograd's: a recomputation gives the value before such a write, where the
// plain run would use the value after it, so do not write activations so.
//
// Not supported (refused when the scope opens): a second scope on the same
// thread while one is open, opening a scope inside a checkpoint region or
// under other saved-tensor hooks, and autocast. A checkpoint region inside the
// scope is fine: its own hooks take the tensors it saves.
#pragma once

#include <cstdint>
#include <memory>

#include <torch/arg.h>

namespace remat {
namespace detail {
class DynamicRuntime;
class DynamicScopeState;
}  // namespace detail

/// Options of a DynamicRemat scope.
struct DynamicRematOptions {
  /// The most bytes of saved activations kept in memory at a time. Must be
  /// positive. Default: 0, which is rejected: set it.
  TORCH_ARG(int64_t, budget_bytes) = 0;
};

/// What a DynamicRemat scope did so far (forward and backward).
struct DynamicRematStats {
  int64_t tracked_bytes = 0;       // bytes of tracked saved tensors held now
  int64_t tracked_peak_bytes = 0;  // the highest tracked_bytes so far
  int64_t evictions = 0;           // storages freed to stay within the budget
  int64_t rematerializations = 0;  // recorded calls re-run in backward
  int64_t recorded_calls = 0;      // operator calls recorded in the forward
  int64_t saved_tensors = 0;       // tensors autograd saved in the scope
  int64_t untracked_saved_tensors = 0;  // of them, saved as they are
  /// The most bytes one recorded call has saved so far: the least
  /// budget_bytes the code run so far works with (below it, that call
  /// throws).
  int64_t largest_call_bytes = 0;
};

/// RAII scope: while it is alive on this thread, the activations autograd
/// saves are evicted down to a byte budget whenever they exceed it (what
/// cannot be evicted yet still counts: see "What counts" above, so
/// tracked_peak_bytes may end above the budget); backward recomputes what was
/// evicted.
///
/// Example:
// clang-format off
///   {
///     remat::DynamicRemat scope(
///         remat::DynamicRematOptions().budget_bytes(512ll << 20));
///     auto loss = model->forward(x);   // any code: loops, branches, shapes
///     loss.backward();                 // evicted tensors are recomputed
///     std::cout << scope.stats().evictions << " evictions\n";
///   }
// clang-format on
///
/// Backward may also run after the scope has ended: what was saved inside
/// stays valid and keeps to the budget.
/// Throws c10::Error if `options.budget_bytes()` is not positive (naming the
/// value), if another DynamicRemat scope is open on this thread, if a
/// checkpoint region or other saved-tensor hooks are active, if autocast is
/// enabled, or if another autograd engine is installed (see install_engine).
/// While the scope is alive, an operator whose own saved tensors exceed the
/// budget throws c10::Error naming the operator, the budget and the bytes it
/// needs; nothing is tracked for that call and the scope stays usable.
/// REQUIRES: scopes on one thread are destroyed in reverse order of
/// construction with other remat guards (SavedTensorHooks, AutocastGuard).
class DynamicRemat {
 public:
  explicit DynamicRemat(DynamicRematOptions options);
  ~DynamicRemat();
  DynamicRemat(const DynamicRemat&) = delete;
  DynamicRemat& operator=(const DynamicRemat&) = delete;

  /// The counters so far, backward included.
  DynamicRematStats stats() const;
  const DynamicRematOptions& options() const;

 private:
  DynamicRematOptions options_;
  std::shared_ptr<detail::DynamicRuntime> runtime_;
  std::unique_ptr<detail::DynamicScopeState> state_;
};

}  // namespace remat
