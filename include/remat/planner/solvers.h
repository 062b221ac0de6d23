// remat/planner/solvers.h: strategies that turn a Chain into a Plan.
//
// Every solver returns a plan that simulate() accepts; the budgeted ones
// return std::nullopt when no plan of theirs fits (an expected outcome, not an
// error). Budgets are in bytes and count what simulate() counts (the chain
// input x_0 included).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "remat/planner/chain.h"
#include "remat/planner/graph.h"
#include "remat/planner/plan.h"

namespace remat::planner {

/// Options of solve_optimal.
/// The default of SolverOptions::graph_search_work: 30–50 ms of one core
/// here for each of the two graph searches it bounds.
inline constexpr int64_t kMaxExactGraphWork = 1000000;

struct SolverOptions {
  /// Memory resolution: the number of slots the budget (minus the chain
  /// input) is divided into. Plans never exceed the budget whatever the
  /// count; more slots: closer to the exact optimum, slower (time and table
  /// memory grow linearly). Exact when >= budget_bytes - input_bytes (and
  /// in the cases docs/planner.md lists). Default: 500. REQUIRES: >= 1.
  int64_t memory_slots = 500;
  /// Threads that fill the DP table, the calling thread included; 0: chosen
  /// from the chain length and std::thread::hardware_concurrency() (see
  /// docs/planner.md). The plan does not depend on it. Default: 0.
  /// REQUIRES: >= 0.
  int64_t threads = 0;
  /// Graphs only: the work (search nodes, each weighted by its depth; each
  /// simulated plan four per stage) after which the window search and,
  /// separately, the exact branch and bound give up and the graph solvers
  /// keep the best plan found. More lets the exact search finish on larger
  /// graphs and tighter budgets, where its answer is the best of the plan
  /// class (docs/planner.md, "Graphs", says where the default does). The
  /// local search before them stops at the larger of this and 10^8 (seconds
  /// on a graph of thousands of stages). Default: kMaxExactGraphWork.
  /// REQUIRES: >= 0.
  int64_t graph_search_work = kMaxExactGraphWork;
};

/// The longest chain the exact solvers (solve_optimal,
/// min_feasible_budget_bytes, solve_min_memory) take: their work grows as
/// L^3 and their tables as L^2 (times the memory slots for solve_optimal), so
/// a longer chain is refused with std::invalid_argument naming its length
/// and this limit, rather than running for minutes or exhausting memory.
/// The segment solvers (store-all, uniform, sqrt, chen) take any length.
inline constexpr int64_t kMaxExactStages = 1000;

/// The largest time table solve_optimal fills, in cells: L (L + 1) / 2
/// segments times memory_slots + 1 slots (4 bytes each: 1000 stages at the
/// default 500 slots are 2.5e8 cells, about 1 GB). A larger one is refused
/// with std::invalid_argument naming its size: use fewer memory slots.
inline constexpr int64_t kMaxOptimalTableCells = 300'000'000;

/// Records every stage, then runs every backward: fastest, most memory.
///
/// Example:
// clang-format off
///   solve_store_all(chain3).to_string() == "R0 R1 R2 B2 B1 B0"  // 3 stages
// clang-format on
Plan solve_store_all(const Chain& chain);

/// torch.utils.checkpoint.checkpoint_sequential semantics: segments of
/// size L / segments; the last segment takes the remainder and is recorded in
/// the first forward; every earlier segment keeps only its input (its first
/// stage kForwardCheckpoint, the rest kForwardNoSave) and is re-run with
/// kForwardRecord right before its backwards. `segments` > L is treated as L.
/// Throws std::invalid_argument if segments < 1.
///
/// Example:
// clang-format off
///   solve_uniform(chain4, 2).to_string() == "C0 N1 R2 R3 B3 B2 R0 R1 B1 B0"
// clang-format on
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

/// The fastest plan under a byte budget: the rotor dynamic program
/// (Beaumont et al., 2019) over all three forward kinds, optimal up to the
/// rounding of sizes to options.memory_slots slots (how it works and when it
/// is exact: see docs/planner.md). The simulated peak of the result is
/// <= budget_bytes. Returns solve_store_all(chain) when budget_bytes >= its
/// peak, and std::nullopt exactly when budget_bytes <
/// min_feasible_budget_bytes(chain); when rounding leaves no plan but the
/// budget is feasible, returns solve_min_memory(chain). The plan does not
/// depend on options.threads.
/// Throws std::invalid_argument if budget_bytes <= 0,
/// options.memory_slots < 1 or options.threads < 0, or, when the budget is
/// below the store-all peak, if the chain has more than kMaxExactStages
/// stages or its table more than kMaxOptimalTableCells cells.
///
/// Example:
// clang-format off
///   std::optional<Plan> plan = solve_optimal(chain, 64 << 20);
///   if (!plan) { /* the budget is below min_feasible_budget_bytes(chain) */ }
// clang-format on
std::optional<Plan> solve_optimal(
    const Chain& chain,
    int64_t budget_bytes,
    const SolverOptions& options = {});

/// The smallest budget (bytes, x_0 included) at which some valid plan fits:
/// the exact minimum of simulate().peak_bytes over all plans of the rotor
/// form. Throws std::invalid_argument if the chain has more than
/// kMaxExactStages stages.
int64_t min_feasible_budget_bytes(const Chain& chain);

/// A plan whose simulated peak is min_feasible_budget_bytes(chain) (fastest
/// is not a goal). Used by solve_optimal when slot rounding is too coarse.
/// Throws std::invalid_argument if the chain has more than kMaxExactStages
/// stages.
Plan solve_min_memory(const Chain& chain);

// ---- Graphs (remat/planner/graph.h) ----
//
// On a graph that is a chain (Graph::is_chain) the graph solvers are the
// chain solvers above, with their guarantees. On other graphs they search
// the plans schedule_graph() builds (each stage run in one of the ways of
// StageMode): exhaustively when there are at most kMaxExhaustiveGraphPlans
// of them, otherwise by a local search, then every combination of ways on
// small windows of stages, then an exact branch and bound that keeps the
// best plan found when it reaches SolverOptions::graph_search_work (then
// the answer may
// not be the best of the class; docs/planner.md, "Graphs", says on which
// graphs it finishes). Graph budgets are exact bytes
// (SolverOptions::memory_slots does not apply).

/// How schedule_graph() runs a stage.
enum class StageMode {
  /// Recorded in the forward pass (kForwardRecord); its backward needs
  /// nothing more. The fastest way.
  kRecord,
  /// Recorded under the stage's per-op policy (kForwardSelective). Only for
  /// stages with a SelectiveCost.
  kSelective,
  /// Run without recording in the forward pass; its output is kept until
  /// the last stage reading it has run its backward, and the stage is
  /// recorded again (kForwardRecord) right before its own backward.
  kCheckpoint,
  /// Run without recording in the forward pass; its output is dropped after
  /// the forward pass has read it, and the stage is recorded again when the
  /// backward pass first needs its output or its record.
  kRecompute,
};

/// The plan that runs stage i of `graph` in modes[i]: the forward pass in
/// stage order, then each stage's backward in reverse order, each preceded
/// by the recorded recomputations it needs (docs/planner.md, "Graphs"). The
/// last stage is always recorded (kCheckpoint and kRecompute count as
/// kRecord there). simulate() accepts the result.
/// Throws std::invalid_argument unless modes has one entry per stage, and
/// naming the stage if kSelective is given for a stage without a
/// SelectiveCost.
Plan schedule_graph(const Graph& graph, const std::vector<StageMode>& modes);

/// The largest number of schedule_graph() plans (mode combinations) the
/// graph solvers try one by one; above it they search locally.
inline constexpr int64_t kMaxExhaustiveGraphPlans = 6561;  // 3^8

/// Records every stage, then runs every backward.
Plan solve_store_all(const Graph& graph);

/// The fastest plan found within `budget_bytes` (see the top of this
/// section); on a chain, solve_optimal(graph.as_chain(), ...). Returns
/// std::nullopt exactly when budget_bytes < min_feasible_budget_bytes(graph,
/// options). Throws std::invalid_argument as the chain's solve_optimal, if
/// budget_bytes <= 0, and if options.graph_search_work < 0.
std::optional<Plan> solve_optimal(
    const Graph& graph,
    int64_t budget_bytes,
    const SolverOptions& options = {});

/// The least simulated peak of the plans the graph solvers find (on a
/// chain: the chain's exact minimum); bytes, x_0 included. Of `options`,
/// only graph_search_work applies. Throws std::invalid_argument if it is
/// < 0.
int64_t min_feasible_budget_bytes(
    const Graph& graph, const SolverOptions& options = {});

/// A plan whose simulated peak is min_feasible_budget_bytes(graph,
/// options). Throws as min_feasible_budget_bytes.
Plan solve_min_memory(const Graph& graph, const SolverOptions& options = {});

}  // namespace remat::planner
