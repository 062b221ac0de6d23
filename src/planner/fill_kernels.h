// Private: the vectorized inner loop of solve_optimal's fill, a min-plus
// update over the memory slots of one option of one segment.
//
// The caller splits an option's range of m into pieces where each of its two
// subproblems is either stored (a contiguous array of times) or on its
// store-all plateau (a constant), so the loop reads only contiguous arrays.
#pragma once

#include <cstdint>

namespace remat::planner::detail {

/// One subproblem's times over a piece: the array `times` (indexed like the
/// piece) or, if times is null, the constant plateau_ms.
struct PieceTimes {
  const double* times = nullptr;
  double plateau_ms = 0;
};

/// For k in [0, count): best[k] = min(best[k], (constant_ms + first[k]) +
/// second[k]), evaluated with exactly that expression in double.
/// REQUIRES: the arrays hold count values and do not overlap best.
void min_plus_piece(
    double* best,
    int64_t count,
    double constant_ms,
    const PieceTimes& first,
    const PieceTimes& second);

}  // namespace remat::planner::detail
