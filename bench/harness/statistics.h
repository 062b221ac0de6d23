// statistics.h — how every benchmark of remat summarizes repeated measurements.
//
// CONTRACT (stable; scenarios and `remat bench` depend on it):
//  - A series of measurements (e.g. the step times of the timed rounds of one
//    configuration) is reported as its median and its spread.
//  - median: remat::planner::median, the project's one definition (the middle
//    value of the sorted series; the mean of the two middle values for an even
//    count). Nothing in bench/ or tools/ defines another.
//  - spread: max - min of the series, in the series' unit. A difference
//    between two medians smaller than their spreads is noise.
//  - Ratios are of medians measured in the same run (every figure
//    is a ratio against a baseline measured alongside it; docs/benchmarks.md).
//  - summarize() of an empty series throws std::invalid_argument.
#pragma once

#include <cstdint>
#include <vector>

namespace remat::bench {

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

/// exp(mean(log(values))): the average of ratios. Throws
/// std::invalid_argument if `values` is empty or holds a value <= 0.
double geometric_mean(const std::vector<double>& values);

}  // namespace remat::bench
