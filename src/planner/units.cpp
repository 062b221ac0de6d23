// units.cpp: format_bytes, the one byte formatter of the project.
#include "remat/planner/units.h"

#include <cmath>
#include <cstdio>

namespace remat::planner {

std::string format_bytes(int64_t bytes) {
  static const char* const kUnits[] = {
      "B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  const char* sign = bytes < 0 ? "-" : "";
  double value = std::fabs(static_cast<double>(bytes));
  int unit = 0;
  while (value >= 1024.0 && unit < 6) {
    value /= 1024.0;
    ++unit;
  }
  // Three significant digits: 1.50, 37.2, 512.
  const int decimals = unit == 0 ? 0 : value < 10 ? 2 : value < 100 ? 1 : 0;
  char text[64];
  std::snprintf(
      text, sizeof(text), "%s%.*f %s", sign, decimals, value, kUnits[unit]);
  return text;
}

}  // namespace remat::planner
