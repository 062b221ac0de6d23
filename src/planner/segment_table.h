// Private: the DP tables of solve_optimal, indexed by segment (first stage a,
// last stage b, a <= b) and memory m in slots.
//
// SegmentArray is the triangular array over segments. SegmentCell holds, per
// segment, the least memory any plan of the segment needs (lo), the memory
// at which recording everything fits (hi), the time of recording everything
// (all_ms), and, once SegmentCostTable has attached it, the segment's row of
// optimal times for every m in [lo, max_slots]: the fill computes m < hi, and
// from hi on the row holds all_ms (stored, so that the fill's inner loop
// reads plain arrays). Below lo the segment is infeasible (+inf). Every
// accessor checks its bounds (REMAT_PLANNER_CHECK, all builds: a few
// comparisons per access, none per slot in the fill); there is no index
// arithmetic outside this file.
//
// Times in the table are float: it halves the memory traffic of the fill,
// which is what bounds its speed, and doubles the SIMD width. The plan the
// table picks is re-timed in double by simulate(); float rounding (about 1e-7
// relative) can only matter between plans whose times are that close.
#pragma once

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "check.h"

namespace remat::planner::detail {

/// A time in the DP table, in milliseconds.
using Time = float;

constexpr Time kInfeasible = std::numeric_limits<Time>::infinity();

/// A triangular array over segments (a, b), 0 <= a <= b < stages.
template <typename T>
class SegmentArray {
 public:
  explicit SegmentArray(int64_t stages)
      : stages_(stages), cells_(stages * (stages + 1) / 2) {}
  T& at(int64_t a, int64_t b) {
    return cells_[index(a, b)];
  }
  const T& at(int64_t a, int64_t b) const {
    return cells_[index(a, b)];
  }
  int64_t stages() const {
    return stages_;
  }
  /// The cells (0, b), (1, b), ..., (b, b), which lie side by side: element
  /// a of the result is (a, b).
  const T* column(int64_t b) const {
    return &at(0, b);
  }

 private:
  size_t index(int64_t a, int64_t b) const {
    // 0 <= a <= b < stages in two comparisons: a negative a or b wraps to
    // a huge unsigned value and fails one of them.
    REMAT_PLANNER_CHECK(
        static_cast<uint64_t>(a) <= static_cast<uint64_t>(b) &&
            static_cast<uint64_t>(b) < static_cast<uint64_t>(stages_),
        "segment outside the chain");
    const auto end = static_cast<size_t>(b);
    return end * (end + 1) / 2 + static_cast<size_t>(a);
  }
  int64_t stages_;
  std::vector<T> cells_;
};

/// What is kept of one segment (a, b): its memory bounds, which the bounds
/// pass writes, and its row of optimal times as a function of memory m,
/// which SegmentCostTable attaches. One cell per segment, so that the fill
/// finds a segment's lo, its row and its pruning bound in one place.
struct SegmentCell {
  int64_t lo = 0;  ///< least memory (units) of any plan of the segment
  int64_t hi = 0;  ///< memory (units) at which recording everything fits
  /// Time of recording everything (no recomputation), summed in Time stage
  /// by stage as the record options sum it.
  double all_ms = 0;

  Time* times = nullptr;  ///< the row: times for m in [lo, lo + count)
  int64_t count = 0;      ///< max_slots - lo + 1, or 0 if lo > max_slots
  /// Time at max_slots (the row's least), once the row is final (see
  /// SegmentCostTable::finish_row); kept next to lo so that the fill's
  /// pruning bound needs no access to the row itself.
  Time last = kInfeasible;

  /// Time at memory m: +inf below lo. REQUIRES: m <= max_slots.
  Time at(int64_t m) const {
    if (m < lo) {
      return kInfeasible;
    }
    REMAT_PLANNER_CHECK(m - lo < count, "memory above max_slots");
    return times[m - lo];
  }
  /// Address of the time at memory m. REQUIRES: lo <= m <= max_slots.
  Time* at_address(int64_t m) const {
    REMAT_PLANNER_CHECK(
        static_cast<uint64_t>(m - lo) < static_cast<uint64_t>(count),
        "memory outside the segment's row");
    return times + (m - lo);
  }
};

/// Optimal times per (segment, memory) for m in [lo, max_slots], one row
/// per segment attached to the segment's cell.
class SegmentCostTable {
 public:
  /// Takes the cells with their bounds final; attaches each a row holding
  /// +inf on [lo, hi) (the fill's part) and all_ms from hi on.
  SegmentCostTable(SegmentArray<SegmentCell> cells, int64_t max_slots)
      : cells_(std::move(cells)), max_slots_(max_slots) {
    size_t total = 0;
    for (int64_t b = 0; b < cells_.stages(); ++b) {
      for (int64_t a = 0; a <= b; ++a) {
        const int64_t lo = cells_.at(a, b).lo;
        total += static_cast<size_t>(lo <= max_slots ? max_slots - lo + 1 : 0);
      }
    }
    // Written once, row by row (no separate zero/fill pass over the table).
    times_ = allocate_times(total);
    Time* next = times_.get();
    for (int64_t b = 0; b < cells_.stages(); ++b) {
      for (int64_t a = 0; a <= b; ++a) {
        SegmentCell& cell = cells_.at(a, b);
        cell.times = next;
        cell.count = cell.lo <= max_slots ? max_slots - cell.lo + 1 : 0;
        next += cell.count;
        const int64_t computed =
            std::clamp<int64_t>(cell.hi - cell.lo, 0, cell.count);
        std::fill(cell.times, cell.times + computed, kInfeasible);
        std::fill(
            cell.times + computed,
            cell.times + cell.count,
            static_cast<Time>(cell.all_ms));
        if (cell.count > 0 && cell.hi <= max_slots) {
          cell.last = static_cast<Time>(cell.all_ms);
        }
      }
    }
  }
  SegmentCostTable(const SegmentCostTable&) = delete;
  SegmentCostTable& operator=(const SegmentCostTable&) = delete;

  /// Last m the fill computes for the segment of `cell` (one of this
  /// table's): min(hi - 1, max_slots); below lo if it computes none.
  int64_t computed_top(const SegmentCell& cell) const {
    return std::min(cell.hi - 1, max_slots_);
  }
  /// Records the time at max_slots of segment (a, b) once the fill has
  /// computed its row.
  void finish_row(int64_t a, int64_t b) {
    SegmentCell& cell = cells_.at(a, b);
    if (cell.count > 0) {
      cell.last = cell.times[cell.count - 1];
    }
  }
  /// The cell of segment (a, b); its row's times are writable (the fill
  /// writes them).
  const SegmentCell& row(int64_t a, int64_t b) const {
    return cells_.at(a, b);
  }
  /// Every segment's cell (bounds and row).
  const SegmentArray<SegmentCell>& cells() const {
    return cells_;
  }
  int64_t max_slots() const {
    return max_slots_;
  }

 private:
  SegmentArray<SegmentCell> cells_;
  int64_t max_slots_;
  struct FreeTimes {
    void operator()(Time* p) const {
      std::free(p);
    }
  };
  using TimesPtr = std::unique_ptr<Time[], FreeTimes>;

  // Storage for `count` times, on 2 MiB pages where Linux can (the fill
  // streams rows from all over the table; with 4 KiB pages nearly every row
  // it starts costs a TLB miss).
  static TimesPtr allocate_times(size_t count) {
    constexpr size_t kHugePage = size_t{2} << 20;
    const size_t bytes = std::max<size_t>(count * sizeof(Time), 1);
    if (bytes >= kHugePage) {
      const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
      if (void* p = std::aligned_alloc(kHugePage, rounded)) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
        madvise(p, rounded, MADV_HUGEPAGE);  // a hint; failure is harmless
#endif
        return TimesPtr(static_cast<Time*>(p));
      }
    }
    void* p = std::malloc(bytes);
    if (p == nullptr) {
      throw std::bad_alloc();
    }
    return TimesPtr(static_cast<Time*>(p));
  }

  TimesPtr times_;
};

}  // namespace remat::planner::detail
