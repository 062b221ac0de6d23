// Private: the DP tables of solve_optimal, indexed by segment (first stage a,
// last stage b, a <= b) and memory m in slots.
//
// SegmentBounds holds, per segment, the least memory any plan of the segment
// needs (lo), the memory at which recording everything fits (hi) and the time
// of recording everything (all_ms). SegmentCostTable holds the optimal time of
// each segment for m in [lo, min(hi - 1, max_slots)]; below lo the segment is
// infeasible (+inf), from hi on its time is all_ms. Next to each stored time
// it holds the time's int16 lower-bound code for the fill's filter (NOTE:
// [Quantized filter] in solve_optimal.cpp); the codes of the plateau are 0.
// Accessors check bounds with assert() (debug builds); there is no index
// arithmetic outside this file.
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

/// How a SegmentArray lays out its cells: kByLast keeps the segments with the
/// same last stage b together (a ascending), kByFirst those with the same
/// first stage a (b ascending).
enum class SegmentOrder { kByLast, kByFirst };

/// A triangular array over segments (a, b), 0 <= a <= b < stages.
template <typename T>
class SegmentArray {
 public:
  explicit SegmentArray(
      int64_t stages, SegmentOrder order = SegmentOrder::kByLast)
      : stages_(stages), order_(order), cells_(stages * (stages + 1) / 2) {}
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
    if (order_ == SegmentOrder::kByLast) {
      return static_cast<size_t>(b * (b + 1) / 2 + a);
    }
    return static_cast<size_t>(a * (2 * stages_ - a + 1) / 2 + (b - a));
  }
  int64_t stages_;
  SegmentOrder order_;
  std::vector<T> cells_;
};

/// A read-only view of one segment's time as a function of memory m.
struct CostRow {
  const double* data = nullptr;    ///< times for m in [lo, hi), m <= max_slots
  const int16_t* codes = nullptr;  ///< codes of data, same indexing
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

/// Optimal times per (segment, memory) for m in [lo, min(hi - 1, max_slots)],
/// and their codes.
///
/// The fill of (a, b) reads the rows (j, b) for j > a and (a, j - 1) for
/// j <= b; it reads mostly codes. So the codes are stored twice, once with
/// the segments of one last stage together (later(), contiguous over j) and
/// once with those of one first stage together (earlier()), and so are the
/// row views: both streams are sequential in memory. The times, read only
/// where the filter lets an option through and by the plan emission, are
/// stored once.
class SegmentCostTable {
 public:
  SegmentCostTable(const SegmentArray<SegmentInfo>& info, int64_t max_slots)
      : info_(&info),
        max_slots_(max_slots),
        times_offsets_(info.stages(), SegmentOrder::kByLast),
        by_first_offsets_(info.stages(), SegmentOrder::kByFirst),
        later_rows_(info.stages(), SegmentOrder::kByLast),
        earlier_rows_(info.stages(), SegmentOrder::kByFirst) {
    const int64_t n = info.stages();
    size_t total = 0;
    for (int64_t b = 0; b < n; ++b) {
      for (int64_t a = 0; a <= b; ++a) {
        times_offsets_.at(a, b) = total;
        total += static_cast<size_t>(stored_count(a, b));
      }
    }
    times_.assign(total, kInfeasible);
    by_last_codes_.assign(total, 0);
    by_first_codes_.assign(total, 0);
    total = 0;
    for (int64_t a = 0; a < n; ++a) {
      for (int64_t b = a; b < n; ++b) {
        by_first_offsets_.at(a, b) = total;
        total += static_cast<size_t>(stored_count(a, b));
      }
    }
    zero_codes_.assign(static_cast<size_t>(max_slots) + 1, 0);
    for (int64_t b = 0; b < n; ++b) {
      for (int64_t a = 0; a <= b; ++a) {
        const SegmentInfo& s = info.at(a, b);
        const double* times = times_.data() + times_offsets_.at(a, b);
        later_rows_.at(a, b) = CostRow{
            times,
            by_last_codes_.data() + times_offsets_.at(a, b),
            s.lo,
            s.hi,
            s.all_ms};
        earlier_rows_.at(a, b) = CostRow{
            times,
            by_first_codes_.data() + by_first_offsets_.at(a, b),
            s.lo,
            s.hi,
            s.all_ms};
      }
    }
  }

  /// Number of stored memory values of segment (a, b).
  int64_t stored_count(int64_t a, int64_t b) const {
    const SegmentInfo& s = info_->at(a, b);
    const int64_t top = std::min(s.hi - 1, max_slots_);
    return top >= s.lo ? top - s.lo + 1 : 0;
  }
  /// Mutable times of segment (a, b): stored_count(a, b) values, the first
  /// for m = lo.
  double* mutable_row(int64_t a, int64_t b) {
    return times_.data() + times_offsets_.at(a, b);
  }
  /// Sets the code of segment (a, b) at stored index k (m = lo + k) in both
  /// copies.
  void set_code(int64_t a, int64_t b, int64_t k, int16_t code) {
    assert(0 <= k && k < stored_count(a, b));
    by_last_codes_[times_offsets_.at(a, b) + static_cast<size_t>(k)] = code;
    by_first_codes_[by_first_offsets_.at(a, b) + static_cast<size_t>(k)] = code;
  }
  /// Segment (a, b) as the later part of a split (codes laid out by last
  /// stage).
  const CostRow& later(int64_t a, int64_t b) const {
    return later_rows_.at(a, b);
  }
  /// Segment (a, b) as the earlier part of a split (codes laid out by first
  /// stage).
  const CostRow& earlier(int64_t a, int64_t b) const {
    return earlier_rows_.at(a, b);
  }
  const CostRow& row(int64_t a, int64_t b) const {
    return later_rows_.at(a, b);
  }
  /// max_slots + 1 zero codes (the code of every plateau value).
  const int16_t* zero_codes() const {
    return zero_codes_.data();
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
  SegmentArray<size_t> times_offsets_;  // also of by_last_codes_
  SegmentArray<size_t> by_first_offsets_;
  std::vector<double> times_;
  std::vector<int16_t> by_last_codes_;
  std::vector<int16_t> by_first_codes_;
  std::vector<int16_t> zero_codes_;
  SegmentArray<CostRow> later_rows_;
  SegmentArray<CostRow> earlier_rows_;
};

}  // namespace remat::planner::detail
