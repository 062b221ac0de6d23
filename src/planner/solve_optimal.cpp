// solve_optimal, min_feasible_budget_bytes and solve_min_memory: the rotor
// dynamic program (Beaumont et al., 2019) on the memory model of simulate.cpp
// (NOTE: [The memory model]).
//
// A segment (a, b) is the work left when x_a is held by someone outside the
// segment and the backward of stage b + 1 has run (g_{b+1} is live, except
// for b = L - 1 where g_L only appears at the first backward): run the
// backwards of b, ..., a. Memory m counts everything of the segment (g_{b+1},
// the values and records it creates, the gradient it ends with) but not x_a or
// anything outside. Its first op is a forward of stage a, one of:
//   record:  R_a, then segment (a + 1, b) with m - saved_a, then B_a.
//   split j (a < j <= b): C_a, N_{a+1} ... N_{j-1} (x_j is now held, loose),
//            then segment (j, b) with m - |x_j| (its first op keeps x_j),
//            then segment (a, j - 1) with m (x_j is gone, g_j is live).
// time(a, b, m) = min over the feasible options; the whole chain is segment
// (0, L - 1) with m = budget - input_bytes. Every valid plan can be reordered
// into this form without raising its time or peak; the exhaustive test checks
// it (tests/planner/exhaustive_test.cpp).
//
// Memory is counted in units: bytes (exact; min_feasible_budget_bytes) or
// slots of unit_bytes with every size rounded UP, so a plan that fits in slots
// fits in bytes. The time table only stores m in [lo, hi) per segment (below
// lo nothing fits, from hi on recording everything fits and is fastest).
// Speed: the inner loop over m is a contiguous min-plus update
// (fill_kernels.cpp: AVX2 and baseline clones, bit-identical); an option is
// applied only to the m where its lower bound (its time at the largest m) can
// still beat the best time so far, which skips most splits at large m.
// reference_fill is the DP without either, for the equality test
// (tests/planner/optimal_fill_test.cpp).
//
// Not supported: non-chain graphs, offloading, plans that drop a checkpoint
// before its backward (the op set has no drop).
#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "fill_kernels.h"
#include "optimal_table.h"
#include "remat/planner/simulate.h"
#include "remat/planner/solvers.h"
#include "segment_table.h"

namespace remat::planner {
namespace {

using detail::CostRow;
using detail::kInfeasible;
using detail::SegmentArray;
using detail::SegmentCostTable;
using detail::SegmentInfo;

// One stage with its sizes in memory units.
struct UnitStage {
  int64_t output_units = 0;
  int64_t saved_units = 0;
  int64_t forward_tmp_units = 0;  // kForwardNoSave and kForwardCheckpoint
  int64_t record_tmp_units = 0;   // kForwardRecord
  int64_t backward_tmp_units = 0;
  double forward_ms = 0;
  double backward_ms = 0;
};

// A chain with sizes in units of unit_bytes, rounded up.
class UnitChain {
 public:
  UnitChain(const Chain& chain, int64_t unit_bytes)
      : input_units_(round_up(chain.input_bytes(), unit_bytes)) {
    for (const StageCost& s : chain.stages()) {
      stages_.push_back(UnitStage{
          round_up(s.output_bytes, unit_bytes),
          round_up(s.saved_bytes, unit_bytes),
          round_up(s.forward_tmp_bytes, unit_bytes),
          round_up(s.record_transient(), unit_bytes),
          round_up(s.backward_tmp_bytes, unit_bytes),
          s.forward_ms,
          s.backward_ms});
    }
  }
  int64_t size() const {
    return static_cast<int64_t>(stages_.size());
  }
  const UnitStage& stage(int64_t i) const {
    assert(0 <= i && i < size());
    return stages_[i];
  }
  // |x_v| = |g_v| in units.
  int64_t value_units(int64_t v) const {
    assert(0 <= v && v <= size());
    return v == 0 ? input_units_ : stages_[v - 1].output_units;
  }
  // Gradient live during the forwards of a segment ending at stage b.
  int64_t pending_grad_units(int64_t b) const {
    return b + 1 < size() ? value_units(b + 1) : 0;
  }
  // Memory of the record option's own ops (R_a and B_a) in segment (a, b).
  int64_t record_units(int64_t a, int64_t b) const {
    const UnitStage& s = stage(a);
    return std::max(
        pending_grad_units(b) + s.saved_units + s.record_tmp_units,
        s.saved_units + value_units(a + 1) + value_units(a) +
            s.backward_tmp_units);
  }
  // Memory of the forward of stage k in a split chain starting at stage a
  // (without the pending gradient): the loose input (none for k = a, whose
  // input is held outside), the output and the transient.
  int64_t chain_step_units(int64_t a, int64_t k) const {
    return (k > a ? value_units(k) : 0) + value_units(k + 1) +
           stage(k).forward_tmp_units;
  }

 private:
  static int64_t round_up(int64_t bytes, int64_t unit_bytes) {
    return bytes / unit_bytes + (bytes % unit_bytes != 0 ? 1 : 0);
  }
  int64_t input_units_;
  std::vector<UnitStage> stages_;
};

// lo, hi and all_ms of every segment. O(L^3).
SegmentArray<SegmentInfo> segment_info(const UnitChain& chain) {
  const int64_t n = chain.size();
  SegmentArray<SegmentInfo> info(n);
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t a = b; a >= 0; --a) {
      const UnitStage& s = chain.stage(a);
      SegmentInfo& cell = info.at(a, b);
      const int64_t own = chain.record_units(a, b);
      if (a == b) {
        cell = SegmentInfo{own, own, s.forward_ms + s.backward_ms};
        continue;
      }
      const SegmentInfo& rest = info.at(a + 1, b);
      cell.hi = std::max(own, s.saved_units + rest.hi);
      cell.all_ms = (s.forward_ms + s.backward_ms) + rest.all_ms;
      int64_t lo = std::max(own, s.saved_units + rest.lo);
      int64_t step_max = 0;
      for (int64_t j = a + 1; j <= b; ++j) {
        step_max = std::max(step_max, chain.chain_step_units(a, j - 1));
        const int64_t need = std::max(
            {chain.pending_grad_units(b) + step_max,
             chain.value_units(j) + info.at(j, b).lo,
             info.at(a, j - 1).lo});
        lo = std::min(lo, need);
      }
      cell.lo = lo;
    }
  }
  return info;
}

// best[m - best_lo] = min(best[...], (constant + first.at(m - shift)) +
// second.at(m)) for m in [start, top], skipping the m where the option's
// lower bound cannot win. REQUIRES: start >= shift + first.lo, start >=
// second.lo; best non-increasing over [start, top].
void relax(
    double* best,
    int64_t best_lo,
    int64_t start,
    int64_t top,
    double constant,
    const CostRow& first,
    int64_t shift,
    const CostRow& second) {
  if (start > top) {
    return;
  }
  const double bound = (constant + first.at(top - shift)) + second.at(top);
  // First m whose best time is already <= bound; the option cannot win there
  // or above (it is non-increasing in m, with minimum `bound` at top).
  int64_t low = start;
  int64_t high = top + 1;
  while (low < high) {
    const int64_t mid = low + (high - low) / 2;
    if (best[mid - best_lo] <= bound) {
      high = mid;
    } else {
      low = mid + 1;
    }
  }
  const int64_t end = low - 1;
  const int64_t first_tail_from = first.hi + shift;
  const int64_t second_tail_from = second.hi;
  int64_t m = start;
  while (m <= end) {
    const bool first_tail = m >= first_tail_from;
    const bool second_tail = m >= second_tail_from;
    int64_t piece_end = end;
    if (!first_tail) {
      piece_end = std::min(piece_end, first_tail_from - 1);
    }
    if (!second_tail) {
      piece_end = std::min(piece_end, second_tail_from - 1);
    }
    const detail::PieceTimes first_times =
        first_tail
            ? detail::PieceTimes{nullptr, first.all_ms}
            : detail::PieceTimes{first.data + (m - shift - first.lo), 0.0};
    const detail::PieceTimes second_times =
        second_tail ? detail::PieceTimes{nullptr, second.all_ms}
                    : detail::PieceTimes{second.data + (m - second.lo), 0.0};
    detail::min_plus_piece(
        best + (m - best_lo),
        piece_end - m + 1,
        constant,
        first_times,
        second_times);
    m = piece_end + 1;
  }
}

// A row that is 0 at every m (the record option has one subproblem only).
CostRow zero_row() {
  constexpr int64_t kFar = std::numeric_limits<int64_t>::min() / 4;
  return CostRow{nullptr, kFar, kFar, 0.0};
}

void fill_table(
    const UnitChain& chain,
    const SegmentArray<SegmentInfo>& info,
    SegmentCostTable& table) {
  // Blocks of kBlock consecutive b, a descending within a block: (a, b) needs
  // (j, b) for j > a (earlier in the a loop) and (a, b') for b' < b (earlier
  // block, or earlier in the b loop). The rows (a, j - 1) that every b of a
  // block reads are then reused from cache (2.5x faster at 200 stages).
  constexpr int64_t kBlock = 8;
  const int64_t n = chain.size();
  for (int64_t block = 0; block < n; block += kBlock) {
    const int64_t block_end = std::min(n, block + kBlock);
    for (int64_t a = block_end - 2; a >= 0; --a) {
      for (int64_t b = std::max(a + 1, block); b < block_end; ++b) {
        const int64_t count = table.stored_count(a, b);
        if (count == 0) {
          continue;
        }
        const SegmentInfo& cell = info.at(a, b);
        const int64_t top = cell.lo + count - 1;
        double* best = table.mutable_row(a, b);
        const UnitStage& s = chain.stage(a);
        const CostRow rest = table.row(a + 1, b);
        relax(
            best,
            cell.lo,
            std::max(chain.record_units(a, b), s.saved_units + rest.lo),
            top,
            s.forward_ms + s.backward_ms,
            rest,
            s.saved_units,
            zero_row());
        double chain_ms = 0;
        int64_t step_max = 0;
        for (int64_t j = a + 1; j <= b; ++j) {
          chain_ms += chain.stage(j - 1).forward_ms;
          step_max = std::max(step_max, chain.chain_step_units(a, j - 1));
          const CostRow later = table.row(j, b);
          const CostRow earlier = table.row(a, j - 1);
          const int64_t keep = chain.value_units(j);
          const int64_t need = std::max(
              {chain.pending_grad_units(b) + step_max,
               keep + later.lo,
               earlier.lo});
          relax(best, cell.lo, need, top, chain_ms, later, keep, earlier);
        }
      }
    }
  }
}

// The DP's definition, for tests: every option at every m of [need, top],
// the same double expressions as relax, no pruning.
void reference_fill(
    const UnitChain& chain,
    const SegmentArray<SegmentInfo>& info,
    SegmentCostTable& table) {
  const int64_t n = chain.size();
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t a = b - 1; a >= 0; --a) {
      const int64_t count = table.stored_count(a, b);
      const SegmentInfo& cell = info.at(a, b);
      double* best = table.mutable_row(a, b);
      const UnitStage& s = chain.stage(a);
      const CostRow& rest = table.row(a + 1, b);
      const int64_t record_from =
          std::max(chain.record_units(a, b), s.saved_units + rest.lo);
      for (int64_t m = std::max(record_from, cell.lo); m < cell.lo + count;
           ++m) {
        const double value =
            ((s.forward_ms + s.backward_ms) + rest.at(m - s.saved_units)) + 0.0;
        best[m - cell.lo] = std::min(best[m - cell.lo], value);
      }
      double chain_ms = 0;
      int64_t step_max = 0;
      for (int64_t j = a + 1; j <= b; ++j) {
        chain_ms += chain.stage(j - 1).forward_ms;
        step_max = std::max(step_max, chain.chain_step_units(a, j - 1));
        const CostRow& later = table.row(j, b);
        const CostRow& earlier = table.row(a, j - 1);
        const int64_t keep = chain.value_units(j);
        const int64_t need = std::max(
            {chain.pending_grad_units(b) + step_max,
             keep + later.lo,
             earlier.lo});
        for (int64_t m = std::max(need, cell.lo); m < cell.lo + count; ++m) {
          const double value = (chain_ms + later.at(m - keep)) + earlier.at(m);
          best[m - cell.lo] = std::min(best[m - cell.lo], value);
        }
      }
    }
  }
}

void emit_record_all(int64_t a, int64_t b, Plan& plan) {
  for (int64_t i = a; i <= b; ++i) {
    plan.ops.push_back({OpKind::kForwardRecord, i});
  }
  for (int64_t i = b; i >= a; --i) {
    plan.ops.push_back({OpKind::kBackward, i});
  }
}

void emit_split_chain(int64_t a, int64_t j, Plan& plan) {
  plan.ops.push_back({OpKind::kForwardCheckpoint, a});
  for (int64_t k = a + 1; k < j; ++k) {
    plan.ops.push_back({OpKind::kForwardNoSave, k});
  }
}

// Appends the fastest plan of segment (a, b) at memory m (table argmin).
void emit_fastest(
    const UnitChain& chain,
    const SegmentArray<SegmentInfo>& info,
    const SegmentCostTable& table,
    int64_t a,
    int64_t b,
    int64_t m,
    Plan& plan) {
  const SegmentInfo& cell = info.at(a, b);
  assert(m >= cell.lo);
  if (m >= cell.hi) {
    emit_record_all(a, b, plan);
    return;
  }
  assert(a < b);
  const UnitStage& s = chain.stage(a);
  double best = kInfeasible;
  int64_t best_split = -1;  // -1: the record option
  const CostRow rest = table.row(a + 1, b);
  if (m >= std::max(chain.record_units(a, b), s.saved_units + rest.lo)) {
    best = (s.forward_ms + s.backward_ms) + rest.at(m - s.saved_units);
  }
  double chain_ms = 0;
  int64_t step_max = 0;
  for (int64_t j = a + 1; j <= b; ++j) {
    chain_ms += chain.stage(j - 1).forward_ms;
    step_max = std::max(step_max, chain.chain_step_units(a, j - 1));
    const CostRow later = table.row(j, b);
    const CostRow earlier = table.row(a, j - 1);
    const int64_t keep = chain.value_units(j);
    const int64_t need = std::max(
        {chain.pending_grad_units(b) + step_max, keep + later.lo, earlier.lo});
    if (m < need) {
      continue;
    }
    const double value = (chain_ms + later.at(m - keep)) + earlier.at(m);
    if (value < best) {
      best = value;
      best_split = j;
    }
  }
  assert(best < kInfeasible);
  if (best_split < 0) {
    plan.ops.push_back({OpKind::kForwardRecord, a});
    emit_fastest(chain, info, table, a + 1, b, m - s.saved_units, plan);
    plan.ops.push_back({OpKind::kBackward, a});
    return;
  }
  const int64_t j = best_split;
  emit_split_chain(a, j, plan);
  emit_fastest(chain, info, table, j, b, m - chain.value_units(j), plan);
  emit_fastest(chain, info, table, a, j - 1, m, plan);
}

// Appends a plan of segment (a, b) needing exactly info.at(a, b).lo.
void emit_min_memory(
    const UnitChain& chain,
    const SegmentArray<SegmentInfo>& info,
    int64_t a,
    int64_t b,
    Plan& plan) {
  const int64_t lo = info.at(a, b).lo;
  if (a == b) {
    emit_record_all(a, b, plan);
    return;
  }
  const UnitStage& s = chain.stage(a);
  if (std::max(
          chain.record_units(a, b), s.saved_units + info.at(a + 1, b).lo) ==
      lo) {
    plan.ops.push_back({OpKind::kForwardRecord, a});
    emit_min_memory(chain, info, a + 1, b, plan);
    plan.ops.push_back({OpKind::kBackward, a});
    return;
  }
  int64_t step_max = 0;
  for (int64_t j = a + 1; j <= b; ++j) {
    step_max = std::max(step_max, chain.chain_step_units(a, j - 1));
    const int64_t need = std::max(
        {chain.pending_grad_units(b) + step_max,
         chain.value_units(j) + info.at(j, b).lo,
         info.at(a, j - 1).lo});
    if (need == lo) {
      emit_split_chain(a, j, plan);
      emit_min_memory(chain, info, j, b, plan);
      emit_min_memory(chain, info, a, j - 1, plan);
      return;
    }
  }
  assert(false && "segment lo matches no option");
}

// Bytes per memory slot: ceil((budget - input) / slots), at least 1.
int64_t slot_bytes(
    const Chain& chain, int64_t budget_bytes, const SolverOptions& options) {
  const int64_t available = budget_bytes - chain.input_bytes();
  return std::max<int64_t>(
      1,
      available / options.memory_slots +
          (available % options.memory_slots != 0 ? 1 : 0));
}

}  // namespace

int64_t min_feasible_budget_bytes(const Chain& chain) {
  const UnitChain bytes(chain, 1);
  return chain.input_bytes() + segment_info(bytes).at(0, chain.size() - 1).lo;
}

Plan solve_min_memory(const Chain& chain) {
  const UnitChain bytes(chain, 1);
  Plan plan;
  emit_min_memory(bytes, segment_info(bytes), 0, chain.size() - 1, plan);
  return plan;
}

std::optional<Plan> solve_optimal(
    const Chain& chain, int64_t budget_bytes, const SolverOptions& options) {
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
  Plan store_all = solve_store_all(chain);
  if (budget_bytes >= simulate(chain, store_all).peak_bytes) {
    return store_all;
  }
  if (budget_bytes < min_feasible_budget_bytes(chain)) {
    return std::nullopt;
  }
  const int64_t unit_bytes = slot_bytes(chain, budget_bytes, options);
  const int64_t max_slots = (budget_bytes - chain.input_bytes()) / unit_bytes;
  const UnitChain units(chain, unit_bytes);
  const int64_t last = chain.size() - 1;
  const SegmentArray<SegmentInfo> info = segment_info(units);
  if (info.at(0, last).lo > max_slots) {
    return solve_min_memory(chain);  // feasible in bytes, not after rounding
  }
  SegmentCostTable table(info, max_slots);
  fill_table(units, info, table);
  Plan plan;
  emit_fastest(units, info, table, 0, last, max_slots, plan);
  assert(simulate(chain, plan).valid);
  assert(simulate(chain, plan).peak_bytes <= budget_bytes);
  return plan;
}

namespace detail {

std::vector<double> optimal_time_table(
    const Chain& chain,
    int64_t budget_bytes,
    int64_t memory_slots,
    FillKind kind) {
  const SolverOptions options{memory_slots};
  if (budget_bytes >= simulate(chain, solve_store_all(chain)).peak_bytes ||
      budget_bytes < min_feasible_budget_bytes(chain)) {
    return {};
  }
  const int64_t unit_bytes = slot_bytes(chain, budget_bytes, options);
  const int64_t max_slots = (budget_bytes - chain.input_bytes()) / unit_bytes;
  const UnitChain units(chain, unit_bytes);
  const int64_t n = chain.size();
  const SegmentArray<SegmentInfo> info = segment_info(units);
  if (info.at(0, n - 1).lo > max_slots) {
    return {};
  }
  SegmentCostTable table(info, max_slots);
  if (kind == FillKind::kFiltered) {
    fill_table(units, info, table);
  } else {
    reference_fill(units, info, table);
  }
  std::vector<double> times;
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t a = 0; a <= b; ++a) {
      const double* row = table.mutable_row(a, b);
      times.insert(times.end(), row, row + table.stored_count(a, b));
    }
  }
  return times;
}

}  // namespace detail
}  // namespace remat::planner
