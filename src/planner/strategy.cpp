// strategy.cpp: Strategy's text form, and solve(), the one place that maps a
// strategy onto its solver.
#include "remat/planner/strategy.h"

#include <cctype>
#include <cstdlib>
#include <stdexcept>

namespace remat::planner {
namespace {

[[noreturn]] void reject(std::string_view text, const std::string& why) {
  std::string message =
      "expected optimal, chen, sqrt, uniform:K (K >= 1 segments) or none; "
      "got '" +
      std::string(text) + "'";
  if (!why.empty()) {
    message += " (" + why + ")";
  }
  throw std::invalid_argument(message);
}

}  // namespace

Strategy Strategy::parse(std::string_view text) {
  Strategy strategy;
  if (text == "optimal") {
    strategy.kind = Kind::kOptimal;
  } else if (text == "chen") {
    strategy.kind = Kind::kChen;
  } else if (text == "sqrt") {
    strategy.kind = Kind::kSqrt;
  } else if (text == "none") {
    strategy.kind = Kind::kNone;
  } else if (text.substr(0, 7) == "uniform") {
    const std::string_view count = text.substr(7);
    if (count.size() < 2 || count[0] != ':') {
      reject(text, "uniform needs a segment count, e.g. uniform:4");
    }
    const std::string digits(count.substr(1));
    for (char c : digits) {
      if (!std::isdigit(static_cast<unsigned char>(c))) {
        reject(text, "the segment count must be a whole number >= 1");
      }
    }
    if (digits.size() > 9 || std::atoll(digits.c_str()) < 1) {
      reject(text, "the segment count must be between 1 and 999999999");
    }
    strategy.kind = Kind::kUniform;
    strategy.segments = std::atoll(digits.c_str());
  } else {
    reject(text, "");
  }
  return strategy;
}

std::string Strategy::to_string() const {
  switch (kind) {
    case Kind::kOptimal:
      return "optimal";
    case Kind::kChen:
      return "chen";
    case Kind::kSqrt:
      return "sqrt";
    case Kind::kUniform:
      return "uniform:" + std::to_string(segments);
    case Kind::kNone:
      return "none";
  }
  return "?";
}

std::optional<Plan> solve(
    const Chain& chain,
    const Strategy& strategy,
    int64_t budget_bytes,
    const SolverOptions& options) {
  switch (strategy.kind) {
    case Strategy::Kind::kOptimal:
      return solve_optimal(chain, budget_bytes, options);
    case Strategy::Kind::kChen:
      return solve_chen_greedy(chain, budget_bytes);
    case Strategy::Kind::kSqrt:
      return solve_sqrt(chain);
    case Strategy::Kind::kUniform:
      return solve_uniform(chain, strategy.segments);
    case Strategy::Kind::kNone:
      return solve_store_all(chain);
  }
  return std::nullopt;
}

}  // namespace remat::planner
