// segment_fill.cpp: the fill of solve_optimal's time table
// (segment_fill.h), the rotor dynamic program's O(L^3 * slots) part. The
// recurrence (which options each segment has, and from which memory each is
// feasible) is segment_recurrence.h; the table, segment_table.h.
//
// Speed: the inner loop over m is a contiguous min-plus update in 8-float
// vectors (fill_kernels.cpp: AVX2 and baseline clones, bit-identical); an
// option stops at the first chunk of slots where its lower bound can no
// longer win; the rows a split will read are prefetched one segment ahead;
// segments are filled in blocks of kBlock so that rows are reused from cache;
// blocks are filled by several threads side by side. reference_fill is the
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

// Applies `option` to its segment's row on [option.from, target.top]:
// row(m) = min(row(m), option's time at m), by the kernels of
// fill_kernels.h. The option and the row are non-increasing in m, so the
// option's time at max_slots bounds it from below on that range; it can only
// win where the best so far is above that bound, which is a prefix of the
// range: the kernels stop at the end of that prefix. The bound is read from
// the cells (SegmentCell::last), which the fill reads anyway; reading the
// subproblems at the top would be tighter but costs two cache misses per
// option. REQUIRES: target is the option's segment; its cells are the
// table's.
void relax(const Target& target, const SegmentOption& option) {
  if (option.from > target.top) {
    return;
  }
  const Time constant = static_cast<Time>(option.constant_ms);
  Time* best = target.cell->at_address(option.from);
  const int64_t count = target.top - option.from + 1;
  const SegmentCell& first = *option.first;
  const Time* first_times = first.at_address(option.from - option.shift);
  if (option.is_record()) {
    min_plus_one(best, count, constant + first.last, constant, first_times);
    return;
  }
  const SegmentCell& second = *option.second;
  min_plus_two(
      best,
      count,
      (constant + first.last) + second.last,
      constant,
      first_times,
      second.at_address(option.from));
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

// Asks the cache for the first lines `split` will stream from its row (j, b)
// when it is relaxed into `target`.
void prefetch_streamed_row(const Target& target, const SegmentOption& split) {
  if (split.from > target.top) {
    return;
  }
  const Time* start = split.first->at_address(split.from - split.shift);
  const int64_t lines = std::min<int64_t>(
      kPrefetchLines, (target.top - split.from) / kFloatsPerLine + 1);
  for (int64_t line = 0; line < lines; ++line) {
    __builtin_prefetch(start + line * kFloatsPerLine);
  }
}

// Fills the segments (a, b) with first_b <= b < end_b for one a, in the
// order described at kBlock. REQUIRES: rows a + 1, ... of these b and rows
// (a, b') for b' < first_b are done.
void fill_row_of_block(
    const Recurrence& recurrence,
    SegmentCostTable& table,
    int64_t a,
    int64_t first_b,
    int64_t end_b) {
  const int64_t low_b = std::max(a + 1, first_b);
  // The block's segments (a, b), looked up once for all their options.
  REMAT_PLANNER_CHECK(end_b - first_b <= kBlock, "a block wider than kBlock");
  std::array<Target, kBlock> targets;
  const auto target = [&](int64_t b) -> Target& {
    return targets[b - first_b];
  };
  for (int64_t b = low_b; b < end_b; ++b) {
    const SegmentCell& cell = table.row(a, b);
    target(b) = Target{&cell, table.computed_top(cell)};
    relax(target(b), recurrence.record(a, b));
    if (recurrence.has_selective(a)) {
      relax(target(b), recurrence.record(a, b, RecordKind::kSelective));
    }
  }
  for (SplitAt split = recurrence.first_split(a); split.split() < end_b;
       split.advance()) {
    const int64_t j = split.split();
    if (j - 1 >= low_b) {
      table.finish_row(a, j - 1);  // it has had all its options
    }
    // Split j of every b of the block, the streamed row of the next b
    // prefetched while this one is relaxed.
    const int64_t first_b_of_split = std::max(j, low_b);
    SegmentOption next = recurrence.split(split, first_b_of_split);
    for (int64_t b = first_b_of_split; b < end_b; ++b) {
      const SegmentOption option = next;
      if (b + 1 < end_b) {
        next = recurrence.split(split, b + 1);
        prefetch_streamed_row(target(b + 1), next);
      }
      relax(target(b), option);
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
    const Recurrence& recurrence,
    SegmentCostTable& table,
    int64_t k,
    BlockProgress& progress) {
  const int64_t first_b = k * kBlock;
  const int64_t end_b = std::min(recurrence.chain().size(), first_b + kBlock);
  for (int64_t a = end_b - 2; a >= 0; --a) {
    progress.set_next_row(k, a);
    if (k > 0 && a < first_b) {
      progress.wait_for_row(k - 1, a);
    }
    fill_row_of_block(recurrence, table, a, first_b, end_b);
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
