// cpu_memory.cpp — keep_freed_cpu_memory (remat/measure/cpu_memory.h).
#include "remat/measure/cpu_memory.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <cstdint>

namespace remat::measure {
namespace {

// The settings, in bytes: one definition for mallopt and for GLIBC_TUNABLES.
constexpr int64_t kMmapThreshold = int64_t{1} << 30;
constexpr int64_t kTrimThreshold = int64_t{1} << 30;
constexpr int64_t kTopPad = int64_t{256} << 20;

}  // namespace

bool keep_freed_cpu_memory() {
#if defined(__GLIBC__)
  // mallopt returns 1 on success, 0 on error; every setting is tried.
  const int mmap = mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMmapThreshold));
  const int trim = mallopt(M_TRIM_THRESHOLD, static_cast<int>(kTrimThreshold));
  const int pad = mallopt(M_TOP_PAD, static_cast<int>(kTopPad));
  return mmap == 1 && trim == 1 && pad == 1;
#else
  return false;
#endif
}

std::string keep_freed_cpu_memory_tunables() {
  return "glibc.malloc.mmap_threshold=" + std::to_string(kMmapThreshold) +
         ":glibc.malloc.trim_threshold=" + std::to_string(kTrimThreshold) +
         ":glibc.malloc.top_pad=" + std::to_string(kTopPad);
}

}  // namespace remat::measure
