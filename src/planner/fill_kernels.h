// Private: the vectorized inner loops of solve_optimal's fill, min-plus
// updates over the memory slots of one option of one segment.
//
// The table stores every row on [lo, max_slots] (segment_table.h), so an
// option's subproblems are plain arrays over its range of m. An option is
// non-increasing in m, so its value at the top of its range bounds it from
// below; where the best time so far is already <= that bound, the option
// cannot win there nor at any larger m (best is non-increasing too). The
// kernels stop at the first chunk of kChunk slots where that holds, which
// skips the work a binary search for the exact end would save, for one
// comparison per chunk.
#pragma once

#include <cstdint>

#include "segment_table.h"

namespace remat::planner::detail {

/// Slots per pruning step of the kernels.
constexpr int64_t kChunk = 16;

/// For k in [0, count): best[k] = min(best[k], (constant_ms + first[k]) +
/// second[k]), evaluated with exactly that float expression, except that it
/// stops before the first chunk whose best[] is already <= bound (where the
/// update would change nothing). REQUIRES: best non-increasing; the option
/// >= bound over [0, count); the arrays hold count values and do not
/// overlap best.
void min_plus_two(
    Time* best,
    int64_t count,
    Time bound,
    Time constant_ms,
    const Time* first,
    const Time* second);

/// The same with one subproblem: best[k] = min(best[k], constant_ms +
/// first[k]).
void min_plus_one(
    Time* best, int64_t count, Time bound, Time constant_ms, const Time* first);

}  // namespace remat::planner::detail
