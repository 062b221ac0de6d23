// The kernels of fill_kernels.h. Their loops have no early exit and no
// aliasing, so GCC vectorizes them; target_clones builds an AVX2 version next
// to the baseline x86-64 one and picks at load time, so the library runs on
// any x86-64 (no -march=native). The double arithmetic is the same
// expression, in the same order, in every version (no FMA contraction: the
// AVX2 clone does not enable FMA), so results are bit-identical.
#include "fill_kernels.h"

namespace remat::planner::detail {

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define REMAT_PLANNER_KERNEL_CLONES \
  __attribute__((target_clones("avx2", "default")))
#else
#define REMAT_PLANNER_KERNEL_CLONES
#endif

namespace {

// Whether some k in [0, size) has first + second - best < threshold. Inlined
// into each clone; with size = kScanBlock the loop has a constant trip count
// and is fully unrolled.
inline bool any_candidate(
    const int16_t* first_codes,
    const int16_t* second_codes,
    const int32_t* best_codes,
    int64_t size,
    int32_t threshold) {
  int32_t hits = 0;
  for (int64_t k = 0; k < size; ++k) {
    const int32_t gap = static_cast<int32_t>(first_codes[k]) +
                        static_cast<int32_t>(second_codes[k]) - best_codes[k];
    hits |= gap < threshold ? 1 : 0;
  }
  return hits != 0;
}

}  // namespace

REMAT_PLANNER_KERNEL_CLONES
int64_t find_candidate_block(
    const int16_t* first_codes,
    const int16_t* second_codes,
    const int32_t* best_codes,
    int64_t count,
    int32_t threshold) {
  int64_t start = 0;
  for (; start + kScanBlock <= count; start += kScanBlock) {
    // All three code arrays are non-increasing: the gap is least at the
    // block's corner (option codes at its end, best's at its start).
    const int64_t last = start + kScanBlock - 1;
    if (static_cast<int32_t>(first_codes[last]) +
            static_cast<int32_t>(second_codes[last]) - best_codes[start] >=
        threshold) {
      continue;
    }
    if (any_candidate(
            first_codes + start,
            second_codes + start,
            best_codes + start,
            kScanBlock,
            threshold)) {
      return start;
    }
  }
  if (start < count && any_candidate(
                           first_codes + start,
                           second_codes + start,
                           best_codes + start,
                           count - start,
                           threshold)) {
    return start;
  }
  return count;
}

namespace {

// The loop of relax_piece for one pair of accessors; inlined into each clone.
template <typename First, typename Second>
inline void relax_loop(
    double* __restrict best_times,
    int32_t* __restrict best_codes,
    int64_t count,
    double constant_ms,
    First first,
    Second second,
    double base_ms,
    double per_quantum) {
  for (int64_t k = 0; k < count; ++k) {
    const double value = (constant_ms + first(k)) + second(k);
    const double old = best_times[k];
    const bool better = value < old;
    best_times[k] = better ? value : old;
    const int32_t code = upper_code(value, base_ms, per_quantum);
    best_codes[k] = better ? code : best_codes[k];
  }
}

}  // namespace

REMAT_PLANNER_KERNEL_CLONES
void relax_piece(
    double* best_times,
    int32_t* best_codes,
    int64_t count,
    double constant_ms,
    const PieceTimes& first,
    const PieceTimes& second,
    double base_ms,
    double per_quantum) {
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
    relax_loop(
        best_times,
        best_codes,
        count,
        constant_ms,
        stored_first,
        stored_second,
        base_ms,
        per_quantum);
  } else if (first_times != nullptr) {
    relax_loop(
        best_times,
        best_codes,
        count,
        constant_ms,
        stored_first,
        plateau_second,
        base_ms,
        per_quantum);
  } else if (second_times != nullptr) {
    relax_loop(
        best_times,
        best_codes,
        count,
        constant_ms,
        plateau_first,
        stored_second,
        base_ms,
        per_quantum);
  } else {
    relax_loop(
        best_times,
        best_codes,
        count,
        constant_ms,
        plateau_first,
        plateau_second,
        base_ms,
        per_quantum);
  }
}

}  // namespace remat::planner::detail
