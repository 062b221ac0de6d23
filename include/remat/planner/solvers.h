// remat/planner/solvers.h: strategies that turn a Chain into a Plan.
//
// Every solver returns a plan that simulate() accepts; the budgeted ones
// return std::nullopt when no plan of theirs fits (an expected outcome, not an
// error). Budgets are in bytes and count what simulate() counts (the chain
// input x_0 included).
#pragma once

#include <cstdint>
#include <optional>

#include "remat/planner/chain.h"
#include "remat/planner/plan.h"

namespace remat::planner {

/// Options of solve_optimal.
struct SolverOptions {
  /// Number of slots the budget (minus the chain input) is divided into. Each
  /// size is rounded up to whole slots, so plans never exceed the budget;
  /// more slots: closer to the exact optimum, slower (time and table memory
  /// grow linearly). With slots >= budget_bytes the solve is exact; see
  /// solve_optimal for when fewer slots are exact too.
  /// Default: 500. REQUIRES: >= 1.
  int64_t memory_slots = 500;
  /// Threads that fill the DP table (the calling thread is one of them);
  /// 0: one per hardware thread (std::thread::hardware_concurrency()), but
  /// only one per 48 stages (short chains solve in about a millisecond on
  /// one). The plan does not depend on it. Default: 0. REQUIRES: >= 0.
  int64_t threads = 0;
};

/// Records every stage, then runs every backward: fastest, most memory.
/// Example: "R0 R1 R2 B2 B1 B0" for three stages.
Plan solve_store_all(const Chain& chain);

/// torch.utils.checkpoint.checkpoint_sequential semantics: segments of
/// size L / segments; the last segment takes the remainder and is recorded in
/// the first forward; every earlier segment keeps only its input (its first
/// stage kForwardCheckpoint, the rest kForwardNoSave) and is re-run with
/// kForwardRecord right before its backwards. `segments` > L is treated as L.
/// Throws std::invalid_argument if segments < 1.
///
/// Example: solve_uniform(chain4, 2) == "C0 N1 R2 R3 B3 B2 R0 R1 B1 B0".
Plan solve_uniform(const Chain& chain, int64_t segments);

/// Chen et al. (2016) sqrt(L) checkpointing: solve_uniform with
/// max(1, round(sqrt(L))) segments.
Plan solve_sqrt(const Chain& chain);

/// Chen et al. (2016) greedy segmentation with its budget search: for each
/// candidate segment threshold, walk the chain and close a segment once its
/// recorded bytes exceed the threshold; each segmentation becomes a plan like
/// solve_uniform's. Returns the fastest candidate whose simulated peak is
/// <= budget_bytes (ties: lower peak), or std::nullopt if none fits.
/// Throws std::invalid_argument if budget_bytes <= 0.
std::optional<Plan> solve_chen_greedy(const Chain& chain, int64_t budget_bytes);

/// The optimal plan under a byte budget: the dynamic program of Beaumont et
/// al. (rotor, 2019) over (first stage, last stage, memory slots) with all
/// three forward kinds. Optimal up to the rounding of sizes to slots. Exact
/// when options.memory_slots >= budget_bytes - input_bytes, and also when
/// every byte size of the chain is a multiple of some f with
/// budget_bytes - input_bytes <= options.memory_slots * f (the slot is then
/// their greatest common divisor; activations of one shape share a factor). The
/// simulated peak of the result is <= budget_bytes. Returns std::nullopt
/// exactly when budget_bytes < min_feasible_budget_bytes(chain) (if rounding
/// leaves no plan but the budget is feasible, the minimum-memory plan is
/// returned). At a budget >= the store-all peak, returns
/// solve_store_all(chain). Throws std::invalid_argument if budget_bytes <= 0 or
/// options.memory_slots < 1.
///
/// Example:
///   std::optional<Plan> plan = solve_optimal(chain, 64 << 20);
///   if (!plan) { /* the budget is below min_feasible_budget_bytes(chain) */ }
std::optional<Plan> solve_optimal(
    const Chain& chain,
    int64_t budget_bytes,
    const SolverOptions& options = {});

/// The smallest budget (bytes, x_0 included) at which some valid plan fits:
/// the exact minimum of simulate().peak_bytes over all plans of the rotor
/// form. Never throws.
int64_t min_feasible_budget_bytes(const Chain& chain);

/// A plan whose simulated peak is min_feasible_budget_bytes(chain) (fastest
/// is not a goal). Used by solve_optimal when slot rounding is too coarse.
Plan solve_min_memory(const Chain& chain);

}  // namespace remat::planner
