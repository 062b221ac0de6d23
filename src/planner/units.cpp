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
  // Three significant digits: 1.50, 37.2, 512. The decimals are chosen on
  // the value as printed (rounded), so 10239 B is "10.0 KiB", not "10.00",
  // and a value that rounds to 1024 moves to the next unit ("1.00 MiB").
  const auto decimals_of = [](double v) {
    return v < 9.995 ? 2 : v < 99.95 ? 1 : 0;
  };
  if (unit > 0 && unit < 6 && value >= 1023.5) {
    value /= 1024.0;
    ++unit;
  }
  const int decimals = unit == 0 ? 0 : decimals_of(value);
  char text[64];
  std::snprintf(
      text, sizeof(text), "%s%.*f %s", sign, decimals, value, kUnits[unit]);
  return text;
}

}  // namespace remat::planner
