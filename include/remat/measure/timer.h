// remat/measure/timer.h — the one clock of remat's benchmarks.
//
// CONTRACT (stable): Timer measures wall time in milliseconds with
// std::chrono::steady_clock, from construction or the last restart().
// process_cpu_ms() is the CPU time of the whole process (all threads), for
// measurements on a loaded machine where waiting for a core should not count.
// Neither synchronizes a GPU: a caller timing CUDA work calls synchronize()
// before starting and before reading the timer (Runner does).
#pragma once

#include <chrono>

#include <c10/core/Device.h>

namespace remat::measure {

/// Wall-clock stopwatch in milliseconds.
///
/// Example:
///   Timer timer;
///   work();
///   const double work_ms = timer.elapsed_ms();
class Timer {
 public:
  Timer() : start_(std::chrono::steady_clock::now()) {}
  /// Starts counting again from now.
  void restart() {
    start_ = std::chrono::steady_clock::now();
  }
  /// Milliseconds since construction or the last restart().
  double elapsed_ms() const {
    return std::chrono::duration<double, std::milli>(
               std::chrono::steady_clock::now() - start_)
        .count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

/// CPU time consumed by this process so far, all threads, in milliseconds
/// (CLOCK_PROCESS_CPUTIME_ID).
double process_cpu_ms();

/// Waits until the work queued on `device` has finished (a CUDA device);
/// returns at once for the CPU. The one device synchronization of remat's
/// measurements.
void synchronize(c10::Device device);

}  // namespace remat::measure
