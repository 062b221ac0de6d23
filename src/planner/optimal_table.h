// Private: solve_optimal's DP table as a flat vector, and solve_optimal's
// plan with either fill, for tests that compare the fill solve_optimal uses
// (pruned, vectorized, grouped) with the plain definition of the DP. Not part
// of the public API.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "remat/planner/chain.h"
#include "remat/planner/plan.h"
#include "remat/planner/solvers.h"

namespace remat::planner::detail {

/// Which fill computes the table.
enum class FillKind {
  kFiltered,   ///< the fill solve_optimal uses (pruned, vectorized)
  kReference,  ///< every option at every m, no pruning, scalar
};

/// Every stored time of solve_optimal's table for (chain, budget_bytes,
/// memory_slots), segments in table order, m ascending; empty when
/// solve_optimal does not fill a table (store-all fits, or nothing fits
/// after rounding). kFiltered fills with `threads` threads (the reference
/// fill is single-threaded). REQUIRES: budget_bytes > 0, memory_slots >= 1,
/// threads >= 1.
std::vector<double> optimal_time_table(
    const Chain& chain,
    int64_t budget_bytes,
    int64_t memory_slots,
    FillKind kind,
    int64_t threads = 1);

/// solve_optimal(chain, budget_bytes, options) with its table filled by
/// `kind`: kFiltered is solve_optimal itself; kReference gives the plan of
/// the plain DP, which the filtered fill must equal plan for plan. Throws
/// as solve_optimal.
std::optional<Plan> optimal_plan(
    const Chain& chain,
    int64_t budget_bytes,
    const SolverOptions& options,
    FillKind kind);

}  // namespace remat::planner::detail
