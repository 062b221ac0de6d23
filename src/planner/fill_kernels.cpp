// The kernels of fill_kernels.h. The inner loops have a fixed trip count, no
// early exit and no aliasing, so GCC vectorizes them; target_clones builds
// AVX-512 and AVX2 versions next to the baseline x86-64 (SSE2) one and picks
// at load time, so the library runs on any x86-64 (no -march=native). Each
// version evaluates the same float expression per element, in the same order,
// with no FMA (nothing is multiplied), so results are bit-identical across
// versions and to the scalar reference fill.
#include "fill_kernels.h"

#include <cstring>

namespace remat::planner::detail {

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define REMAT_PLANNER_KERNEL_CLONES \
  __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define REMAT_PLANNER_KERNEL_CLONES
#endif

namespace {

// Sixteen floats as one value (GCC/Clang vector extension): one AVX-512
// register, two AVX2 and four SSE registers in the other clones (on E5's
// 500-stage chain, on an AMD EPYC with AVX-512, the AVX-512 clone of 16
// lanes took 570-577 ms where the AVX2 clone of 8 took 600-620 ms).
typedef Time Lanes __attribute__((vector_size(16 * sizeof(Time))));
constexpr int64_t kLanes = 16;
static_assert(kChunk % kLanes == 0);

// One element: (constant_ms + first) + second, or constant_ms + first
// without a second subproblem.
template <bool kTwo>
inline Time option_value(Time constant_ms, Time first, Time second) {
  if constexpr (kTwo) {
    return (constant_ms + first) + second;
  } else {
    (void)second;
    return constant_ms + first;
  }
}

// best[i] = min(best[i], option(i)) for i in [k, k + kChunk), in vectors.
template <bool kTwo>
inline void min_plus_chunk(
    Time* best,
    int64_t k,
    const Lanes& constant_lanes,
    const Time* first,
    const Time* second) {
  for (int64_t i = k; i < k + kChunk; i += kLanes) {
    // The same expression as option_value, on kLanes slots at once.
    Lanes value;
    Lanes old;
    std::memcpy(&value, first + i, sizeof value);
    value = constant_lanes + value;
    if constexpr (kTwo) {
      Lanes more;
      std::memcpy(&more, second + i, sizeof more);
      value = value + more;
    }
    std::memcpy(&old, best + i, sizeof old);
    const Lanes out = value < old ? value : old;
    std::memcpy(best + i, &out, sizeof out);
  }
}

// best[k] = min(best[k], option(k)) over [0, count), kChunk slots at a time,
// stopping before a chunk whose first best is <= bound, and skipping a chunk
// whose first best is <= the option's time at the chunk's last slot (NOTE:
// [Chunks an option cannot win]). The last partial chunk is done as the full
// chunk ending at count: min is idempotent, so slots it updates twice end
// the same.
template <bool kTwo>
inline void bounded_min_plus(
    Time* best,
    int64_t count,
    Time bound,
    Time constant_ms,
    const Time* first,
    const Time* second) {
  Lanes constant_lanes;
  for (int64_t i = 0; i < kLanes; ++i) {
    constant_lanes[i] = constant_ms;
  }
  int64_t k = 0;
  for (; k + kChunk <= count; k += kChunk) {
    if (!(best[k] > bound)) {
      return;
    }
    const int64_t last = k + kChunk - 1;
    const Time least = option_value<kTwo>(
        constant_ms, first[last], kTwo ? second[last] : Time{});
    if (!(best[k] > least)) {
      continue;
    }
    min_plus_chunk<kTwo>(best, k, constant_lanes, first, second);
  }
  if (k == count || !(best[k] > bound)) {
    return;
  }
  if (count >= kChunk) {
    min_plus_chunk<kTwo>(best, count - kChunk, constant_lanes, first, second);
    return;
  }
  for (; k < count; ++k) {
    const Time value =
        option_value<kTwo>(constant_ms, first[k], kTwo ? second[k] : Time{});
    best[k] = value < best[k] ? value : best[k];
  }
}

}  // namespace

REMAT_PLANNER_KERNEL_CLONES
void min_plus_two(
    Time* best,
    int64_t count,
    Time bound,
    Time constant_ms,
    const Time* first,
    const Time* second) {
  bounded_min_plus<true>(best, count, bound, constant_ms, first, second);
}

REMAT_PLANNER_KERNEL_CLONES
void min_plus_one(
    Time* best,
    int64_t count,
    Time bound,
    Time constant_ms,
    const Time* first) {
  bounded_min_plus<false>(best, count, bound, constant_ms, first, nullptr);
}

}  // namespace remat::planner::detail
