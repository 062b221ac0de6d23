// timer.cpp — process_cpu_ms (POSIX).
#include "remat/measure/timer.h"

#include <ctime>

namespace remat::measure {

double process_cpu_ms() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) * 1e3 +
         static_cast<double>(now.tv_nsec) / 1e6;
}

}  // namespace remat::measure
