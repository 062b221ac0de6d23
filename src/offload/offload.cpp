// offload.cpp: the Offloader (NOTE: [Offload bookkeeping] in stores.h) and
// SaveOnCpu, whose store copies CUDA tensors to host memory on a side stream.
#include "stores.h"

#include <thread>
#include <unordered_map>
#include <utility>

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

namespace remat {
namespace detail {

/// One moved tensor, shared by the saved variables that saved it.
struct Offloader::Moved {
  std::shared_ptr<Offloader> owner;
  std::shared_ptr<OffloadSlot> slot;
  SavedVersion version;  // NOTE: [A saved tensor modified in place]
  int64_t number = 0;
  // Guarded by owner->mutex_:
  bool fetch_started = false;
  bool taking = false;  // a thread is in take()
  at::Tensor back;      // the tensor, once fetched, until released

  ~Moved() {
    if (owner) {
      owner->forget(*this);
    }
  }
};

Offloader::Offloader(
    const char* who,
    std::unique_ptr<OffloadStore> store,
    int64_t prefetch,
    int64_t min_bytes)
    : name_(who),
      store_(std::move(store)),
      prefetch_(prefetch),
      min_bytes_(min_bytes) {}

std::any Offloader::pack(const at::Tensor& tensor) {
  const bool moves = tensor.defined() && !is_parameter_like(tensor) &&
                     !repeats_elements(tensor) &&
                     static_cast<int64_t>(tensor.nbytes()) >= min_bytes_ &&
                     store_->moves(tensor);
  if (!moves) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.tensors_left;
    // Detached: an output saved by its own node must not hold that node (a
    // reference cycle that leaks the graph if backward never runs).
    return Kept{tensor.detach(), SavedVersion(tensor), name_};
  }
  return cache_.find_or_make(
      tensor, [this](const at::Tensor& t) { return move_out(t); });
}

std::shared_ptr<Offloader::Moved> Offloader::move_out(
    const at::Tensor& tensor) {
  auto moved = std::make_shared<Moved>();
  moved->version = SavedVersion(tensor);
  // Detached, as Kept: the store may hold it (until written, or for good).
  moved->slot = store_->put(tensor.detach());  // may wait: no lock held
  moved->owner = shared_from_this();
  std::lock_guard<std::mutex> lock(mutex_);
  moved->number = next_number_++;
  pending_.emplace(moved->number, moved);
  ++stats_.tensors_moved;
  stats_.bytes_moved += static_cast<int64_t>(tensor.nbytes());
  return moved;
}

at::Tensor Offloader::unpack(const std::any& packed) {
  if (const auto* kept = std::any_cast<Kept>(&packed)) {
    kept->version.check(kept->who);
    return kept->tensor;
  }
  const auto& moved = std::any_cast<const std::shared_ptr<Moved>&>(packed);
  moved->version.check(moved->owner->name_);
  return moved->owner->bring_back(*moved);
}

at::Tensor Offloader::bring_back(Moved& moved) {
  // Entries prefetch_below() holds; released after the lock (their
  // destructors lock it).
  std::vector<std::shared_ptr<Moved>> prefetched;
  std::unique_lock<std::mutex> lock(mutex_);
  handed_over_.wait(lock, [&moved] { return !moved.taking; });
  if (moved.back.defined()) {
    return moved.back;
  }
  if (moved.fetch_started) {
    ++stats_.prefetch_hits;
  } else {
    start_fetch(moved);
  }
  prefetch_below(moved.number, prefetched);
  moved.taking = true;
  lock.unlock();
  at::Tensor tensor;
  try {
    tensor = store_->take(*moved.slot);
  } catch (...) {
    lock.lock();
    moved.taking = false;
    moved.fetch_started = false;
    in_flight_.erase(moved.number);
    handed_over_.notify_all();
    throw;
  }
  lock.lock();
  moved.back = tensor;
  moved.taking = false;
  in_flight_.erase(moved.number);
  handed_over_.notify_all();
  return tensor;
}

void Offloader::start_fetch(Moved& moved) {
  store_->fetch(*moved.slot);
  moved.fetch_started = true;
  pending_.erase(moved.number);
  in_flight_.insert(moved.number);
  fetch_order_.push_back(moved.number);
  ++stats_.fetches;
}

void Offloader::prefetch_below(
    int64_t below, std::vector<std::shared_ptr<Moved>>& started) {
  auto ahead = [&] {
    return static_cast<int64_t>(
        std::distance(in_flight_.begin(), in_flight_.lower_bound(below)));
  };
  while (ahead() < prefetch_) {
    auto next = pending_.lower_bound(below);
    if (next == pending_.begin()) {
      return;  // nothing saved earlier is still out
    }
    --next;
    std::shared_ptr<Moved> moved = next->second.lock();
    if (!moved) {
      pending_.erase(next);  // its destructor is waiting for the lock
      continue;
    }
    start_fetch(*moved);
    started.push_back(std::move(moved));
  }
}

void Offloader::forget(Moved& moved) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.erase(moved.number);
    in_flight_.erase(moved.number);
  }
  store_->release(*moved.slot);
}

OffloadStats Offloader::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  OffloadStats stats = stats_;
  store_->add_stats(stats);
  return stats;
}

std::vector<int64_t> Offloader::fetch_order() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return fetch_order_;
}

std::unique_ptr<SavedTensorHooks> offload_hooks(
    std::shared_ptr<Offloader> offloader) {
  return std::make_unique<SavedTensorHooks>(
      [offloader](const at::Tensor& tensor) { return offloader->pack(tensor); },
      &Offloader::unpack);
}

void check_not_negative(const char* guard, const char* option, int64_t value) {
  TORCH_CHECK(
      value >= 0,
      "remat::",
      guard,
      ": expected ",
      option,
      " >= 0, got ",
      value);
}

namespace {

/// A CUDA tensor's copy in host memory, and its way back.
class HostSlot final : public OffloadSlot {
 public:
  HostSlot(c10::Device device, c10::Stream side)
      : device(device),
        side(side),
        copied(device.type()),
        fetched(device.type()) {}

  ~HostSlot() override {
    // The host buffer must outlive the copies in flight from and into it.
    while (!copied.query() || !fetched.query()) {
      std::this_thread::yield();
    }
  }

  c10::Device device;
  c10::Stream side;    // both copies run here, in order
  at::Tensor host;     // the copy
  at::Tensor back;     // on the device again, from fetch() until take()
  c10::Event copied;   // device -> host done
  c10::Event fetched;  // host -> device done
};

/// SaveOnCpu's store: CUDA tensors to host memory and back on one side
/// stream per device, so both copies overlap the compute on the current
/// stream. Uses LibTorch's device-generic stream interface only, so it
/// compiles against every LibTorch and runs wherever CUDA is registered.
class HostStore final : public OffloadStore {
 public:
  explicit HostStore(bool pin_memory) : pin_memory_(pin_memory) {}

  bool moves(const at::Tensor& tensor) const override {
    return tensor.is_cuda() && tensor.layout() == at::kStrided;
  }

  std::shared_ptr<OffloadSlot> put(const at::Tensor& tensor) override {
    const c10::Device device = tensor.device();
    c10::impl::VirtualGuardImpl guard_impl(device.type());
    const c10::Stream current = guard_impl.getStream(device);
    auto slot = std::make_shared<HostSlot>(device, side_stream(device));
    // A non-dense tensor is copied densely; a dense one keeps its strides.
    const at::Tensor dense =
        tensor.is_non_overlapping_and_dense() ? tensor : tensor.contiguous();
    slot->host = at::empty_strided(
        dense.sizes(),
        dense.strides(),
        dense.options().device(at::kCPU).pinned_memory(pin_memory_));
    c10::Event produced(device.type());
    produced.record(current);    // the side stream waits for the tensor's
    produced.block(slot->side);  // producer on the current stream
    {
      c10::StreamGuard on_side(slot->side);
      slot->host.copy_(dense, /*non_blocking=*/pin_memory_);
    }
    // The caching allocator must not hand the device memory out again
    // before the side stream has read it.
    guard_impl.recordDataPtrOnStream(dense.storage().data_ptr(), slot->side);
    slot->copied.record(slot->side);
    return slot;
  }

  void fetch(OffloadSlot& base) override {
    auto& slot = static_cast<HostSlot&>(base);
    c10::StreamGuard on_side(slot.side);
    slot.back = at::empty_strided(
        slot.host.sizes(),
        slot.host.strides(),
        slot.host.options().device(slot.device).pinned_memory(false));
    slot.back.copy_(slot.host, /*non_blocking=*/pin_memory_);
    slot.fetched.record(slot.side);
  }

  at::Tensor take(OffloadSlot& base) override {
    auto& slot = static_cast<HostSlot&>(base);
    c10::impl::VirtualGuardImpl guard_impl(slot.device.type());
    const c10::Stream current = guard_impl.getStream(slot.device);
    slot.fetched.block(current);
    // Made on the side stream, used (and freed) on the current one.
    guard_impl.recordDataPtrOnStream(slot.back.storage().data_ptr(), current);
    return std::exchange(slot.back, at::Tensor());
  }

 private:
  c10::Stream side_stream(c10::Device device) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = side_streams_.find(device.index());
    if (found == side_streams_.end()) {
      c10::impl::VirtualGuardImpl guard_impl(device.type());
      found =
          side_streams_
              .emplace(
                  device.index(), guard_impl.getStreamFromGlobalPool(device))
              .first;
    }
    return found->second;
  }

  const bool pin_memory_;
  std::mutex mutex_;
  std::unordered_map<c10::DeviceIndex, c10::Stream> side_streams_;
};

}  // namespace
}  // namespace detail

SaveOnCpu::SaveOnCpu(SaveOnCpuOptions options) {
  detail::check_not_negative("SaveOnCpu", "prefetch", options.prefetch());
  detail::check_not_negative("SaveOnCpu", "min_bytes", options.min_bytes());
  offloader_ = std::make_shared<detail::Offloader>(
      "remat::SaveOnCpu",
      std::make_unique<detail::HostStore>(options.pin_memory()),
      options.prefetch(),
      options.min_bytes());
  hooks_ = detail::offload_hooks(offloader_);
}

SaveOnCpu::~SaveOnCpu() = default;

OffloadStats SaveOnCpu::stats() const {
  return offloader_->stats();
}

}  // namespace remat
