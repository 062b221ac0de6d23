// Private: the fill of solve_optimal's time table (segment_fill.cpp), and the
// float expression of one option's time that the fill and the plan walk of
// solve_optimal.cpp share.
#pragma once

#include <cstdint>

#include "segment_recurrence.h"
#include "segment_table.h"

namespace remat::planner::detail {

/// The time of `option` at memory m (>= option.from), by the float
/// expression of SegmentOption. REQUIRES: the option's cells have their rows.
inline Time option_time(const SegmentOption& option, int64_t m) {
  if (option.first == nullptr) {
    return static_cast<Time>(option.constant_ms);  // one-stage selective
  }
  const Time first = static_cast<Time>(option.constant_ms) +
                     option.first->at(m - option.shift);
  return option.is_record() ? first : first + option.second->at(m);
}

/// Fills `table` (the rows of every segment below its hi) with `threads`
/// threads, the caller's included; the result does not depend on the thread
/// count. REQUIRES: table is on the cells of `recurrence`, not yet filled.
void fill_table(
    const Recurrence& recurrence, SegmentCostTable& table, int64_t threads);

/// The DP's definition, for tests: every option at every m of [from, top],
/// option_time's float expression (the kernels' own), no pruning, plain
/// loops. REQUIRES: as fill_table.
void reference_fill(const Recurrence& recurrence, SegmentCostTable& table);

}  // namespace remat::planner::detail
