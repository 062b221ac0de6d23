// Private: the vectorized inner loops of solve_optimal's fill (NOTE:
// [Quantized filter] in solve_optimal.cpp), over the memory slots of one
// option of one segment.
//
// Codes: each stored time t of a segment with store-all time base has the
// int16 lower code clamp(floor((t - base) / quantum), 0, kMaxCode); the best
// time so far of the segment being filled has an int32 upper code
// (upper_code). Both kernels read only contiguous arrays; the callers split
// an option's range into pieces where each subproblem is either stored or on
// its store-all plateau (a constant).
#pragma once

#include <algorithm>
#include <cstdint>

namespace remat::planner::detail {

constexpr int16_t kMaxCode = INT16_MAX;
constexpr int64_t kScanBlock = 32;
constexpr int32_t kLeastUpperCode = -(1 << 29);
constexpr int32_t kNoPruneCode = 1 << 30;

/// An upper code of time_ms over base_ms: >= ceil((time_ms - base_ms) *
/// per_quantum), clamped to [kLeastUpperCode + 1, kNoPruneCode]; +inf gives
/// kNoPruneCode. A larger code only lets more candidates through.
inline int32_t upper_code(double time_ms, double base_ms, double per_quantum) {
  const double code = (time_ms - base_ms) * per_quantum;
  return static_cast<int32_t>(
             std::clamp<double>(code, kLeastUpperCode, kNoPruneCode - 1)) +
         1;
}

/// Offset of the first block [k, min(k + kScanBlock, count)), k a multiple of
/// kScanBlock, holding a k' with first_codes[k'] + second_codes[k'] -
/// best_codes[k'] < threshold; count if there is none.
/// REQUIRES: count >= 0; the three arrays hold count values, each
/// non-increasing (it skips a block by its corner).
int64_t find_candidate_block(
    const int16_t* first_codes,
    const int16_t* second_codes,
    const int32_t* best_codes,
    int64_t count,
    int32_t threshold);

/// One subproblem's times over a piece: the array `times` (indexed like the
/// piece) or, if times is null, the constant plateau_ms.
struct PieceTimes {
  const double* times = nullptr;
  double plateau_ms = 0;
};

/// For k in [0, count): value = (constant_ms + first[k]) + second[k]; where
/// value < best_times[k], best_times[k] = value and best_codes[k] =
/// upper_code(value, base_ms, per_quantum). REQUIRES: the arrays hold count
/// values and do not overlap best_times or best_codes.
void relax_piece(
    double* best_times,
    int32_t* best_codes,
    int64_t count,
    double constant_ms,
    const PieceTimes& first,
    const PieceTimes& second,
    double base_ms,
    double per_quantum);

}  // namespace remat::planner::detail
