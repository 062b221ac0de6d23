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
//
// NOTE: [Chunks an option cannot win]
// The same holds chunk by chunk: over a chunk [k, k + kChunk) the option is
// at least its value at the chunk's last slot and best is at most best[k],
// so where best[k] <= the option's value at k + kChunk - 1 the option wins
// nowhere in the chunk, and the kernels skip it after that one scalar
// evaluation (the same float expression as the vector one, so the test is
// exact). On E5's 200-stage chain 43 % of the chunks before the stop are
// skipped so, which saves their vector loads and stores.
//
// Chunks of 32 slots: on E5's chains (one thread, this machine's Xeon) the
// solve took 62 ms at 200 stages and about 1.0 s at 500 with 32, 76 ms and
// 1.1 s with 16, 68 ms and 1.07 s with 64. With 16, an option of the
// 500-stage chain went through about fifteen chunks; without the chunk test
// the solve took 10 % longer, and row groups of 16 or 32 (each streamed row
// read half or a quarter as often, segment_fill.cpp) gained under 8 %.
#pragma once

#include <cstdint>

#include "segment_table.h"

namespace remat::planner::detail {

/// Slots per pruning step of the kernels.
constexpr int64_t kChunk = 32;

/// For k in [0, count): best[k] = min(best[k], (constant_ms + first[k]) +
/// second[k]), evaluated with exactly that float expression, except that it
/// stops before the first chunk whose best[] is already <= bound and skips a
/// chunk whose first best is <= the option at its last slot (where the
/// update would change nothing). REQUIRES: best and the option
/// non-increasing; the option >= bound over [0, count); the arrays hold count
/// values and do not overlap best.
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
