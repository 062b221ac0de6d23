// memory_meter.cpp — the tracking CPU allocator and MemoryMeter.
//
// NOTE: [Tracking allocator]
// TrackingCpuAllocator wraps the CPU allocator that was current when it was
// installed. Every DataPtr it returns has context == data pointer and a static
// deleter, because Allocator::raw_allocate (used by some kernels) asserts that
// and frees through raw_deleter() with the bare pointer. The wrapped DataPtr
// and the size therefore live in a pointer-keyed map, split into shards with
// one mutex each so that threads rarely contend. Invariants:
//  - live_bytes == sum of the sizes in the map (updated under the shard lock
//    for the insert/erase, atomically for the counter).
//  - A pointer missing from the map was allocated before installation; its
//    free is forwarded to the wrapped allocator's raw deleter and not counted.
//  - Zero-byte allocations that return a null pointer are passed through.
// The state is a leaked singleton so that tensors freed during static
// destruction still find it.
//
// NOTE: [Independent peaks]
// Each live CPU meter owns a slot holding its peak. The allocation path adds
// to live_bytes and then raises (atomic max) the peak of every active slot,
// found through a 64-bit mask per block of 64 slots; blocks are appended and
// never freed, so the common case (one or two meters) costs one fetch_add, one
// mask load and one or two compare-exchanges. Frees only subtract.
// CUDA meters keep independence differently: the caching allocator has one
// peak per device, so before a meter resets it, the current device peak is
// folded into every other live meter of that device (see CudaMeter).

#include <remat/memory_meter.h>

#include "compat/compat.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace remat {
namespace {

void atomic_max(std::atomic<int64_t>& target, int64_t value) {
  int64_t seen = target.load(std::memory_order_relaxed);
  while (seen < value && !target.compare_exchange_weak(seen, value)) {
  }
}

// ---- peak slots (NOTE: [Independent peaks]) --------------------------------

constexpr int kSlotsPerBlock = 64;

struct SlotBlock {
  std::array<std::atomic<int64_t>, kSlotsPerBlock> peak_bytes{};
  std::atomic<uint64_t> claimed_mask{0};  // slot owned by a meter
  std::atomic<uint64_t> active_mask{0};   // slot updated by allocations
  std::atomic<SlotBlock*> next{nullptr};
};

struct SlotRef {
  SlotBlock* block = nullptr;
  int index = 0;
  std::atomic<int64_t>& peak() const {
    return block->peak_bytes[index];
  }
};

// ---- tracking allocator state (NOTE: [Tracking allocator]) ------------------

constexpr size_t kShardCount = 64;

struct Allocation {
  size_t size_bytes;
  c10::DataPtr original;
};

struct Shard {
  std::mutex mutex;
  std::unordered_map<void*, Allocation> allocations;
};

struct TrackingState {
  std::atomic<int64_t> live_bytes{0};
  SlotBlock first_block;
  std::array<Shard, kShardCount> shards;
  c10::DeleterFnPtr wrapped_raw_deleter = nullptr;

  Shard& shard_for(void* ptr) {
    // Allocations are at least 16-byte aligned; mix the higher bits.
    auto key = reinterpret_cast<uintptr_t>(ptr) >> 4;
    key ^= key >> 7;
    return shards[(key * 0x9E3779B97F4A7C15ull) >> 58];  // top 6 bits
  }

  void add(int64_t size_bytes) {
    const int64_t live = live_bytes.fetch_add(size_bytes) + size_bytes;
    for (SlotBlock* block = &first_block; block != nullptr;
         block = block->next.load()) {
      uint64_t mask = block->active_mask.load();
      while (mask != 0) {
        const int index = __builtin_ctzll(mask);
        mask &= mask - 1;
        atomic_max(block->peak_bytes[index], live);
      }
    }
  }

  // Claims a free slot, starts its peak now and reports the live bytes then.
  SlotRef claim_slot(int64_t* baseline_bytes) {
    SlotBlock* block = &first_block;
    while (true) {
      uint64_t claimed = block->claimed_mask.load();
      while (~claimed != 0) {
        const int index = __builtin_ctzll(~claimed);
        const uint64_t bit = uint64_t{1} << index;
        if (block->claimed_mask.compare_exchange_weak(claimed, claimed | bit)) {
          SlotRef slot{block, index};
          *baseline_bytes = start_slot(slot);
          block->active_mask.fetch_or(bit);
          atomic_max(slot.peak(), live_bytes.load());
          return slot;
        }
      }
      SlotBlock* next = block->next.load();
      if (next == nullptr) {
        auto* fresh = new SlotBlock();  // never freed: see NOTE above
        if (block->next.compare_exchange_strong(next, fresh)) {
          next = fresh;
        } else {
          delete fresh;  // another thread appended first; `next` holds it
        }
      }
      block = next;
    }
  }

  // Restarts the slot's peak at the live bytes now and returns them.
  int64_t start_slot(const SlotRef& slot) {
    const int64_t live = live_bytes.load();
    slot.peak().store(live);
    return live;
  }

  void release_slot(const SlotRef& slot) {
    const uint64_t bit = uint64_t{1} << slot.index;
    slot.block->active_mask.fetch_and(~bit);
    slot.block->claimed_mask.fetch_and(~bit);
  }
};

TrackingState& state() {
  static auto* instance = new TrackingState();  // leaked on purpose
  return *instance;
}

void free_tracked(void* ptr) {
  if (ptr == nullptr) {
    return;
  }
  TrackingState& tracking = state();
  Shard& shard = tracking.shard_for(ptr);
  c10::DataPtr original;
  bool found = false;
  {
    std::lock_guard<std::mutex> lock(shard.mutex);
    auto it = shard.allocations.find(ptr);
    if (it != shard.allocations.end()) {
      tracking.live_bytes.fetch_sub(
          static_cast<int64_t>(it->second.size_bytes));
      original = std::move(it->second.original);
      shard.allocations.erase(it);
      found = true;
    }
  }
  if (!found) {
    // Raw-allocated before installation: the wrapped allocator owns it.
    if (tracking.wrapped_raw_deleter != nullptr) {
      tracking.wrapped_raw_deleter(ptr);
    }
    return;
  }
  // `original` frees the memory here, outside the shard lock.
}

class TrackingCpuAllocator final : public compat::WrappingAllocator {
 public:
  using compat::WrappingAllocator::WrappingAllocator;

  c10::DeleterFnPtr raw_deleter() const override {
    return &free_tracked;
  }

 protected:
  c10::DataPtr allocate_bytes(size_t nbytes) const override {
    c10::DataPtr original = wrapped()->allocate(nbytes);
    void* data = original.get();
    if (data == nullptr) {
      return original;
    }
    const c10::Device device = original.device();
    TrackingState& tracking = state();
    Shard& shard = tracking.shard_for(data);
    {
      std::lock_guard<std::mutex> lock(shard.mutex);
      const bool inserted =
          shard.allocations
              .emplace(data, Allocation{nbytes, std::move(original)})
              .second;
      TORCH_INTERNAL_ASSERT(
          inserted, "remat tracking allocator: pointer handed out twice");
    }
    tracking.add(static_cast<int64_t>(nbytes));
    return {data, data, &free_tracked, device};
  }
};

std::atomic<bool> g_installed{false};

}  // namespace

void install_tracking_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    c10::Allocator* current = c10::GetCPUAllocator();
    TORCH_CHECK(
        current != nullptr,
        "remat::install_tracking_allocator: expected a CPU allocator to wrap, "
        "got none");
    static auto* tracker = new TrackingCpuAllocator(current);  // static life
    state().wrapped_raw_deleter = current->raw_deleter();
    c10::SetCPUAllocator(tracker, /*priority=*/UINT8_MAX);
    TORCH_CHECK(
        c10::GetCPUAllocator() == tracker,
        "remat::install_tracking_allocator: expected the tracking allocator to "
        "become the CPU allocator, got another one with a higher priority");
    g_installed.store(true);
  });
  TORCH_CHECK(
      g_installed.load(),
      "remat::install_tracking_allocator: expected the tracking allocator to "
      "be installed, got a failed earlier installation");
}

bool tracking_allocator_installed() {
  return g_installed.load();
}

/// What a MemoryMeter measures with: one backend per device type.
class detail::MeterBackend {
 public:
  explicit MeterBackend(c10::Device device) : device_(device) {}
  virtual ~MeterBackend() = default;
  virtual int64_t current_bytes() const = 0;
  virtual int64_t peak_bytes() const = 0;
  virtual void reset() = 0;
  int64_t baseline_bytes() const {
    return baseline_bytes_;
  }
  c10::Device device() const {
    return device_;
  }

 protected:
  c10::Device device_;
  int64_t baseline_bytes_ = 0;
};

namespace {

class CpuMeter final : public detail::MeterBackend {
 public:
  CpuMeter() : MeterBackend(c10::Device(c10::kCPU)) {
    install_tracking_allocator();
    slot_ = state().claim_slot(&baseline_bytes_);
  }
  ~CpuMeter() override {
    state().release_slot(slot_);
  }
  int64_t current_bytes() const override {
    return state().live_bytes.load();
  }
  int64_t peak_bytes() const override {
    return slot_.peak().load();
  }
  void reset() override {
    baseline_bytes_ = state().start_slot(slot_);
  }

 private:
  SlotRef slot_;
};

#if REMAT_HAS_CUDA
class CudaMeter;

// Registry of live CUDA meters per device (NOTE: [Independent peaks]).
struct CudaRegistry {
  std::mutex mutex;
  std::vector<CudaMeter*> meters;
};

CudaRegistry& cuda_registry() {
  static auto* instance = new CudaRegistry();  // leaked on purpose
  return *instance;
}

class CudaMeter final : public detail::MeterBackend {
 public:
  explicit CudaMeter(c10::Device device) : MeterBackend(device) {
    CudaRegistry& registry = cuda_registry();
    std::lock_guard<std::mutex> lock(registry.mutex);
    restart_locked(registry);
    registry.meters.push_back(this);
  }
  ~CudaMeter() override {
    CudaRegistry& registry = cuda_registry();
    std::lock_guard<std::mutex> lock(registry.mutex);
    auto& meters = registry.meters;
    meters.erase(std::remove(meters.begin(), meters.end(), this), meters.end());
  }
  int64_t current_bytes() const override {
    return compat::cuda_allocated_bytes(device_.index()).current_bytes;
  }
  int64_t peak_bytes() const override {
    CudaRegistry& registry = cuda_registry();
    std::lock_guard<std::mutex> lock(registry.mutex);
    return std::max(
        folded_peak_bytes_,
        compat::cuda_allocated_bytes(device_.index()).peak_bytes);
  }
  void reset() override {
    CudaRegistry& registry = cuda_registry();
    std::lock_guard<std::mutex> lock(registry.mutex);
    restart_locked(registry);
  }

 private:
  // Folds the device peak into the other meters, then restarts it here.
  void restart_locked(CudaRegistry& registry) {
    const c10::DeviceIndex index = device_.index();
    const int64_t device_peak = compat::cuda_allocated_bytes(index).peak_bytes;
    for (CudaMeter* other : registry.meters) {
      if (other != this && other->device_.index() == index) {
        other->folded_peak_bytes_ =
            std::max(other->folded_peak_bytes_, device_peak);
      }
    }
    compat::cuda_reset_peak(index);
    baseline_bytes_ = compat::cuda_allocated_bytes(index).current_bytes;
    folded_peak_bytes_ = baseline_bytes_;
  }

  int64_t folded_peak_bytes_ = 0;  // peak before later resets by other meters
};
#endif

std::unique_ptr<detail::MeterBackend> make_meter(c10::Device device) {
  if (device.is_cpu()) {
    return std::make_unique<CpuMeter>();
  }
  TORCH_CHECK(
      device.is_cuda(),
      "remat::MemoryMeter: expected a CPU or CUDA device, got ",
      device);
#if REMAT_HAS_CUDA
  const int64_t count = compat::cuda_device_count();
  TORCH_CHECK(
      count > 0,
      "remat::MemoryMeter: expected a CUDA GPU for device ",
      device,
      ", got none");
  const c10::DeviceIndex index =
      device.has_index() ? device.index() : compat::cuda_current_device();
  TORCH_CHECK(
      index >= 0 && index < count,
      "remat::MemoryMeter: expected a CUDA device index in [0, ",
      count,
      "), got ",
      device);
  return std::make_unique<CudaMeter>(c10::Device(c10::kCUDA, index));
#else
  TORCH_CHECK(
      false,
      "remat::MemoryMeter: expected remat built against a CUDA LibTorch to "
      "measure ",
      device,
      ", got a build without CUDA support");
#endif
}

}  // namespace

MemoryMeter::MemoryMeter(c10::Device device) : impl_(make_meter(device)) {}
MemoryMeter::~MemoryMeter() = default;
MemoryMeter::MemoryMeter(MemoryMeter&&) noexcept = default;
MemoryMeter& MemoryMeter::operator=(MemoryMeter&&) noexcept = default;

int64_t MemoryMeter::current_bytes() const {
  return impl_->current_bytes();
}

int64_t MemoryMeter::peak_bytes() const {
  return impl_->peak_bytes();
}

int64_t MemoryMeter::peak_delta_bytes() const {
  return impl_->peak_bytes() - impl_->baseline_bytes();
}

int64_t MemoryMeter::baseline_bytes() const {
  return impl_->baseline_bytes();
}

void MemoryMeter::reset() {
  impl_->reset();
}

c10::Device MemoryMeter::device() const {
  return impl_->device();
}

}  // namespace remat
