// remat/planner/statistics.h: the statistics remat reports measurements with.
#pragma once

#include <vector>

namespace remat::planner {

/// The median of `values`: the middle value of the sorted values, or the mean
/// of the two middle values for an even count. Throws std::invalid_argument
/// when `values` is empty.
///
/// Example:
// clang-format off
///   median({3, 1, 2}) == 2;  median({4, 1, 3, 2}) == 2.5
// clang-format on
double median(std::vector<double> values);

}  // namespace remat::planner
