// min_plus_piece (fill_kernels.h). The loops have no early exit and no
// aliasing, so GCC vectorizes them; target_clones builds an AVX2 version next
// to the baseline x86-64 (SSE2) one and picks at load time, so the library
// runs on any x86-64 (no -march=native). Each version evaluates the same
// double expression per element, in the same order, with no FMA (the AVX2
// clone does not enable it), so results are bit-identical across versions.
#include "fill_kernels.h"

namespace remat::planner::detail {

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define REMAT_PLANNER_KERNEL_CLONES \
  __attribute__((target_clones("avx2", "default")))
#else
#define REMAT_PLANNER_KERNEL_CLONES
#endif

namespace {

// The loop for one pair of accessors; inlined into each clone.
template <typename First, typename Second>
inline void min_plus_loop(
    double* __restrict best,
    int64_t count,
    double constant_ms,
    First first,
    Second second) {
  for (int64_t k = 0; k < count; ++k) {
    const double value = (constant_ms + first(k)) + second(k);
    best[k] = value < best[k] ? value : best[k];
  }
}

}  // namespace

REMAT_PLANNER_KERNEL_CLONES
void min_plus_piece(
    double* best,
    int64_t count,
    double constant_ms,
    const PieceTimes& first,
    const PieceTimes& second) {
  const double* __restrict first_times = first.times;
  const double* __restrict second_times = second.times;
  const double first_ms = first.plateau_ms;
  const double second_ms = second.plateau_ms;
  const auto stored_first = [first_times](int64_t k) { return first_times[k]; };
  const auto stored_second = [second_times](int64_t k) {
    return second_times[k];
  };
  const auto plateau_first = [first_ms](int64_t) { return first_ms; };
  const auto plateau_second = [second_ms](int64_t) { return second_ms; };
  if (first_times != nullptr && second_times != nullptr) {
    min_plus_loop(best, count, constant_ms, stored_first, stored_second);
  } else if (first_times != nullptr) {
    min_plus_loop(best, count, constant_ms, stored_first, plateau_second);
  } else if (second_times != nullptr) {
    min_plus_loop(best, count, constant_ms, plateau_first, stored_second);
  } else {
    min_plus_loop(best, count, constant_ms, plateau_first, plateau_second);
  }
}

}  // namespace remat::planner::detail
