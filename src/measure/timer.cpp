// timer.cpp — process_cpu_ms (POSIX) and synchronize.
#include "remat/measure/timer.h"

#include <ctime>

#include <torch/cuda.h>

namespace remat::measure {

double process_cpu_ms() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) * 1e3 +
         static_cast<double>(now.tv_nsec) / 1e6;
}

void synchronize(c10::Device device) {
  if (device.is_cuda()) {
    torch::cuda::synchronize(device.has_index() ? device.index() : -1);
  }
}

}  // namespace remat::measure
