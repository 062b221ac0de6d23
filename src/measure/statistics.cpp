// statistics.cpp — Summary and geometric_mean (see statistics.h). The median
// itself is remat::planner::median.
#include "remat/measure/statistics.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "remat/planner/statistics.h"

namespace remat::measure {

Summary summarize(const std::vector<double>& values) {
  if (values.empty()) {
    throw std::invalid_argument(
        "remat::measure::summarize: expected at least one value, got none");
  }
  Summary summary;
  summary.count = static_cast<int64_t>(values.size());
  summary.median = planner::median(values);
  const auto [low, high] = std::minmax_element(values.begin(), values.end());
  summary.min = *low;
  summary.max = *high;
  return summary;
}

RatioInterval paired_ratio(
    const std::vector<double>& compared,
    const std::vector<double>& baseline,
    double confidence) {
  if (compared.size() != baseline.size() || compared.empty()) {
    throw std::invalid_argument(
        "remat::measure::paired_ratio: expected two series of the same "
        "non-zero length, got " +
        std::to_string(compared.size()) + " and " +
        std::to_string(baseline.size()));
  }
  if (!(confidence > 0 && confidence < 1)) {
    throw std::invalid_argument(
        "remat::measure::paired_ratio: expected a confidence in (0, 1), got " +
        std::to_string(confidence));
  }
  std::vector<double> ratios;
  ratios.reserve(compared.size());
  for (size_t round = 0; round < compared.size(); ++round) {
    if (!(baseline[round] > 0)) {
      throw std::invalid_argument(
          "remat::measure::paired_ratio: expected positive baseline times, "
          "got " +
          std::to_string(baseline[round]) + " in round " +
          std::to_string(round));
    }
    if (!(compared[round] >= 0)) {
      throw std::invalid_argument(
          "remat::measure::paired_ratio: expected non-negative compared "
          "times, got " +
          std::to_string(compared[round]) + " in round " +
          std::to_string(round));
    }
    ratios.push_back(compared[round] / baseline[round]);
  }
  std::sort(ratios.begin(), ratios.end());
  RatioInterval interval;
  interval.rounds = static_cast<int64_t>(ratios.size());
  interval.median = planner::median(ratios);
  // NOTE: [The interval of a median ratio]
  // Each round's ratio lies below the true median with probability 1/2,
  // whatever the distribution of the ratios, so the number of ratios below
  // it is Binomial(n, 1/2). [r_(k), r_(n+1-k)] (1-based order statistics)
  // covers the median unless k or more lie on one side: with probability
  // 1 - 2 P(X < k). The largest k whose coverage is still >= confidence is
  // taken; if even k = 1 (the whole range) covers less, there is no interval
  // at this confidence with so few rounds.
  const int64_t n = interval.rounds;
  // P(X = j) = C(n, j) / 2^n, computed from its logarithm: 0.5^n itself
  // underflows to 0 from n = 1075 on, which made every term 0 and the
  // interval collapse onto the median with a claimed coverage of 1.
  const auto probability = [n](int64_t j) {
    return std::exp(
        std::lgamma(static_cast<double>(n) + 1) -
        std::lgamma(static_cast<double>(j) + 1) -
        std::lgamma(static_cast<double>(n - j) + 1) -
        static_cast<double>(n) * std::log(2.0));
  };
  double below = 0;  // P(X < k) for the current k, starting at k = 1
  int64_t k = 0;
  for (int64_t candidate = 1; 2 * candidate <= n + 1; ++candidate) {
    below += probability(candidate - 1);  // now P(X < candidate)
    if (1 - 2 * below < confidence) {
      break;
    }
    k = candidate;
    interval.coverage = 1 - 2 * below;
  }
  if (k == 0) {
    interval.low = ratios.front();
    interval.high = ratios.back();
    interval.coverage = 1 - 2 * std::pow(0.5, static_cast<double>(n));
    interval.has_interval = false;
    return interval;
  }
  interval.low = ratios[static_cast<size_t>(k - 1)];
  interval.high = ratios[static_cast<size_t>(n - k)];
  interval.has_interval = true;
  return interval;
}

double geometric_mean(const std::vector<double>& values) {
  if (values.empty()) {
    throw std::invalid_argument(
        "remat::measure::geometric_mean: expected at least one value, got "
        "none");
  }
  double log_sum = 0;
  for (const double value : values) {
    if (!(value > 0)) {
      throw std::invalid_argument(
          "remat::measure::geometric_mean: expected positive values, got " +
          std::to_string(value));
    }
    log_sum += std::log(value);
  }
  return std::exp(log_sum / static_cast<double>(values.size()));
}

}  // namespace remat::measure
