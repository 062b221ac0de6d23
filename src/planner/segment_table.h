// Private: the DP tables of solve_optimal, indexed by segment (first stage a,
// last stage b, a <= b) and memory m in slots.
//
// SegmentBounds holds, per segment, the least memory any plan of the segment
// needs (lo), the memory at which recording everything fits (hi) and the time
// of recording everything (all_ms). SegmentCostTable holds the optimal time of
// each segment for m in [lo, min(hi - 1, max_slots)]; below lo the segment is
// infeasible (+inf), from hi on its time is all_ms. Accessors check bounds with
// assert() (debug builds); there is no index arithmetic outside this file.
#pragma once

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <limits>
#include <vector>

namespace remat::planner::detail {

constexpr double kInfeasible = std::numeric_limits<double>::infinity();

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

/// A read-only view of one segment's time as a function of memory m.
struct CostRow {
  const double* data = nullptr;  ///< times for m in [lo, hi), m <= max_slots
  int64_t lo = 0;
  int64_t hi = 0;
  double all_ms = 0;

  /// Time at memory m: +inf below lo, all_ms from hi on.
  double at(int64_t m) const {
    if (m < lo) {
      return kInfeasible;
    }
    if (m >= hi) {
      return all_ms;
    }
    return data[m - lo];
  }
};

/// Optimal times per (segment, memory) for m in [lo, min(hi - 1, max_slots)].
class SegmentCostTable {
 public:
  SegmentCostTable(const SegmentArray<SegmentInfo>& info, int64_t max_slots)
      : info_(&info), max_slots_(max_slots), offsets_(info.stages()) {
    size_t total = 0;
    for (int64_t b = 0; b < info.stages(); ++b) {
      for (int64_t a = 0; a <= b; ++a) {
        offsets_.at(a, b) = total;
        total += static_cast<size_t>(stored_count(a, b));
      }
    }
    times_.assign(total, kInfeasible);
  }

  /// Number of stored memory values of segment (a, b).
  int64_t stored_count(int64_t a, int64_t b) const {
    const SegmentInfo& s = info_->at(a, b);
    const int64_t top = std::min(s.hi - 1, max_slots_);
    return top >= s.lo ? top - s.lo + 1 : 0;
  }
  /// Mutable storage of segment (a, b): stored_count(a, b) values, the first
  /// for m = lo.
  double* mutable_row(int64_t a, int64_t b) {
    return times_.data() + offsets_.at(a, b);
  }
  CostRow row(int64_t a, int64_t b) const {
    const SegmentInfo& s = info_->at(a, b);
    return CostRow{times_.data() + offsets_.at(a, b), s.lo, s.hi, s.all_ms};
  }
  /// Time of segment (a, b) at memory m. REQUIRES: m <= max_slots.
  double at(int64_t a, int64_t b, int64_t m) const {
    assert(m <= max_slots_);
    return row(a, b).at(m);
  }
  int64_t max_slots() const {
    return max_slots_;
  }

 private:
  const SegmentArray<SegmentInfo>* info_;
  int64_t max_slots_;
  SegmentArray<size_t> offsets_;
  std::vector<double> times_;
};

}  // namespace remat::planner::detail
