// statistics.cpp: median, the one definition of the project.
#include "remat/planner/statistics.h"

#include <algorithm>
#include <stdexcept>

namespace remat::planner {

double median(std::vector<double> values) {
  if (values.empty()) {
    throw std::invalid_argument(
        "remat::planner::median: expected at least one value, got none");
  }
  const size_t middle = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + middle, values.end());
  const double upper = values[middle];
  if (values.size() % 2 == 1) {
    return upper;
  }
  const double lower =
      *std::max_element(values.begin(), values.begin() + middle);
  return 0.5 * (lower + upper);
}

}  // namespace remat::planner
