// budget.cpp: parsing of --budget values and byte formatting.
#include "budget.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <utility>

namespace remat::cli {
namespace {

constexpr const char* kExpected =
    "expected bytes (512MiB, 1GiB, 300MB, 1000000), a percentage of the "
    "no-checkpoint peak (50%) or 'none'";
constexpr double kMaxBytes = 1152921504606846976.0;  // 2^60
constexpr double kMaxFraction = 10.0;                // 1000%

[[noreturn]] void reject(std::string_view text, const std::string& why) {
  throw std::invalid_argument(
      std::string(kExpected) + "; got '" + std::string(text) + "' (" + why +
      ")");
}

std::string lowercase(std::string_view text) {
  std::string lower(text);
  for (char& c : lower) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return lower;
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text[0]))) {
    text.remove_prefix(1);
  }
  while (!text.empty() &&
         std::isspace(static_cast<unsigned char>(text.back()))) {
    text.remove_suffix(1);
  }
  return text;
}

// Multiplier of a lowercase unit, or 0 if unknown.
double unit_multiplier(const std::string& unit) {
  static const std::array<std::pair<const char*, double>, 10> kUnits{{
      {"", 1.0},
      {"b", 1.0},
      {"kb", 1e3},
      {"mb", 1e6},
      {"gb", 1e9},
      {"tb", 1e12},
      {"kib", 1024.0},
      {"mib", 1024.0 * 1024.0},
      {"gib", 1024.0 * 1024.0 * 1024.0},
      {"tib", 1024.0 * 1024.0 * 1024.0 * 1024.0},
  }};
  for (const auto& [name, multiplier] : kUnits) {
    if (unit == name) {
      return multiplier;
    }
  }
  return 0;
}

}  // namespace

BudgetSpec parse_budget(std::string_view text) {
  const std::string_view trimmed = trim(text);
  if (trimmed.empty()) {
    reject(text, "empty");
  }
  if (lowercase(trimmed) == "none") {
    return BudgetSpec{};
  }
  if (trimmed[0] == '-') {
    reject(text, "a budget must be positive");
  }
  // The number: digits with at most one decimal point.
  size_t end = 0;
  bool seen_point = false;
  bool seen_digit = false;
  while (end < trimmed.size()) {
    const char c = trimmed[end];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      seen_digit = true;
    } else if (c == '.' && !seen_point) {
      seen_point = true;
    } else {
      break;
    }
    ++end;
  }
  if (!seen_digit) {
    reject(text, "no number");
  }
  const std::string number(trimmed.substr(0, end));
  const double value = std::strtod(number.c_str(), nullptr);
  const std::string unit = lowercase(trim(trimmed.substr(end)));

  if (unit == "%") {
    const double fraction = value / 100.0;
    if (!(fraction > 0)) {
      reject(text, "a percentage must be above 0%");
    }
    if (fraction > kMaxFraction) {
      reject(text, "a percentage must be at most 1000%");
    }
    BudgetSpec budget;
    budget.kind = BudgetSpec::Kind::kFraction;
    budget.fraction = fraction;
    return budget;
  }
  const double multiplier = unit_multiplier(unit);
  if (multiplier == 0) {
    reject(
        text,
        "unknown unit '" + std::string(trim(trimmed.substr(end))) +
            "'; units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB, %");
  }
  const double bytes = value * multiplier;
  if (!(bytes >= 1)) {
    reject(text, "a budget must be at least 1 byte");
  }
  if (bytes > kMaxBytes) {
    reject(text, "too large; at most 1 EiB");
  }
  if (bytes != std::floor(bytes)) {
    reject(text, "not a whole number of bytes");
  }
  BudgetSpec budget;
  budget.kind = BudgetSpec::Kind::kBytes;
  budget.bytes = static_cast<int64_t>(bytes);
  return budget;
}

int64_t resolve_budget_bytes(
    const BudgetSpec& budget, int64_t no_checkpoint_peak_bytes) {
  switch (budget.kind) {
    case BudgetSpec::Kind::kNone:
      return no_checkpoint_peak_bytes;
    case BudgetSpec::Kind::kBytes:
      return budget.bytes;
    case BudgetSpec::Kind::kFraction:
      break;
  }
  const double bytes = std::round(
      budget.fraction * static_cast<double>(no_checkpoint_peak_bytes));
  return std::max<int64_t>(1, static_cast<int64_t>(bytes));
}

std::string BudgetSpec::to_string() const {
  char text[64];
  switch (kind) {
    case Kind::kNone:
      return "none";
    case Kind::kFraction:
      std::snprintf(text, sizeof(text), "%g%%", fraction * 100.0);
      return text;
    case Kind::kBytes:
      break;
  }
  return format_bytes(bytes) + " (" + std::to_string(bytes) + " bytes)";
}

std::string format_bytes(int64_t bytes) {
  const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  const std::string sign = bytes < 0 ? "-" : "";
  double value = std::fabs(static_cast<double>(bytes));
  int unit = 0;
  while (value >= 1024.0 && unit < 6) {
    value /= 1024.0;
    ++unit;
  }
  char text[64];
  if (unit == 0) {
    std::snprintf(text, sizeof(text), "%.0f %s", value, kUnits[unit]);
  } else if (value < 10) {
    std::snprintf(text, sizeof(text), "%.2f %s", value, kUnits[unit]);
  } else if (value < 100) {
    std::snprintf(text, sizeof(text), "%.1f %s", value, kUnits[unit]);
  } else {
    std::snprintf(text, sizeof(text), "%.0f %s", value, kUnits[unit]);
  }
  return sign + text;
}

}  // namespace remat::cli
