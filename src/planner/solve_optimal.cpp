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
// fits in bytes. When every size is a multiple of a common factor that gives
// at most SolverOptions::memory_slots slots, the slot is that factor and the
// DP is exact (slot_bytes). The time table (segment_table.h, float) holds every
// segment for m in [lo, max_slots]; below lo nothing fits, from hi on recording
// everything fits and is fastest (stored as a constant tail).
//
// Speed (the fill is O(L^3 * slots)): the inner loop over m is a contiguous
// min-plus update in 8-float vectors (fill_kernels.cpp: AVX2 and baseline
// clones, bit-identical); an option stops at the first chunk of slots where
// its lower bound can no longer win; the rows a split will read are
// prefetched a few splits ahead; segments are filled in blocks of b so that
// rows are reused from cache; blocks are filled by SolverOptions::threads
// threads side by side. reference_fill is the DP without any of this, for
// the equality test (tests/planner/optimal_fill_test.cpp).
//
// Not supported: non-chain graphs, offloading, plans that drop a checkpoint
// before its backward (the op set has no drop).
#include <algorithm>
#include <atomic>
#include <cassert>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
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
using detail::min_plus_one;
using detail::min_plus_two;
using detail::SegmentArray;
using detail::SegmentCostTable;
using detail::SegmentInfo;
using detail::Time;

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
  // ceil(bytes / unit_bytes), also for negative bytes (backward_tmp_bytes):
  // every size rounds toward +inf, so a plan that fits in units fits in bytes.
  static int64_t round_up(int64_t bytes, int64_t unit_bytes) {
    const int64_t quotient = bytes / unit_bytes;  // rounds toward zero
    return quotient + (bytes % unit_bytes > 0 ? 1 : 0);
  }
  int64_t input_units_;
  std::vector<UnitStage> stages_;
};

// lo, hi and all_ms of every segment. O(L^3).
SegmentArray<SegmentInfo> segment_info(const UnitChain& chain) {
  const int64_t n = chain.size();
  SegmentArray<SegmentInfo> info(n);
  // The inner loop reads lo of (j, b) (contiguous in `info`, b fixed) and of
  // (a, j - 1) (scattered there): the latter also goes into lo_by_start,
  // row a contiguous in b. Plain arrays of the per-stage terms keep the loop
  // free of calls.
  std::vector<int64_t> lo_by_start(static_cast<size_t>(n * n));
  std::vector<int64_t> value(n + 1);  // |x_v|
  std::vector<int64_t> step_out(n);   // |x_{k+1}| + forward_tmp of stage k
  for (int64_t v = 0; v <= n; ++v) {
    value[v] = chain.value_units(v);
  }
  for (int64_t k = 0; k < n; ++k) {
    step_out[k] = value[k + 1] + chain.stage(k).forward_tmp_units;
  }
  for (int64_t b = 0; b < n; ++b) {
    const int64_t pending = chain.pending_grad_units(b);
    for (int64_t a = b; a >= 0; --a) {
      const UnitStage& s = chain.stage(a);
      SegmentInfo& cell = info.at(a, b);
      const int64_t own = chain.record_units(a, b);
      if (a == b) {
        cell = SegmentInfo{own, own, s.forward_ms + s.backward_ms};
        lo_by_start[a * n + b] = own;
        continue;
      }
      const SegmentInfo& rest = info.at(a + 1, b);
      cell.hi = std::max(own, s.saved_units + rest.hi);
      cell.all_ms = (s.forward_ms + s.backward_ms) + rest.all_ms;
      int64_t lo = std::max(own, s.saved_units + rest.lo);
      // Split j: chain forwards a .. j - 1 (chain_step_units), then (j, b)
      // with x_j kept, then (a, j - 1).
      const int64_t* earlier_lo = &lo_by_start[a * n];
      int64_t step_max = step_out[a];  // k = a: the input is held outside
      for (int64_t j = a + 1; j <= b; ++j) {
        if (j - 1 > a) {
          step_max = std::max(step_max, value[j - 1] + step_out[j - 1]);
        }
        const int64_t need = std::max(
            std::max(pending + step_max, value[j] + info.at(j, b).lo),
            earlier_lo[j - 1]);
        lo = std::min(lo, need);
      }
      cell.lo = lo;
      lo_by_start[a * n + b] = lo;
    }
  }
  return info;
}

// One option of segment `target`: for m in [start, top], target(m) =
// min(target(m), (constant + first(m - shift)) + second(m)), or
// constant + first(m - shift) without a second subproblem (second == nullptr).
// Both subproblems are non-increasing in m, so their times at max_slots
// (CostRow::last) bound the option from below on [start, top]; it can only
// win where the best so far is above that bound, which is a prefix of
// [start, top] (target is non-increasing there too): the kernels stop at the
// end of that prefix (fill_kernels.h). The bound is read from the rows'
// metadata, which the fill reads anyway; reading the subproblems at top
// would be tighter but costs two cache misses per option.
// REQUIRES: start - shift >= first.lo, start >= second->lo.
void relax(
    const CostRow& target,
    int64_t start,
    int64_t top,
    Time constant,
    const CostRow& first,
    int64_t shift,
    const CostRow* second) {
  if (start > top) {
    return;
  }
  const Time bound = second != nullptr ? (constant + first.last) + second->last
                                       : constant + first.last;
  Time* best = target.at_address(start);
  const int64_t count = top - start + 1;
  if (second != nullptr) {
    min_plus_two(
        best,
        count,
        bound,
        constant,
        first.at_address(start - shift),
        second->at_address(start));
  } else {
    min_plus_one(best, count, bound, constant, first.at_address(start - shift));
  }
}

// Memory from which the record option of segment (a, b) is feasible.
int64_t record_from(
    const UnitChain& chain,
    const SegmentCostTable& table,
    int64_t a,
    int64_t b) {
  return std::max(
      chain.record_units(a, b),
      chain.stage(a).saved_units + table.row(a + 1, b).lo);
}

// Memory from which split j of segment (a, b) is feasible, given step_max,
// the largest chain_step_units(a, k) for k < j.
int64_t split_from(
    const UnitChain& chain,
    const SegmentCostTable& table,
    int64_t a,
    int64_t b,
    int64_t j,
    int64_t step_max) {
  return std::max(
      {chain.pending_grad_units(b) + step_max,
       chain.value_units(j) + table.row(j, b).lo,
       table.row(a, j - 1).lo});
}

// Segments (a, b) are filled in blocks of kBlock consecutive b (block k:
// b in [k * kBlock, (k + 1) * kBlock)), a descending; for one a, every
// segment (a, b) of the block at once, split by split:
//   record option of every (a, b);
//   for j = a + 1, ...: split j of every (a, b) with b >= j.
// Split j reads (j, b), done in an earlier a, and (a, j - 1), which has had
// all its options once splits up to j - 1 are applied. The point of this
// order: split j of all the block's b reads the same row (a, j - 1) at the
// same m, so it comes from L1 after the first b, and the block's target rows
// (kBlock x 2 KiB at 500 slots) stay in L1; only the rows (j, b) stream.
// 16 halves the cache misses of 1 (cachegrind, 200 stages).
constexpr int64_t kBlock = 16;

// Cache lines of a split's streamed row (j, b) asked for ahead of the
// kernel, one segment ahead (the hardware prefetcher only catches a stream
// after a few misses; most streams are only ~15 lines long).
constexpr int64_t kPrefetchLines = 8;
constexpr int64_t kFloatsPerLine = 64 / sizeof(Time);

// Asks the cache for the first lines split j of segment (a, b) will stream.
void prefetch_split(
    const UnitChain& chain,
    const SegmentCostTable& table,
    int64_t a,
    int64_t b,
    int64_t j) {
  const CostRow& later = table.row(j, b);
  const int64_t keep = chain.value_units(j);
  const int64_t from = std::max(keep + later.lo, table.row(a, j - 1).lo);
  const int64_t top = table.computed_top(a, b);
  if (from > top) {
    return;
  }
  const Time* start = later.at_address(from - keep);
  const int64_t lines =
      std::min<int64_t>(kPrefetchLines, (top - from) / kFloatsPerLine + 1);
  for (int64_t line = 0; line < lines; ++line) {
    __builtin_prefetch(start + line * kFloatsPerLine);
  }
}

// The record option of segment (a, b).
void relax_record(
    const UnitChain& chain,
    const SegmentCostTable& table,
    int64_t a,
    int64_t b) {
  const UnitStage& s = chain.stage(a);
  relax(
      table.row(a, b),
      std::max(record_from(chain, table, a, b), table.row(a, b).lo),
      table.computed_top(a, b),
      static_cast<Time>(s.forward_ms + s.backward_ms),
      table.row(a + 1, b),
      s.saved_units,
      nullptr);
}

// Split j of segment (a, b); chain_ms and step_max as in split_from.
void relax_split(
    const UnitChain& chain,
    const SegmentCostTable& table,
    int64_t a,
    int64_t b,
    int64_t j,
    double chain_ms,
    int64_t step_max) {
  relax(
      table.row(a, b),
      split_from(chain, table, a, b, j, step_max),
      table.computed_top(a, b),
      static_cast<Time>(chain_ms),
      table.row(j, b),
      chain.value_units(j),
      &table.row(a, j - 1));
}

// Fills the segments (a, b) with first_b <= b < end_b for one a, in the
// order described at kBlock. REQUIRES: rows a + 1, ... of these b and rows
// (a, b') for b' < first_b are done.
void fill_row_of_block(
    const UnitChain& chain,
    SegmentCostTable& table,
    int64_t a,
    int64_t first_b,
    int64_t end_b) {
  const int64_t low_b = std::max(a + 1, first_b);
  for (int64_t b = low_b; b < end_b; ++b) {
    relax_record(chain, table, a, b);
  }
  double chain_ms = 0;
  int64_t step_max = 0;
  for (int64_t j = a + 1; j < end_b; ++j) {
    chain_ms += chain.stage(j - 1).forward_ms;
    step_max = std::max(step_max, chain.chain_step_units(a, j - 1));
    if (j - 1 >= low_b) {
      table.finish_row(a, j - 1);  // it has had all its options
    }
    for (int64_t b = std::max(j, low_b); b < end_b; ++b) {
      if (b + 1 < end_b) {
        prefetch_split(chain, table, a, b + 1, j);
      }
      relax_split(chain, table, a, b, j, chain_ms, step_max);
    }
  }
  table.finish_row(a, end_b - 1);
}

// Which rows a of each block are done, for threads filling blocks side by
// side: block k may fill row a < its first b only after block k - 1 has
// (block k - 1 has then done every earlier block's row a too).
class BlockProgress {
 public:
  explicit BlockProgress(int64_t blocks) : next_row_(blocks) {
    for (std::atomic<int64_t>& row : next_row_) {
      row.store(std::numeric_limits<int64_t>::max(), std::memory_order_relaxed);
    }
  }
  // Block k will fill row a next (rows go down to 0; -1: finished).
  void set_next_row(int64_t k, int64_t a) {
    next_row_[k].store(a, std::memory_order_release);
  }
  // Waits until block k has filled row a.
  void wait_for_row(int64_t k, int64_t a) const {
    while (next_row_[k].load(std::memory_order_acquire) >= a) {
      std::this_thread::yield();
    }
  }

 private:
  std::vector<std::atomic<int64_t>> next_row_;
};

void fill_block(
    const UnitChain& chain,
    SegmentCostTable& table,
    int64_t k,
    BlockProgress& progress) {
  const int64_t n = chain.size();
  const int64_t first_b = k * kBlock;
  const int64_t end_b = std::min(n, first_b + kBlock);
  for (int64_t a = end_b - 2; a >= 0; --a) {
    progress.set_next_row(k, a);
    if (k > 0 && a < first_b) {
      progress.wait_for_row(k - 1, a);
    }
    fill_row_of_block(chain, table, a, first_b, end_b);
  }
  progress.set_next_row(k, -1);
}

// Fills the table with `threads` threads (the caller's included); thread t
// fills blocks t, t + threads, ... Each cell is computed by the same
// operations in the same order whatever the thread count, so the table (and
// the plan) does not depend on it.
void fill_table(
    const UnitChain& chain, SegmentCostTable& table, int64_t threads) {
  const int64_t blocks = (chain.size() + kBlock - 1) / kBlock;
  threads = std::max<int64_t>(1, std::min(threads, blocks));
  BlockProgress progress(blocks);
  const auto work = [&](int64_t t) {
    for (int64_t k = t; k < blocks; k += threads) {
      fill_block(chain, table, k, progress);
    }
  };
  std::vector<std::thread> helpers;
  for (int64_t t = 1; t < threads; ++t) {
    helpers.emplace_back(work, t);
  }
  work(0);
  for (std::thread& helper : helpers) {
    helper.join();
  }
}

// The DP's definition, for tests: every option at every m of [from, top],
// the same float expressions as the kernels, no pruning, plain loops.
void reference_fill(const UnitChain& chain, SegmentCostTable& table) {
  const int64_t n = chain.size();
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t a = b - 1; a >= 0; --a) {
      const CostRow& target = table.row(a, b);
      const int64_t top = table.computed_top(a, b);
      const UnitStage& s = chain.stage(a);
      const CostRow& rest = table.row(a + 1, b);
      const Time record_ms = static_cast<Time>(s.forward_ms + s.backward_ms);
      for (int64_t m = std::max(record_from(chain, table, a, b), target.lo);
           m <= top;
           ++m) {
        Time& best = *target.at_address(m);
        best = std::min(best, record_ms + rest.at(m - s.saved_units));
      }
      double chain_ms = 0;
      int64_t step_max = 0;
      for (int64_t j = a + 1; j <= b; ++j) {
        chain_ms += chain.stage(j - 1).forward_ms;
        step_max = std::max(step_max, chain.chain_step_units(a, j - 1));
        const CostRow& later = table.row(j, b);
        const CostRow& earlier = table.row(a, j - 1);
        const int64_t keep = chain.value_units(j);
        for (int64_t m = split_from(chain, table, a, b, j, step_max); m <= top;
             ++m) {
          Time& best = *target.at_address(m);
          best = std::min(
              best,
              (static_cast<Time>(chain_ms) + later.at(m - keep)) +
                  earlier.at(m));
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

// Appends the fastest plan of segment (a, b) at memory m: the first option,
// in the fill's order, whose time (the fill's float expression) is the least.
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
  Time best = kInfeasible;
  int64_t best_split = -1;  // -1: the record option
  if (m >= record_from(chain, table, a, b)) {
    best = static_cast<Time>(s.forward_ms + s.backward_ms) +
           table.row(a + 1, b).at(m - s.saved_units);
  }
  double chain_ms = 0;
  int64_t step_max = 0;
  for (int64_t j = a + 1; j <= b; ++j) {
    chain_ms += chain.stage(j - 1).forward_ms;
    step_max = std::max(step_max, chain.chain_step_units(a, j - 1));
    if (m < split_from(chain, table, a, b, j, step_max)) {
      continue;
    }
    const Time value = (static_cast<Time>(chain_ms) +
                        table.row(j, b).at(m - chain.value_units(j))) +
                       table.row(a, j - 1).at(m);
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
          s.forward_tmp_bytes,
          s.record_transient(),
          s.backward_tmp_bytes}) {
      factor = std::gcd(factor, bytes < 0 ? -bytes : bytes);
    }
  }
  return factor;
}

// Bytes per memory slot. By default ceil((budget - input) / slots), at least
// 1, with every size rounded up (a plan may lose up to a slot per value).
// When all sizes are multiples of a common factor at least that large, the
// factor itself: fewer slots and no rounding, so the DP is exact in bytes.
int64_t slot_bytes(
    const Chain& chain, int64_t budget_bytes, const SolverOptions& options) {
  const int64_t available = budget_bytes - chain.input_bytes();
  const int64_t even_split = std::max<int64_t>(
      1,
      available / options.memory_slots +
          (available % options.memory_slots != 0 ? 1 : 0));
  const int64_t factor = common_byte_factor(chain);
  return factor >= even_split ? factor : even_split;
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
  // The exact (byte) feasibility test is an O(L^3) pass of its own; the
  // slot pass below answers "feasible" in almost every call, so it runs
  // only when that pass says no (or there is no memory to divide).
  const auto fastest_that_fits_bytes = [&]() -> std::optional<Plan> {
    if (budget_bytes < min_feasible_budget_bytes(chain)) {
      return std::nullopt;
    }
    return solve_min_memory(chain);
  };
  if (budget_bytes <= chain.input_bytes()) {
    return fastest_that_fits_bytes();
  }
  const int64_t unit_bytes = slot_bytes(chain, budget_bytes, options);
  const int64_t max_slots = (budget_bytes - chain.input_bytes()) / unit_bytes;
  const UnitChain units(chain, unit_bytes);
  const int64_t last = chain.size() - 1;
  const SegmentArray<SegmentInfo> info = segment_info(units);
  if (info.at(0, last).lo > max_slots) {
    // Sizes rounded up to slots do not fit; exactly, in bytes, they may.
    return fastest_that_fits_bytes();
  }
  SegmentCostTable table(info, max_slots);
  fill_table(units, table, fill_threads(chain, options));
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
    FillKind kind,
    int64_t threads) {
  const SolverOptions options{memory_slots, threads};
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
    fill_table(units, table, threads);
  } else {
    reference_fill(units, table);
  }
  std::vector<double> times;
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t a = 0; a <= b; ++a) {
      const CostRow& row = table.row(a, b);
      times.insert(times.end(), row.data, row.data + row.count);
    }
  }
  return times;
}

}  // namespace detail
}  // namespace remat::planner
