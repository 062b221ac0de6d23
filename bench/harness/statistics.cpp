// statistics.cpp — Summary and geometric_mean (see statistics.h). The median
// itself is remat::planner::median.
#include "harness/statistics.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "remat/planner/statistics.h"

namespace remat::bench {

Summary summarize(const std::vector<double>& values) {
  if (values.empty()) {
    throw std::invalid_argument(
        "remat::bench::summarize: expected at least one value, got none");
  }
  Summary summary;
  summary.count = static_cast<int64_t>(values.size());
  summary.median = planner::median(values);
  const auto [low, high] = std::minmax_element(values.begin(), values.end());
  summary.min = *low;
  summary.max = *high;
  return summary;
}

double geometric_mean(const std::vector<double>& values) {
  if (values.empty()) {
    throw std::invalid_argument(
        "remat::bench::geometric_mean: expected at least one value, got none");
  }
  double log_sum = 0;
  for (const double value : values) {
    if (!(value > 0)) {
      throw std::invalid_argument(
          "remat::bench::geometric_mean: expected positive values, got " +
          std::to_string(value));
    }
    log_sum += std::log(value);
  }
  return std::exp(log_sum / static_cast<double>(values.size()));
}

}  // namespace remat::bench
