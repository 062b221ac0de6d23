// memory_meter.h — exact live and peak bytes of a device's tensor memory.
//
// CPU: remat installs a tracking allocator (c10::SetCPUAllocator) that wraps
// the original CPU allocator and counts every byte it hands out, including
// through Allocator::raw_allocate. It never changes what is allocated or where,
// so results are unchanged. CUDA: the caching allocator's "allocated bytes"
// statistics (current and peak).
//
// Semantics shared by every meter:
//  - Live bytes are process-wide for the device: every thread's allocations
//    count, whichever meter asks. Only memory allocated after the tracking
//    allocator was installed is counted (CPU); freeing older memory leaves
//    the counts untouched.
//  - Each meter has its own peak: several meters may be alive at once
//    (nested, or on different threads) and constructing or resetting one never
//    disturbs another's peak. On CUDA this holds as long as nobody outside
//    remat resets the caching allocator's peak statistics.
//  - Allocations on other threads that race with a meter's construction or
//    reset() may or may not be included in that meter's peak.
//
// Not supported: devices other than CPU and CUDA; CPU tensors made by an
// allocator other than the default one (for example pinned memory).
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>

namespace remat {
namespace detail {
class MeterBackend;  // one per device type; defined in memory_meter.cpp
}  // namespace detail

/// Installs remat's tracking CPU allocator if it is not installed yet.
///
/// Idempotent and thread-safe; MemoryMeter calls it, so calling it yourself is
/// only needed to start counting earlier. Call it early in main(), before other
/// threads allocate, since LibTorch's allocator registry itself is not
/// synchronized. Memory allocated before installation is never counted.
///
/// Example:
// clang-format off
///   int main() { remat::install_tracking_allocator(); ... }
// clang-format on
///
/// Throws c10::Error if another CPU allocator with a higher priority is
/// installed and keeps precedence.
void install_tracking_allocator();

/// True once install_tracking_allocator() has succeeded in this process.
bool tracking_allocator_installed();

/// Exact live and peak bytes of the tensor memory of one device.
///
/// Example (activation peak of a training step):
// clang-format off
///   remat::MemoryMeter meter;                 // CPU
///   auto loss = model->forward(x).sum();
///   loss.backward();
///   int64_t activation_peak = meter.peak_delta_bytes();
// clang-format on
///
/// Throws c10::Error if the device is neither CPU nor CUDA, or is CUDA while
/// remat was built without CUDA or no such GPU is present.
class MemoryMeter {
 public:
  /// Starts measuring now. For kCPU, installs the tracking allocator first.
  /// A CUDA device without an index means the current CUDA device.
  explicit MemoryMeter(c10::Device device = c10::kCPU);
  ~MemoryMeter();
  MemoryMeter(const MemoryMeter&) = delete;
  MemoryMeter& operator=(const MemoryMeter&) = delete;
  /// A moved-from meter may only be destroyed or assigned to.
  MemoryMeter(MemoryMeter&&) noexcept;
  MemoryMeter& operator=(MemoryMeter&&) noexcept;

  /// Live bytes of the device now (process-wide).
  int64_t current_bytes() const;
  /// Highest live bytes since construction or the last reset().
  int64_t peak_bytes() const;
  /// peak_bytes() minus the live bytes at construction or the last reset().
  /// What was live then (the input, parameters) is not in it, while the
  /// planner's peaks (planner::simulate) include the chain input: compare
  /// peak_delta_bytes() + the input's bytes with a prediction.
  int64_t peak_delta_bytes() const;
  /// Live bytes at construction or the last reset().
  int64_t baseline_bytes() const;
  /// Restarts the peak (and baseline) at the live bytes now.
  void reset();
  /// The device measured (with its index resolved for CUDA).
  c10::Device device() const;

 private:
  std::unique_ptr<detail::MeterBackend> impl_;
};

}  // namespace remat
