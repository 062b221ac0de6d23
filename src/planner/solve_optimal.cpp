// solve_optimal, min_feasible_budget_bytes and solve_min_memory: the rotor
// dynamic program (Beaumont et al., 2019) on the memory model of simulate.cpp
// (NOTE: [The memory model]). The recurrence itself (segments, their options
// and when each is feasible) is segment_recurrence.h (NOTE: [The segment
// recurrence]); the fill of the time table, and how it is made fast, is
// segment_fill.cpp; this file computes the bounds of every segment, sets the
// table up, and walks the chosen options into a plan.
//
// Memory is counted in units: bytes (exact; min_feasible_budget_bytes,
// solve_min_memory) or slots of unit_bytes with every size rounded UP, so a
// plan that fits in slots fits in bytes. When every size is a multiple of a
// common factor that gives at most SolverOptions::memory_slots slots, the
// slot is that factor and the DP is exact (slot_bytes). The time table
// (segment_table.h, float) holds every segment for m in [lo, max_slots];
// below lo nothing fits, from hi on recording everything fits and is fastest
// (stored as a constant tail). The fill is O(L^3 * slots) and runs on
// SolverOptions::threads threads (fill_threads).
//
// Not supported: non-chain graphs, offloading, plans that drop a checkpoint
// before its backward (the op set has no drop).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "check.h"
#include "optimal_table.h"
#include "remat/planner/simulate.h"
#include "remat/planner/solvers.h"
#include "segment_fill.h"
#include "segment_recurrence.h"
#include "segment_table.h"

namespace remat::planner {
namespace {

using detail::fill_table;
using detail::FillKind;
using detail::kInfeasible;
using detail::option_time;
using detail::RecordKind;
using detail::Recurrence;
using detail::reference_fill;
using detail::SegmentArray;
using detail::SegmentCell;
using detail::SegmentCostTable;
using detail::SegmentOption;
using detail::SplitAt;
using detail::Time;
using detail::UnitChain;
using detail::UnitRecord;

// The cells of every segment with their bounds (lo, hi, all_ms), no rows
// yet. O(L^3). lo is the least `from` of the segment's options; hi and
// all_ms follow "record every stage". Segments go a descending, b ascending.
// The record options come from the Recurrence; the splits, which are the
// O(L^3) part, from plain arrays: per a, each split's forwards (peak and
// kept value, SplitAt) once for every b, the lo of (a, j - 1) as this pass
// writes it, and the lo of (j, b) from a dense copy whose column b lies
// side by side in memory; each split's `from` is SplitAt::from, the one
// the Recurrence gives.
SegmentArray<SegmentCell> segment_bounds(const UnitChain& chain) {
  const int64_t n = chain.size();
  SegmentArray<SegmentCell> cells(n);
  SegmentArray<int64_t> lo_of(n);  // cells' lo, dense
  const Recurrence recurrence(chain, cells);
  std::vector<int64_t> peak_units(n);  // of split j of segments from a
  std::vector<int64_t> kept_units(n);
  std::vector<int64_t> row_lo(n);  // lo of (a, b) for the current a
  for (int64_t a = n - 1; a >= 0; --a) {
    if (a + 1 < n) {
      for (SplitAt split = recurrence.first_split(a);; split.advance()) {
        peak_units[split.split()] = split.peak_units();
        kept_units[split.split()] = split.kept_units();
        if (split.split() == n - 1) {
          break;
        }
      }
    }
    for (int64_t b = a; b < n; ++b) {
      const UnitRecord& r = chain.stage(a).record;
      const int64_t own = chain.record_units(a, b);
      SegmentCell& cell = cells.at(a, b);
      int64_t lo = std::numeric_limits<int64_t>::max();
      if (a == b) {
        cell.hi = own;
        cell.all_ms = static_cast<Time>(r.ms);
        lo = own;
      } else {
        const SegmentCell& rest = cells.at(a + 1, b);
        cell.hi = std::max(own, r.saved_units + rest.hi);
        // In the table's float, summed as the record option sums it, so
        // that no option's float time falls below the tail (a selective
        // stage with no recomputation would otherwise undercut it by a
        // rounding step, and the fill's pruning relies on rows that never
        // rise with m).
        cell.all_ms = static_cast<Time>(r.ms) + static_cast<Time>(rest.all_ms);
        lo = std::min(lo, recurrence.record(a, b).from);
      }
      if (recurrence.has_selective(a)) {
        lo = std::min(lo, recurrence.record(a, b, RecordKind::kSelective).from);
      }
      const int64_t pending_grad_units = chain.pending_grad_units(b);
      const int64_t* first_lo = lo_of.column(b);  // lo of (j, b) at [j]
      for (int64_t j = a + 1; j <= b; ++j) {
        lo = std::min(
            lo,
            SplitAt::from(
                pending_grad_units,
                peak_units[j],
                kept_units[j],
                first_lo[j],
                row_lo[j - 1]));
      }
      cell.lo = lo;
      lo_of.at(a, b) = lo;
      row_lo[b] = lo;
    }
  }
  return cells;
}

// NOTE: [The chain walk]
// A plan is read off the recurrence top down: segment (0, L - 1) at the
// memory of the budget; each segment either records every stage (it fits
// store-all) or takes one option, which emits its own ops around the plans
// of its subsegments at the memory the option leaves them. A chooser decides
// per segment: the fastest option (from the table) or the first option of
// least memory (from the bounds alone).
template <typename Choose>
void walk(
    const Recurrence& recurrence,
    int64_t a,
    int64_t b,
    int64_t m,
    const Choose& choose,
    Plan& plan) {
  REMAT_PLANNER_CHECK(
      m >= recurrence.cell(a, b).lo, "the walk gave a segment too little");
  const std::optional<SegmentOption> option = choose(a, b, m);
  if (!option) {
    for (int64_t i = a; i <= b; ++i) {
      plan.ops.push_back({OpKind::kForwardRecord, i});
    }
    for (int64_t i = b; i >= a; --i) {
      plan.ops.push_back({OpKind::kBackward, i});
    }
    return;
  }
  REMAT_PLANNER_CHECK(m >= option->from, "the chosen option does not fit");
  if (option->is_record()) {
    plan.ops.push_back(
        {option->is_selective() ? OpKind::kForwardSelective
                                : OpKind::kForwardRecord,
         a});
    if (a < b) {
      walk(recurrence, a + 1, b, m - option->shift, choose, plan);
    }
    plan.ops.push_back({OpKind::kBackward, a});
    return;
  }
  const int64_t j = option->split;
  plan.ops.push_back({OpKind::kForwardCheckpoint, a});
  for (int64_t k = a + 1; k < j; ++k) {
    plan.ops.push_back({OpKind::kForwardNoSave, k});
  }
  walk(recurrence, j, b, m - option->shift, choose, plan);
  walk(recurrence, a, j - 1, m, choose, plan);
}

// The fastest plan of the whole chain at max_slots: per segment, record
// everything from hi on, else the first option, in the fill's order, whose
// time (the fill's float expression) is the least.
Plan fastest_plan(const Recurrence& recurrence, const SegmentCostTable& table) {
  const auto fastest = [&](int64_t a, int64_t b, int64_t m) {
    std::optional<SegmentOption> best;
    if (m >= recurrence.cell(a, b).hi) {
      return best;
    }
    Time best_time = kInfeasible;
    recurrence.for_each_option(a, b, [&](const SegmentOption& option) {
      if (m < option.from) {
        return;
      }
      const Time time = option_time(option, m);
      if (!best || time < best_time) {
        best_time = time;
        best = option;
      }
    });
    REMAT_PLANNER_CHECK(best.has_value(), "no option fits above lo");
    return best;
  };
  Plan plan;
  walk(
      recurrence,
      0,
      recurrence.chain().size() - 1,
      table.max_slots(),
      fastest,
      plan);
  return plan;
}

// A plan of the whole chain that needs exactly its lo: per segment, the
// first option whose `from` is the segment's lo, each segment at its own lo
// (whatever more memory the walk leaves it).
Plan min_memory_plan(const Recurrence& recurrence) {
  const auto least = [&](int64_t a, int64_t b, int64_t /*m*/) {
    std::optional<SegmentOption> first;
    const int64_t lo = recurrence.cell(a, b).lo;
    if (a == b && lo == recurrence.cell(a, b).hi) {
      return first;  // recording the stage needs least
    }
    recurrence.for_each_option(a, b, [&](const SegmentOption& option) {
      if (!first && option.from == lo) {
        first = option;
      }
    });
    REMAT_PLANNER_CHECK(first.has_value(), "segment lo matches no option");
    return first;
  };
  const int64_t last = recurrence.chain().size() - 1;
  Plan plan;
  walk(recurrence, 0, last, recurrence.cell(0, last).lo, least, plan);
  return plan;
}

// Threads for fill_table: options.threads, or one per hardware thread but
// at most one per kStagesPerThread stages (on short chains the fill takes
// about a millisecond and a second thread only adds its start-up and
// hand-over: 1.8 ms with one thread, 2.3 ms with two at 50 stages).
int64_t fill_threads(const Chain& chain, const SolverOptions& options) {
  if (options.threads > 0) {
    return options.threads;
  }
  constexpr int64_t kStagesPerThread = 48;
  const int64_t hardware =
      std::max<int64_t>(1, std::thread::hardware_concurrency());
  return std::clamp<int64_t>(chain.size() / kStagesPerThread, 1, hardware);
}

// The greatest common divisor of every byte size the DP counts (0 when all
// are zero). Tensor sizes usually share a large power of two.
int64_t common_byte_factor(const Chain& chain) {
  int64_t factor = chain.input_bytes();
  for (const StageCost& s : chain.stages()) {
    for (int64_t bytes :
         {s.output_bytes,
          s.saved_bytes,
          s.forward_extra(),
          s.record_extra(),
          s.backward_extra(false)}) {
      factor = std::gcd(factor, bytes < 0 ? -bytes : bytes);
    }
    if (s.selective) {
      for (int64_t bytes :
           {s.selective->saved_bytes,
            s.selective_forward_extra(),
            s.backward_extra(true)}) {
        factor = std::gcd(factor, bytes < 0 ? -bytes : bytes);
      }
    }
  }
  return factor;
}

// Bytes per memory slot. By default ceil((budget - base) / slots), at least
// 1, with every size rounded up (a plan may lose up to a slot per value).
// When all sizes are multiples of a common factor at least that large, the
// factor itself: fewer slots and no rounding, so the DP is exact in bytes.
int64_t slot_bytes(
    const Chain& chain, int64_t budget_bytes, const SolverOptions& options) {
  // The DP divides what the base bytes (input, resident) leave.
  const int64_t available = budget_bytes - chain.base_bytes();
  const int64_t even_split = std::max<int64_t>(
      1,
      available / options.memory_slots +
          (available % options.memory_slots != 0 ? 1 : 0));
  const int64_t factor = common_byte_factor(chain);
  return factor >= even_split ? factor : even_split;
}

// solve_optimal's DP at one budget, set up: the chain in slots and, when
// the whole chain fits in the slots, the table (not yet filled) on the
// cells of every segment.
class SlotDp {
 public:
  SlotDp(const Chain& chain, int64_t budget_bytes, const SolverOptions& options)
      : unit_bytes_(slot_bytes(chain, budget_bytes, options)),
        units_(chain, unit_bytes_) {
    const int64_t max_slots = (budget_bytes - chain.base_bytes()) / unit_bytes_;
    SegmentArray<SegmentCell> cells = segment_bounds(units_);
    if (cells.at(0, units_.size() - 1).lo <= max_slots) {
      table_.emplace(std::move(cells), max_slots);
    }
  }

  // False when the sizes rounded up to slots leave no plan within the
  // budget (exactly, in bytes, one may fit).
  bool fits() const {
    return table_.has_value();
  }
  // REQUIRES: fits().
  void fill(FillKind kind, int64_t threads) {
    REMAT_PLANNER_CHECK(fits(), "no table to fill");
    const Recurrence recurrence(units_, table_->cells());
    if (kind == FillKind::kFiltered) {
      fill_table(recurrence, *table_, threads);
    } else {
      reference_fill(recurrence, *table_);
    }
  }
  // REQUIRES: fill() has run.
  Plan fastest_plan() const {
    REMAT_PLANNER_CHECK(fits(), "no table to read");
    return planner::fastest_plan(Recurrence(units_, table_->cells()), *table_);
  }
  // Every stored time, segments in table order, m ascending.
  std::vector<double> times() const {
    std::vector<double> times;
    if (!table_) {
      return times;
    }
    for (int64_t b = 0; b < units_.size(); ++b) {
      for (int64_t a = 0; a <= b; ++a) {
        const SegmentCell& row = table_->row(a, b);
        times.insert(times.end(), row.times, row.times + row.count);
      }
    }
    return times;
  }

 private:
  int64_t unit_bytes_;
  UnitChain units_;
  std::optional<SegmentCostTable> table_;
};

/// Refuses a chain longer than the exact solvers take (kMaxExactStages).
void check_exact_size(const char* function, const Chain& chain) {
  if (chain.size() > kMaxExactStages) {
    throw std::invalid_argument(
        std::string("remat::planner::") + function + ": a chain of " +
        std::to_string(chain.size()) +
        " stages is longer than the exact solvers take (at most " +
        std::to_string(kMaxExactStages) +
        " stages: their work grows as the cube of the length); group stages "
        "into larger ones, or use a segment strategy (sqrt, uniform:K, chen)");
  }
}

}  // namespace

int64_t min_feasible_budget_bytes(const Chain& chain) {
  check_exact_size("min_feasible_budget_bytes", chain);
  const UnitChain bytes(chain, 1);
  return chain.base_bytes() + segment_bounds(bytes).at(0, chain.size() - 1).lo;
}

Plan solve_min_memory(const Chain& chain) {
  check_exact_size("solve_min_memory", chain);
  const UnitChain bytes(chain, 1);
  const SegmentArray<SegmentCell> cells = segment_bounds(bytes);
  return min_memory_plan(Recurrence(bytes, cells));
}

namespace {

// solve_optimal with the table filled by `kind`: the pruned, grouped fill
// (kFiltered) or the plain one (kReference, for tests).
std::optional<Plan> solve_optimal_filled_by(
    const Chain& chain,
    int64_t budget_bytes,
    const SolverOptions& options,
    FillKind kind) {
  if (budget_bytes <= 0) {
    throw std::invalid_argument(
        "remat::planner::solve_optimal: budget_bytes: expected > 0, got " +
        std::to_string(budget_bytes));
  }
  if (options.memory_slots < 1) {
    throw std::invalid_argument(
        "remat::planner::solve_optimal: options.memory_slots: expected >= 1, "
        "got " +
        std::to_string(options.memory_slots));
  }
  if (options.threads < 0) {
    throw std::invalid_argument(
        "remat::planner::solve_optimal: options.threads: expected >= 0 (0: "
        "one per hardware thread), got " +
        std::to_string(options.threads));
  }
  Plan store_all = solve_store_all(chain);
  if (budget_bytes >= simulate(chain, store_all).peak_bytes) {
    return store_all;
  }
  check_exact_size("solve_optimal", chain);
  // The table holds times in float (segment_table.h): a chain whose times
  // pass float's range would fill it with infinities, which tie, and the
  // walk would take the first feasible option instead of the fastest.
  // Scaling every time by one power of two changes no comparison (float
  // rounding is relative); the plan's times come from simulate() anyway.
  double total_ms = 0;
  for (const StageCost& s : chain.stages()) {
    total_ms += s.forward_ms + s.backward_ms +
                (s.selective ? s.selective->recompute_ms : 0.0);
  }
  total_ms *= static_cast<double>(chain.size() + 1);
  constexpr double kTableTimeLimit =
      static_cast<double>(std::numeric_limits<Time>::max()) / 4;
  if (total_ms > kTableTimeLimit) {
    const int exponent = std::ilogb(total_ms / kTableTimeLimit) + 1;
    std::vector<StageCost> stages = chain.stages();
    for (StageCost& s : stages) {
      s.forward_ms = std::ldexp(s.forward_ms, -exponent);
      s.backward_ms = std::ldexp(s.backward_ms, -exponent);
      if (s.selective) {
        s.selective->recompute_ms =
            std::ldexp(s.selective->recompute_ms, -exponent);
      }
    }
    const Chain scaled(
        std::move(stages), chain.input_bytes(), chain.resident_bytes());
    return solve_optimal_filled_by(scaled, budget_bytes, options, kind);
  }
  // A slot is at least a byte: more slots than the bytes to divide change
  // nothing (slot_bytes gives one byte either way) but the table check.
  SolverOptions slot_options = options;
  slot_options.memory_slots = std::min(
      options.memory_slots,
      std::max<int64_t>(1, budget_bytes - chain.base_bytes()));
  const int64_t segments = chain.size() * (chain.size() + 1) / 2;
  if (segments > kMaxOptimalTableCells / (slot_options.memory_slots + 1)) {
    throw std::invalid_argument(
        "remat::planner::solve_optimal: a chain of " +
        std::to_string(chain.size()) + " stages at " +
        std::to_string(slot_options.memory_slots) +
        " memory slots needs a table of " + std::to_string(segments) + " x " +
        std::to_string(slot_options.memory_slots + 1) +
        " cells, more than the limit of " +
        std::to_string(kMaxOptimalTableCells) + "; use fewer memory slots");
  }
  // The exact (byte) feasibility test is an O(L^3) pass of its own; the
  // slot pass below answers "feasible" in almost every call, so it runs
  // only when that pass says no (or there is no memory to divide).
  const auto fastest_that_fits_bytes = [&]() -> std::optional<Plan> {
    if (budget_bytes < min_feasible_budget_bytes(chain)) {
      return std::nullopt;
    }
    return solve_min_memory(chain);
  };
  if (budget_bytes <= chain.base_bytes()) {
    return fastest_that_fits_bytes();
  }
  SlotDp dp(chain, budget_bytes, slot_options);
  if (!dp.fits()) {
    return fastest_that_fits_bytes();
  }
  dp.fill(kind, fill_threads(chain, options));
  Plan plan = dp.fastest_plan();
  const Simulation check = simulate(chain, plan);
  REMAT_PLANNER_CHECK(check.valid, "the optimal plan is not valid");
  REMAT_PLANNER_CHECK(
      check.peak_bytes <= budget_bytes, "the optimal plan exceeds the budget");
  return plan;
}

}  // namespace

std::optional<Plan> solve_optimal(
    const Chain& chain, int64_t budget_bytes, const SolverOptions& options) {
  return solve_optimal_filled_by(
      chain, budget_bytes, options, FillKind::kFiltered);
}

namespace detail {

std::vector<double> optimal_time_table(
    const Chain& chain,
    int64_t budget_bytes,
    int64_t memory_slots,
    FillKind kind,
    int64_t threads) {
  if (budget_bytes >= simulate(chain, solve_store_all(chain)).peak_bytes ||
      budget_bytes < min_feasible_budget_bytes(chain)) {
    return {};
  }
  SlotDp dp(chain, budget_bytes, SolverOptions{memory_slots, threads});
  if (!dp.fits()) {
    return {};
  }
  dp.fill(kind, threads);
  return dp.times();
}

std::optional<Plan> optimal_plan(
    const Chain& chain,
    int64_t budget_bytes,
    const SolverOptions& options,
    FillKind kind) {
  return solve_optimal_filled_by(chain, budget_bytes, options, kind);
}

}  // namespace detail
}  // namespace remat::planner
