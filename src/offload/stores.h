// stores.h (private): the bookkeeping shared by SaveOnCpu and SaveToFile,
// and the interface of the stores they move tensors to.
//
// NOTE: [Offload bookkeeping]
// The Offloader decides which saved tensors move (not parameters, not small
// ones, only what the store handles; each distinct tensor once, see
// pack_cache.h) and numbers the moved ones in the order they were saved.
// Backward unpacks roughly in reverse order, so when the tensor numbered k is
// unpacked, the Offloader starts its fetch if no prefetch did, and then keeps
// up to `prefetch` further fetches in flight: the pending tensors numbered
// just below k, largest first. A fetched tensor stays with its entry until
// autograd releases the entry (a tensor saved twice is read once). The store
// does the moving: put() starts moving a tensor out, fetch() starts bringing
// it back, take() waits for the fetch and hands the tensor over.
#pragma once

#include <any>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include <ATen/core/Tensor.h>

#include "pack_cache.h"
#include "remat/offload.h"

namespace remat::detail {

/// Where one moved tensor is; each store derives its own.
class OffloadSlot {
 public:
  virtual ~OffloadSlot() = default;
};

/// Moves tensors out and back. put() runs on the saving thread; fetch(),
/// take() and release() may run on any thread, and each store locks what it
/// shares between them.
class OffloadStore {
 public:
  virtual ~OffloadStore() = default;
  /// Whether this store moves tensors like `tensor` (by device or layout).
  virtual bool moves(const at::Tensor& tensor) const = 0;
  /// Starts moving `tensor` out; may wait for room.
  virtual std::shared_ptr<OffloadSlot> put(const at::Tensor& tensor) = 0;
  /// Starts bringing the slot's tensor back. Called once before each take().
  virtual void fetch(OffloadSlot& slot) = 0;
  /// Waits for the fetch and returns the tensor, ready to use on the calling
  /// thread (and its current stream). Throws if it cannot be read back.
  virtual at::Tensor take(OffloadSlot& slot) = 0;
  /// The slot's last user is gone: its space may be reused.
  virtual void release(OffloadSlot& /*slot*/) {}
  /// Adds the store's own counts (file size, failures) to `stats`.
  virtual void add_stats(OffloadStats& /*stats*/) const {}
};

/// Packs and unpacks saved tensors through a store (NOTE above). Shared by
/// the guard and by every moved tensor, so it outlives the guard as long as
/// autograd holds what it moved.
class Offloader : public std::enable_shared_from_this<Offloader> {
 public:
  /// `who` names the guard in errors ("remat::SaveToFile").
  Offloader(
      const char* who,
      std::unique_ptr<OffloadStore> store,
      int64_t prefetch,
      int64_t min_bytes);

  /// The pack hook: the tensor itself, or the entry of its moved copy.
  std::any pack(const at::Tensor& tensor);
  /// The unpack hook.
  static at::Tensor unpack(const std::any& packed);

  OffloadStats stats() const;
  /// Save numbers (0 = first moved tensor) in the order their fetches began.
  std::vector<int64_t> fetch_order() const;

 private:
  struct Moved;
  /// A saved tensor left where it is.
  struct Kept {
    at::Tensor tensor;
    SavedVersion version;  // NOTE: [A saved tensor modified in place]
    const char* who;
  };

  std::shared_ptr<Moved> move_out(const at::Tensor& tensor);
  at::Tensor bring_back(Moved& moved);
  /// Starts the fetch of `moved`; mutex_ held.
  void start_fetch(Moved& moved);
  /// Keeps `prefetch_` fetches in flight below save number `below`, adding
  /// the entries it starts to `started`; mutex_ held.
  void prefetch_below(
      int64_t below, std::vector<std::shared_ptr<Moved>>& started);
  void forget(Moved& moved);

  const char* const name_;
  const std::unique_ptr<OffloadStore> store_;
  const int64_t prefetch_;
  const int64_t min_bytes_;
  PackCache<Moved> cache_;  // saving thread only

  mutable std::mutex mutex_;  // guards everything below
  std::condition_variable handed_over_;
  int64_t next_number_ = 0;
  std::map<int64_t, std::weak_ptr<Moved>> pending_;  // moved, not fetched
  std::set<int64_t> in_flight_;                      // fetched, not taken
  std::vector<int64_t> fetch_order_;
  OffloadStats stats_;
};

/// The hooks of a guard that packs through `offloader`.
std::unique_ptr<SavedTensorHooks> offload_hooks(
    std::shared_ptr<Offloader> offloader);

/// Throws unless `value` >= 0, naming the guard and the option.
void check_not_negative(const char* guard, const char* option, int64_t value);

}  // namespace remat::detail
