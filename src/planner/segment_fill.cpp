// segment_fill.cpp: the fill of solve_optimal's time table
// (segment_fill.h), the rotor dynamic program's O(L^3 * slots) part. The
// recurrence (which options each segment has, and from which memory each is
// feasible) is segment_recurrence.h; the table, segment_table.h.
//
// Speed: the inner loop over m is a contiguous min-plus update in 16-float
// vectors (fill_kernels.cpp: AVX-512, AVX2 and baseline clones, bit-identical);
// an option stops at the first chunk of slots where its lower bound can no
// longer win; the rows a split will read are prefetched one segment ahead;
// segments are filled in blocks of kBlock so that rows are reused from cache,
// and the rows below a block in groups of kGroup so that each row a split
// streams is read from memory once per group (NOTE: [Row groups]); blocks
// are filled by several threads side by side. reference_fill is the
// DP without any of this, for the equality test of the two fills
// (detail::optimal_time_table).
#include "segment_fill.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "check.h"
#include "fill_kernels.h"

namespace remat::planner::detail {
namespace {

// The segment an option is relaxed into, as the fill sees it: its cell and
// the last memory the fill computes for it (SegmentCostTable::computed_top).
struct Target {
  const SegmentCell* cell = nullptr;
  int64_t top = 0;
};

// Applies an option to its segment's row on [from, target.top]: row(m) =
// min(row(m), option's time at m), by the kernels of
// fill_kernels.h. The option and the row are non-increasing in m, so the
// option's time at max_slots bounds it from below on that range; it can only
// win where the best so far is above that bound, which is a prefix of the
// range: the kernels stop at the end of that prefix, and skip the chunks
// inside it where the option cannot win either (NOTE: [Chunks an option
// cannot win] in fill_kernels.h). The bound is read from
// the cells (SegmentCell::last), which the fill reads anyway; reading the
// subproblems at the top would be tighter but costs two cache misses per
// option. The option is given by its parts (SegmentOption): feasible from
// `from`, its own time constant_ms, its first subsegment's row `first` read
// at m - shift, and its second subsegment's row `second` (nullptr for a
// record). REQUIRES: target is the option's segment; its cells are the
// table's.
inline void relax(
    const Target& target,
    int64_t from,
    int64_t shift,
    double constant_ms,
    const SegmentCell& first,
    const SegmentCell* second) {
  if (from > target.top) {
    return;
  }
  const Time constant = static_cast<Time>(constant_ms);
  Time* best = target.cell->at_address(from);
  const int64_t count = target.top - from + 1;
  const Time* first_times = first.at_address(from - shift);
  if (second == nullptr) {
    min_plus_one(best, count, constant + first.last, constant, first_times);
    return;
  }
  min_plus_two(
      best,
      count,
      (constant + first.last) + second->last,
      constant,
      first_times,
      second->at_address(from));
}

// The same for `option` (a record, or a split).
void relax(const Target& target, const SegmentOption& option) {
  relax(
      target,
      option.from,
      option.shift,
      option.constant_ms,
      *option.first,
      option.is_record() ? nullptr : option.second);
}

// Segments (a, b) are filled in blocks of kBlock consecutive b (block k:
// b in [k * kBlock, (k + 1) * kBlock)), a descending, in groups of up to
// kGroup consecutive a (NOTE: [Row groups]). For one a, every segment
// (a, b) of the block at once, split by split:
//   record option of every (a, b);
//   for j = a + 1, ...: split j of every (a, b) with b >= j.
// Split j reads (j, b), done in an earlier a, and (a, j - 1), which has had
// all its options once splits up to j - 1 are applied. The point of this
// order: split j of all the block's b reads the same row (a, j - 1) at the
// same m, so it comes from L1 after the first b, and the block's target rows
// (kBlock x 2 KiB at 500 slots) stay in L1; only the rows (j, b) stream.
// 16 halves the cache misses of 1 (cachegrind, 200 stages).
constexpr int64_t kBlock = 16;

// NOTE: [Row groups]
// The rows (j, b) a split streams are read again by every a < j: once per
// row a, from L3 or memory (a block's rows (j, b) over all j are 8 MiB at
// 500 stages and 500 slots). So the rows a below the block are filled in
// groups of kGroup: first, for every split j that reads only final rows
// (j above the group, j - 1 in an earlier block), the split of every row of
// the group, b by b, a innermost, so that each streamed row (j, b) is read
// from memory once per group and then from L1; then each row of the group,
// a descending, gets its other options (record, selective, the splits j
// inside the group, which read rows of the group just finished, and the
// splits j inside the block) as above. A row's time at m is the least of
// its options' times there, each computed by the same float expression
// whatever the order in which the options come (min is exact), and the
// kernels' pruning is exact in any order (it only skips slots where an
// option cannot win over the best so far, which never rises with m), so the
// table is bit-identical to the one-row-at-a-time order. The group's target
// rows (kGroup x kBlock x 2 KiB at 500 slots, 512 KiB) stay in L2. 16 rows
// rather than 8: E5's 500-stage chain in 546-547 ms against 570-576 ms on
// an AMD EPYC (1 MiB of L2 per core; on an Intel Xeon 16 gained under 8 %).
constexpr int64_t kGroup = 16;

// Cache lines of a split's streamed row (j, b) asked for ahead of the
// kernel, one segment ahead (the hardware prefetcher only catches a stream
// after a few misses; most streams are only ~15 lines long).
constexpr int64_t kPrefetchLines = 8;
constexpr int64_t kFloatsPerLine = 64 / sizeof(Time);

// Asks the cache for the first lines an option feasible from `from` will
// stream from its row `first` (at m - shift) when it is relaxed into
// `target`.
void prefetch_streamed_row(
    const Target& target,
    int64_t from,
    int64_t shift,
    const SegmentCell& first) {
  if (from > target.top) {
    return;
  }
  const Time* start = first.at_address(from - shift);
  const int64_t lines = std::min<int64_t>(
      kPrefetchLines, (target.top - from) / kFloatsPerLine + 1);
  for (int64_t line = 0; line < lines; ++line) {
    __builtin_prefetch(start + line * kFloatsPerLine);
  }
}

// Least memory of split `split` of segment (split.first(), b), whose row
// (j, b) is `first` and whose pending gradient is pending_grad_units:
// Recurrence::split taken apart, so that what does not depend on b (the
// forwards, x_j, the row (a, j - 1)) is read once.
int64_t split_from(
    int64_t pending_grad_units,
    const SplitAt& split,
    const SegmentCell& first) {
  return SplitAt::from(
      pending_grad_units,
      split.peak_units(),
      split.kept_units(),
      first.lo,
      split.earlier().lo);
}

// Relaxes split `split` of segment (split.first(), b) into `target`; `first`
// is the row (j, b), `from` its split_from.
void relax_split(
    const Target& target,
    const SplitAt& split,
    const SegmentCell& first,
    int64_t from) {
  relax(
      target,
      from,
      split.kept_units(),
      split.forward_ms(),
      first,
      &split.earlier());
}

// The targets of one group of rows of one block: the cells (a, b) of
// a_low <= a <= a_high, first_b <= b < end_b, looked up once for all their
// options.
class GroupTargets {
 public:
  GroupTargets(
      const SegmentCostTable& table,
      int64_t a_low,
      int64_t a_high,
      int64_t first_b,
      int64_t end_b)
      : a_low_(a_low), first_b_(first_b) {
    REMAT_PLANNER_CHECK(
        a_high - a_low < kGroup && end_b - first_b <= kBlock,
        "a group larger than kGroup x kBlock");
    for (int64_t a = a_low; a <= a_high; ++a) {
      for (int64_t b = std::max(a + 1, first_b); b < end_b; ++b) {
        const SegmentCell& cell = table.row(a, b);
        at(a, b) = Target{&cell, table.computed_top(cell)};
      }
    }
  }
  Target& at(int64_t a, int64_t b) {
    return targets_[a - a_low_][b - first_b_];
  }

 private:
  int64_t a_low_;
  int64_t first_b_;
  std::array<std::array<Target, kBlock>, kGroup> targets_;
};

// The splits j in (a_high, first_b] of every segment (a, b) of the group
// a_low <= a <= a_high (a_high < first_b) and the block first_b <= b <
// end_b: b by b, a innermost (NOTE: [Row groups]). REQUIRES: the rows
// (j, b) of those j and the rows (a, j - 1) are done.
void fill_outer_splits(
    const Recurrence& recurrence,
    const SegmentCostTable& table,
    GroupTargets& targets,
    int64_t a_low,
    int64_t a_high,
    int64_t first_b,
    int64_t end_b) {
  std::vector<SplitAt> splits;  // split j of each row a_low + g
  splits.reserve(kGroup);
  for (int64_t a = a_low; a <= a_high; ++a) {
    SplitAt split = recurrence.first_split(a);
    while (split.split() <= a_high) {
      split.advance();
    }
    splits.push_back(split);
  }
  const UnitChain& chain = recurrence.chain();
  const int64_t rows = a_high - a_low + 1;
  for (;;) {
    const int64_t j = splits.front().split();
    for (int64_t b = first_b; b < end_b; ++b) {
      if (b + 1 < end_b) {
        const SegmentCell& next = table.row(j, b + 1);
        prefetch_streamed_row(
            targets.at(a_low, b + 1),
            split_from(chain.pending_grad_units(b + 1), splits.front(), next),
            splits.front().kept_units(),
            next);
      }
      const SegmentCell& first = table.row(j, b);  // shared by the group
      const int64_t pending_grad_units = chain.pending_grad_units(b);
      for (int64_t g = 0; g < rows; ++g) {
        relax_split(
            targets.at(a_low + g, b),
            splits[g],
            first,
            split_from(pending_grad_units, splits[g], first));
      }
    }
    if (j == first_b) {
      return;
    }
    for (SplitAt& split : splits) {
      split.advance();
    }
  }
}

// Fills the segments (a, b) with first_b <= b < end_b for a_low <= a <=
// a_high: the outer splits of the group (fill_outer_splits), then row by
// row, a descending, the other options in the order described at kBlock.
// REQUIRES: a_low == a_high or a_high < first_b; rows a_high + 1, ... of
// these b and rows (a, b') for b' < first_b are done.
void fill_group_of_block(
    const Recurrence& recurrence,
    SegmentCostTable& table,
    int64_t a_low,
    int64_t a_high,
    int64_t first_b,
    int64_t end_b) {
  REMAT_PLANNER_CHECK(
      a_low == a_high || a_high < first_b, "a group reaching into its block");
  GroupTargets targets(table, a_low, a_high, first_b, end_b);
  const UnitChain& chain = recurrence.chain();
  if (a_high < first_b) {
    fill_outer_splits(
        recurrence, table, targets, a_low, a_high, first_b, end_b);
  }
  for (int64_t a = a_high; a >= a_low; --a) {
    const int64_t low_b = std::max(a + 1, first_b);
    const auto target = [&](int64_t b) -> Target& { return targets.at(a, b); };
    for (int64_t b = low_b; b < end_b; ++b) {
      relax(target(b), recurrence.record(a, b));
      if (recurrence.has_selective(a)) {
        relax(target(b), recurrence.record(a, b, RecordKind::kSelective));
      }
    }
    for (SplitAt split = recurrence.first_split(a); split.split() < end_b;
         split.advance()) {
      const int64_t j = split.split();
      if (j > a_high && j <= first_b) {
        continue;  // an outer split, done
      }
      if (j - 1 >= low_b) {
        table.finish_row(a, j - 1);  // it has had all its options
      }
      // Split j of every b of the block, the streamed row of the next b
      // prefetched while this one is relaxed.
      for (int64_t b = std::max(j, low_b); b < end_b; ++b) {
        const SegmentCell& first = table.row(j, b);
        if (b + 1 < end_b) {
          const SegmentCell& next = table.row(j, b + 1);
          prefetch_streamed_row(
              target(b + 1),
              split_from(chain.pending_grad_units(b + 1), split, next),
              split.kept_units(),
              next);
        }
        relax_split(
            target(b),
            split,
            first,
            split_from(chain.pending_grad_units(b), split, first));
      }
    }
    table.finish_row(a, end_b - 1);
  }
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
    const Recurrence& recurrence,
    SegmentCostTable& table,
    int64_t k,
    BlockProgress& progress) {
  const int64_t first_b = k * kBlock;
  const int64_t end_b = std::min(recurrence.chain().size(), first_b + kBlock);
  // Rows inside the block one by one, rows below it in groups.
  for (int64_t a_high = end_b - 2; a_high >= 0;) {
    const int64_t a_low =
        a_high >= first_b ? a_high : std::max<int64_t>(0, a_high - kGroup + 1);
    progress.set_next_row(k, a_high);
    if (k > 0 && a_low < first_b) {
      progress.wait_for_row(k - 1, a_low);
    }
    fill_group_of_block(recurrence, table, a_low, a_high, first_b, end_b);
    a_high = a_low - 1;
  }
  progress.set_next_row(k, -1);
}

// The rows of the one-stage segments (a, a) whose stage has a selective
// way: below hi, where recording fits no longer, the selective option's
// constant time. Before every other row, which reads them.
void fill_one_stage_rows(
    const Recurrence& recurrence, SegmentCostTable& table) {
  for (int64_t a = 0; a < recurrence.chain().size(); ++a) {
    if (!recurrence.has_selective(a)) {
      continue;
    }
    const SegmentCell& cell = table.row(a, a);
    const SegmentOption option =
        recurrence.record(a, a, RecordKind::kSelective);
    for (int64_t m = option.from; m <= table.computed_top(cell); ++m) {
      Time& best = *cell.at_address(m);
      best = std::min(best, option_time(option, m));
    }
    table.finish_row(a, a);
  }
}

}  // namespace

// Thread t fills blocks t, t + threads, ... Each cell is computed by the same
// operations in the same order whatever the thread count, so the table (and
// the plan) does not depend on it.
void fill_table(
    const Recurrence& recurrence, SegmentCostTable& table, int64_t threads) {
  fill_one_stage_rows(recurrence, table);
  const int64_t blocks = (recurrence.chain().size() + kBlock - 1) / kBlock;
  threads = std::max<int64_t>(1, std::min(threads, blocks));
  BlockProgress progress(blocks);
  const auto work = [&](int64_t t) {
    for (int64_t k = t; k < blocks; k += threads) {
      fill_block(recurrence, table, k, progress);
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

void reference_fill(const Recurrence& recurrence, SegmentCostTable& table) {
  const int64_t n = recurrence.chain().size();
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t a = b; a >= 0; --a) {
      const SegmentCell& target = table.row(a, b);
      const int64_t top = table.computed_top(target);
      recurrence.for_each_option(a, b, [&](const SegmentOption& option) {
        for (int64_t m = option.from; m <= top; ++m) {
          Time& best = *target.at_address(m);
          best = std::min(best, option_time(option, m));
        }
      });
    }
  }
}

}  // namespace remat::planner::detail
