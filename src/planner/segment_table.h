// Private: the DP tables of solve_optimal, indexed by segment (first stage a,
// last stage b, a <= b) and memory m in slots.
//
// SegmentInfo holds, per segment, the least memory any plan of the segment
// needs (lo), the memory at which recording everything fits (hi) and the time
// of recording everything (all_ms). SegmentCostTable holds the optimal time of
// each segment for every m in [lo, max_slots]: the fill computes m < hi, and
// from hi on the row holds all_ms (stored, so that the fill's inner loop reads
// plain arrays). Below lo the segment is infeasible (+inf). Accessors check
// bounds with assert() (debug builds); there is no index arithmetic outside
// this file.
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
#include <cassert>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <new>
#include <vector>

namespace remat::planner::detail {

/// A time in the DP table, in milliseconds.
using Time = float;

constexpr Time kInfeasible = std::numeric_limits<Time>::infinity();

/// Per-segment memory bounds and store-all time.
struct SegmentInfo {
  int64_t lo = 0;     ///< least memory (units) of any plan of the segment
  int64_t hi = 0;     ///< memory (units) at which recording everything fits
  double all_ms = 0;  ///< time of recording everything (no recomputation)
};

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

 private:
  size_t index(int64_t a, int64_t b) const {
    assert(0 <= a && a <= b && b < stages_);
    return static_cast<size_t>(b * (b + 1) / 2 + a);
  }
  int64_t stages_;
  std::vector<T> cells_;
};

/// One segment's row of the table: its time as a function of memory m.
struct CostRow {
  Time* data = nullptr;  ///< times for m in [lo, lo + count)
  int64_t lo = 0;
  int64_t count = 0;  ///< max_slots - lo + 1, or 0 if lo > max_slots
  /// Time at max_slots (the row's least), once the row is final (see
  /// SegmentCostTable::finish_row); kept here, next to lo, so that the fill's
  /// pruning bound needs no access to the row itself.
  Time last = kInfeasible;

  /// Time at memory m: +inf below lo. REQUIRES: m <= max_slots.
  Time at(int64_t m) const {
    if (m < lo) {
      return kInfeasible;
    }
    assert(m - lo < count);
    return data[m - lo];
  }
  /// Address of the time at memory m. REQUIRES: lo <= m <= max_slots.
  Time* at_address(int64_t m) const {
    assert(lo <= m && m - lo < count);
    return data + (m - lo);
  }
};

/// Optimal times per (segment, memory) for m in [lo, max_slots].
class SegmentCostTable {
 public:
  SegmentCostTable(const SegmentArray<SegmentInfo>& info, int64_t max_slots)
      : info_(&info), max_slots_(max_slots), rows_(info.stages()) {
    size_t total = 0;
    std::vector<size_t> offsets;
    for (int64_t b = 0; b < info.stages(); ++b) {
      for (int64_t a = 0; a <= b; ++a) {
        const int64_t lo = info.at(a, b).lo;
        offsets.push_back(total);
        total += static_cast<size_t>(lo <= max_slots ? max_slots - lo + 1 : 0);
      }
    }
    // Written once, row by row (no separate zero/fill pass over the table).
    times_ = allocate_times(total);
    size_t k = 0;
    for (int64_t b = 0; b < info.stages(); ++b) {
      for (int64_t a = 0; a <= b; ++a, ++k) {
        const SegmentInfo& s = info.at(a, b);
        CostRow& row = rows_.at(a, b);
        row.data = times_.get() + offsets[k];
        row.lo = s.lo;
        row.count = s.lo <= max_slots ? max_slots - s.lo + 1 : 0;
        for (int64_t m = s.lo; m <= max_slots; ++m) {
          *row.at_address(m) =
              m < s.hi ? kInfeasible : static_cast<Time>(s.all_ms);
        }
        if (row.count > 0 && s.hi <= max_slots) {
          row.last = static_cast<Time>(s.all_ms);
        }
      }
    }
  }
  SegmentCostTable(const SegmentCostTable&) = delete;
  SegmentCostTable& operator=(const SegmentCostTable&) = delete;

  /// Last m the fill computes for segment (a, b): min(hi - 1, max_slots);
  /// below lo if it computes none.
  int64_t computed_top(int64_t a, int64_t b) const {
    return std::min(info_->at(a, b).hi - 1, max_slots_);
  }
  /// Records the time at max_slots of segment (a, b) once the fill has
  /// computed its row.
  void finish_row(int64_t a, int64_t b) {
    CostRow& row = rows_.at(a, b);
    if (row.count > 0) {
      row.last = row.data[row.count - 1];
    }
  }
  /// The row of segment (a, b); its data is writable (the fill writes it).
  const CostRow& row(int64_t a, int64_t b) const {
    return rows_.at(a, b);
  }
  int64_t max_slots() const {
    return max_slots_;
  }

 private:
  const SegmentArray<SegmentInfo>* info_;
  int64_t max_slots_;
  SegmentArray<CostRow> rows_;
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
