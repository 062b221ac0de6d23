// budget.cpp: Budget's constructors, its text grammar and its resolution
// against a chain.
#include "remat/budget.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include <c10/util/Exception.h>

#include "remat/planner/simulate.h"
#include "remat/planner/solvers.h"
#include "remat/planner/units.h"

namespace remat {
namespace {

constexpr int64_t kMaxBytes = int64_t{1} << 60;  // 1 EiB

std::string lowercase(std::string text) {
  for (char& c : text) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return text;
}

std::string trim(const std::string& text) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) {
    return "";
  }
  const size_t last = text.find_last_not_of(" \t\r\n");
  return text.substr(first, last - first + 1);
}

/// Bytes per unit (lowercase), or 0 for an unknown unit.
int64_t unit_multiplier(const std::string& unit) {
  static const std::pair<const char*, int64_t> kUnits[] = {
      {"", 1},
      {"b", 1},
      {"kb", 1000},
      {"mb", 1000 * 1000},
      {"gb", int64_t{1000} * 1000 * 1000},
      {"tb", int64_t{1000} * 1000 * 1000 * 1000},
      {"kib", int64_t{1} << 10},
      {"mib", int64_t{1} << 20},
      {"gib", int64_t{1} << 30},
      {"tib", int64_t{1} << 40},
  };
  for (const auto& [name, multiplier] : kUnits) {
    if (unit == name) {
      return multiplier;
    }
  }
  return 0;
}

[[noreturn]] void reject(const std::string& text, const std::string& why) {
  TORCH_CHECK(
      false,
      "remat::Budget::parse: expected bytes (512MiB, 1GiB, 300MB, 1000000B), "
      "a percentage of the store-all peak in (0%, 100%] (50%), a total "
      "for the whole step with the model state (total:16GiB) or 'none'; "
      "got '",
      text,
      "' (",
      why,
      ")");
  std::abort();  // unreachable: TORCH_CHECK(false) throws
}

}  // namespace

Budget Budget::none() {
  return Budget();
}

Budget Budget::bytes(int64_t budget_bytes) {
  TORCH_CHECK(
      budget_bytes > 0,
      "remat::Budget::bytes: expected a positive number of bytes, got ",
      budget_bytes);
  Budget budget;
  budget.kind_ = Kind::kBytes;
  budget.bytes_ = budget_bytes;
  return budget;
}

Budget Budget::fraction(double fraction) {
  if (!(fraction > 0 && fraction <= 1)) {
    // Every digit: a fraction just above 1 must not print as 1.
    char text[40];
    std::snprintf(text, sizeof(text), "%.17g", fraction);
    TORCH_CHECK(
        false,
        "remat::Budget::fraction: expected a fraction of the store-all peak "
        "in (0, 1], got ",
        text);
  }
  Budget budget;
  budget.kind_ = Kind::kFraction;
  budget.fraction_ = fraction;
  return budget;
}

Budget Budget::total(int64_t total_bytes) {
  TORCH_CHECK(
      total_bytes > 0,
      "remat::Budget::total: expected a positive number of bytes, got ",
      total_bytes);
  Budget budget;
  budget.kind_ = Kind::kTotal;
  budget.bytes_ = total_bytes;
  return budget;
}

namespace {

// Bytes or a percentage: `body` is the part of `text` after any "total:".
Budget parse_amount(const std::string& text, const std::string& body) {
  const std::string trimmed = trim(body);
  if (trimmed.empty()) {
    reject(text, "no number");
  }
  if (trimmed[0] == '-') {
    reject(text, "a budget must be positive");
  }
  // The number: digits with at most one decimal point.
  size_t end = 0;
  bool seen_point = false;
  bool seen_digit = false;
  for (; end < trimmed.size(); ++end) {
    const char c = trimmed[end];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      seen_digit = true;
    } else if (c == '.' && !seen_point) {
      seen_point = true;
    } else {
      break;
    }
  }
  if (!seen_digit) {
    reject(text, "no number");
  }
  const std::string number = trimmed.substr(0, end);
  const std::string unit_text = trim(trimmed.substr(end));
  const std::string unit = lowercase(unit_text);

  if (unit == "%") {
    const double value = std::strtod(number.c_str(), nullptr);
    if (!(value > 0)) {
      reject(text, "a percentage must be above 0%");
    }
    if (value > 100) {
      reject(
          text,
          "a percentage must be at most 100%: 100% is the store-all peak, "
          "where nothing is recomputed");
    }
    return Budget::fraction(value / 100.0);
  }
  const int64_t multiplier = unit_multiplier(unit);
  if (multiplier == 0) {
    reject(
        text,
        "unknown unit '" + unit_text +
            "'; units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB, %");
  }
  // Bytes in integers, exactly: whole digits times the unit, plus the
  // decimal digits times the unit over 10^decimals, which must divide.
  const size_t point = number.find('.');
  const std::string whole = number.substr(0, point);
  std::string decimals =
      point == std::string::npos ? "" : number.substr(point + 1);
  while (!decimals.empty() && decimals.back() == '0') {
    decimals.pop_back();
  }
  const size_t significant = whole.find_first_not_of('0');
  if (significant != std::string::npos && whole.size() - significant > 19) {
    reject(text, "too large; at most 1 EiB");
  }
  if (decimals.size() > 18) {
    reject(text, "more than 18 decimals");
  }
  const __int128 whole_value =
      whole.empty() ? 0 : static_cast<__int128>(std::stoull(whole));
  const __int128 decimal_value =
      decimals.empty() ? 0 : static_cast<__int128>(std::stoull(decimals));
  __int128 scale = 1;
  for (size_t k = 0; k < decimals.size(); ++k) {
    scale *= 10;
  }
  const __int128 fraction_bytes = decimal_value * multiplier;
  if (fraction_bytes % scale != 0) {
    reject(text, "not a whole number of bytes");
  }
  const __int128 bytes = whole_value * multiplier + fraction_bytes / scale;
  if (bytes < 1) {
    reject(text, "a budget must be at least 1 byte");
  }
  if (bytes > kMaxBytes) {
    reject(text, "too large; at most 1 EiB");
  }
  return Budget::bytes(static_cast<int64_t>(bytes));
}

}  // namespace

Budget Budget::parse(const std::string& text) {
  const std::string trimmed = trim(text);
  if (trimmed.empty()) {
    reject(text, "empty");
  }
  if (lowercase(trimmed) == "none") {
    return Budget::none();
  }
  const std::string total_prefix = "total:";
  if (lowercase(trimmed.substr(0, total_prefix.size())) == total_prefix) {
    const std::string rest = trimmed.substr(total_prefix.size());
    const std::string rest_trimmed = trim(rest);
    if (!rest_trimmed.empty() && rest_trimmed.back() == '%') {
      reject(text, "a total budget is bytes (total:16GiB), not a percentage");
    }
    if (lowercase(rest_trimmed) == "none") {
      reject(text, "a total budget is bytes (total:16GiB)");
    }
    const Budget amount = parse_amount(text, rest);
    return Budget::total(amount.budget_bytes());
  }
  return parse_amount(text, trimmed);
}

namespace {

// What a budget resolves to on a model (a chain or a graph) with this model
// state, these resident bytes and this store-all peak (see the header).
int64_t resolve(
    const Budget& budget,
    const planner::ModelState& state,
    int64_t resident,
    int64_t store_all_peak) {
  switch (budget.kind()) {
    case Budget::Kind::kBytes:
      return budget.budget_bytes();
    case Budget::Kind::kTotal:
      TORCH_CHECK(
          budget.budget_bytes() > state.total_bytes(),
          "remat::Budget: the budget ",
          budget.to_string(),
          " leaves nothing for activations: the model state alone is ",
          planner::format_bytes(state.total_bytes()),
          " (parameters ",
          planner::format_bytes(state.parameter_bytes),
          ", gradients ",
          planner::format_bytes(state.gradient_bytes),
          ", optimizer state ",
          planner::format_bytes(state.optimizer_bytes),
          ")");
      return budget.budget_bytes() - state.total_bytes();
    case Budget::Kind::kNone:
      return store_all_peak;
    case Budget::Kind::kFraction:
      break;
  }
  // A fraction of what plans can change: the resident bytes are in every
  // plan's peak, so they are not scaled.
  return std::max<int64_t>(
      1,
      resident + static_cast<int64_t>(std::floor(
                     budget.budget_fraction() *
                     static_cast<double>(store_all_peak - resident))));
}

}  // namespace

int64_t Budget::resolve_bytes(const planner::Chain& chain) const {
  return resolve(
      *this,
      chain.model_state(),
      chain.resident_bytes(),
      planner::simulate(chain, planner::solve_store_all(chain)).peak_bytes);
}

int64_t Budget::resolve_bytes(const planner::Graph& graph) const {
  return resolve(
      *this,
      graph.model_state(),
      /*resident=*/0,
      planner::simulate(graph, planner::solve_store_all(graph)).peak_bytes);
}

std::string Budget::to_string() const {
  switch (kind_) {
    case Kind::kNone:
      return "none";
    case Kind::kFraction: {
      char text[64];
      std::snprintf(text, sizeof(text), "%g%%", fraction_ * 100.0);
      return std::string(text) + " of the store-all peak";
    }
    case Kind::kTotal:
      return "total " + planner::format_bytes(bytes_) + " (" +
             std::to_string(bytes_) + " bytes) with the model state";
    case Kind::kBytes:
      break;
  }
  return planner::format_bytes(bytes_) + " (" + std::to_string(bytes_) +
         " bytes)";
}

}  // namespace remat
