// remat/planner/strategy.h: the named ways to plan a chain, as users spell
// them ("optimal", "chen", "sqrt", "uniform:4", "none"), and the one function
// that turns a name and a budget into a plan.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "remat/planner/chain.h"
#include "remat/planner/plan.h"
#include "remat/planner/solvers.h"

namespace remat::planner {

/// A way to make a plan.
struct Strategy {
  enum class Kind {
    kOptimal,  ///< solve_optimal: the fastest plan within the budget
    kChen,     ///< solve_chen_greedy: Chen et al.'s segmentation
    kSqrt,     ///< solve_sqrt: sqrt(L) uniform segments
    kUniform,  ///< solve_uniform(segments): checkpoint_sequential's schedule
    kNone,     ///< solve_store_all: no checkpointing
  };
  Kind kind = Kind::kOptimal;
  /// Segments, for kUniform; >= 1.
  int64_t segments = 0;

  /// Parses "optimal", "chen", "sqrt", "uniform:K" (1 <= K <= 999999999) or
  /// "none". Throws std::invalid_argument naming the text and the accepted
  /// forms, e.g. "expected optimal, chen, sqrt, uniform:K (K >= 1 segments)
  /// or none; got 'nope'".
  static Strategy parse(std::string_view text);
  /// The text form parse() accepts: "optimal", "uniform:4", ...
  std::string to_string() const;
  /// True for optimal and chen, whose plan depends on the budget.
  bool uses_budget() const {
    return kind == Kind::kOptimal || kind == Kind::kChen;
  }
};

/// The plan `strategy` makes for `chain`. Optimal and chen plan within
/// `budget_bytes` (simulate()'s units) and return std::nullopt when no plan
/// of theirs fits; the others ignore the budget (their peak may exceed it:
/// check with simulate()). `options` apply to optimal. Throws
/// std::invalid_argument as the solvers do.
std::optional<Plan> solve(
    const Chain& chain,
    const Strategy& strategy,
    int64_t budget_bytes,
    const SolverOptions& options = {});

}  // namespace remat::planner
