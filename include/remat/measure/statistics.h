// remat/measure/statistics.h — how remat summarizes repeated measurements
// (the benchmarks, `remat bench`, the tool's trainer).
//
// CONTRACT (stable; scenarios and `remat bench` depend on it):
//  - A series of measurements (e.g. the step times of the timed rounds of one
//    configuration) is reported as its median and its spread.
//  - median: remat::planner::median, the project's one definition (the middle
//    value of the sorted series; the mean of the two middle values for an even
//    count). Nothing in bench/ or tools/ defines another.
//  - spread: max - min of the series, in the series' unit. A difference
//    between two medians smaller than their spreads is noise.
//  - A time ratio compares two configurations measured in the same run in
//    paired rounds (A B A B ...): paired_ratio() takes the ratio round by
//    round and reports their median with a distribution-free confidence
//    interval (docs/benchmarks.md, "How to read a ratio"). "A is faster than
//    B" is claimed only where the interval excludes 1.
//  - summarize() of an empty series throws std::invalid_argument.
#pragma once

#include <cstdint>
#include <vector>

namespace remat::measure {

/// Median and range of a series of measurements.
struct Summary {
  int64_t count = 0;  // number of measurements
  double median = 0;  // remat::planner::median of the series
  double min = 0;     // smallest measurement
  double max = 0;     // largest measurement
  /// max - min: how far apart the measurements lie.
  double spread() const {
    return max - min;
  }
};

/// The summary of `values`. Throws std::invalid_argument if `values` is
/// empty.
///
/// Example: summarize({3, 1, 2}) -> {count 3, median 2, min 1, max 3}
Summary summarize(const std::vector<double>& values);

/// The median of per-round ratios and its confidence interval.
struct RatioInterval {
  int64_t rounds = 0;  ///< paired rounds the ratios come from
  double median = 0;   ///< median of compared[r] / baseline[r]
  double low = 0;      ///< lower end of the interval
  double high = 0;     ///< upper end of the interval
  /// The interval's exact coverage (>= the confidence asked for when
  /// has_interval), from the binomial distribution of order statistics.
  double coverage = 0;
  /// false when the rounds are too few for the confidence asked for (95 %
  /// needs at least 6): low and high are then the smallest and largest ratio.
  bool has_interval = false;
  /// (high - low) / 2 / median: the interval's half width, relative.
  double relative_half_width() const {
    return median > 0 ? (high - low) / 2 / median : 0;
  }
  /// Whether the interval lies wholly above or wholly below 1: only then do
  /// the two configurations differ at this confidence.
  bool excludes_one() const {
    return has_interval && (low > 1 || high < 1);
  }
};

/// The ratio compared / baseline of two paired series (round r of each
/// measured next to the other): the median of the per-round ratios, with the
/// distribution-free interval [r_(k), r_(n+1-k)] of the ordered ratios, k
/// the largest whose coverage 1 - 2 P(Binomial(n, 1/2) < k) is at least
/// `confidence`.
///
/// Example: paired_ratio(b_ms, a_ms) of 10 rounds -> the 2nd and 9th of the
/// sorted ratios bound the median with 97.9 % coverage.
///
/// Throws std::invalid_argument if the series are empty or of different
/// lengths, a baseline value is not positive, a compared value is negative,
/// or confidence is not in (0, 1).
RatioInterval paired_ratio(
    const std::vector<double>& compared,
    const std::vector<double>& baseline,
    double confidence = 0.95);

/// exp(mean(log(values))): the average of ratios. Throws
/// std::invalid_argument if `values` is empty or holds a value <= 0.
double geometric_mean(const std::vector<double>& values);

}  // namespace remat::measure
