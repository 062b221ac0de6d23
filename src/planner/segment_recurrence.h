// Private: the recurrence of solve_optimal's dynamic program, written once.
// Everything that asks "which options does segment (a, b) have, from which
// memory is each feasible, what does it cost" asks Recurrence: the bounds
// pass (segment_bounds), the table fills (pruned and reference), and the
// walk that turns a choice per segment into a plan.
//
// NOTE: [The segment recurrence]
// A segment (a, b) is the work left when x_a is held by someone outside the
// segment and the backward of stage b + 1 has run (g_{b+1} is live, except
// for b = L - 1 where g_L only appears at the first backward): run the
// backwards of b, ..., a. Memory m counts everything of the segment (g_{b+1},
// the values and records it creates, the gradient it ends with) but not x_a or
// anything outside. Its first op is a forward of stage a, one of:
//   record:  R_a, then segment (a + 1, b) with m - saved_a, then B_a.
//   selective (if stage a has a SelectiveCost): the same with S_a and the
//            selective costs (for a == b: S_a, B_a).
//   split j (a < j <= b): C_a, N_{a+1} ... N_{j-1} (x_j is now held, loose),
//            then segment (j, b) with m - |x_j| (its first op keeps x_j),
//            then segment (a, j - 1) with m (x_j is gone, g_j is live).
// time(a, b, m) = min over the feasible options, in this order (record, then
// j ascending; ties go to the earlier); the whole chain is segment (0, L - 1)
// with m = budget - input_bytes - resident_bytes. A segment of one stage (a ==
// b) has "record", the base case held in the bounds, and maybe "selective". A
// selective stage is never faster than a recorded one (recompute_ms >= 0), so
// recording everything stays the fastest plan of every segment. Every valid
// plan can be reordered into this form without raising its time or peak; the
// exhaustive test against all op sequences checks it.
//
// Memory is counted in units (bytes, or slots with every size rounded up;
// UnitChain) and each option is feasible from a least memory (`from`) that
// only depends on the units and on the least memory (lo) of its
// subsegments, so the same Recurrence serves the bounds pass (which writes lo
// as it goes, every subsegment before its segment) and everything after it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "check.h"
#include "remat/planner/chain.h"
#include "segment_table.h"

namespace remat::planner::detail {

/// One way to record a stage (kForwardRecord, or kForwardSelective) with
/// its sizes in memory units.
struct UnitRecord {
  int64_t saved_units = 0;         ///< the record R_a, x_{a+1} included
  int64_t forward_tmp_units = 0;   ///< transient of the recording forward
  int64_t backward_tmp_units = 0;  ///< transient of the backward after it
  double ms = 0;  ///< forward and backward time of the stage recorded so
};

/// One stage with its sizes in memory units.
struct UnitStage {
  int64_t output_units = 0;
  int64_t forward_tmp_units = 0;  ///< kForwardNoSave and kForwardCheckpoint
  double forward_ms = 0;
  UnitRecord record;                    ///< kForwardRecord
  std::optional<UnitRecord> selective;  ///< kForwardSelective, if it has one
};

/// Which way of recording a stage an option uses.
enum class RecordKind { kFull, kSelective };

/// A chain with sizes in units of unit_bytes, rounded up: a plan that fits
/// in units fits in bytes.
class UnitChain {
 public:
  UnitChain(const Chain& chain, int64_t unit_bytes)
      : size_(chain.size()),
        input_units_(round_up(chain.input_bytes(), unit_bytes)) {
    // The resident bytes are a constant the caller takes off the budget.
    for (const StageCost& s : chain.stages()) {
      UnitStage stage;
      stage.output_units = round_up(s.output_bytes, unit_bytes);
      stage.forward_tmp_units = round_up(s.forward_extra(), unit_bytes);
      stage.forward_ms = s.forward_ms;
      stage.record = UnitRecord{
          round_up(s.saved_bytes, unit_bytes),
          round_up(s.record_extra(), unit_bytes),
          round_up(s.backward_extra(false), unit_bytes),
          s.forward_ms + s.backward_ms};
      if (s.selective) {
        stage.selective = UnitRecord{
            round_up(s.selective->saved_bytes, unit_bytes),
            round_up(s.selective_forward_extra(), unit_bytes),
            round_up(s.backward_extra(true), unit_bytes),
            s.forward_ms + (s.backward_ms + s.selective->recompute_ms)};
      }
      stages_.push_back(stage);
    }
  }
  int64_t size() const {
    return size_;
  }
  const UnitStage& stage(int64_t i) const {
    REMAT_PLANNER_CHECK(
        static_cast<uint64_t>(i) < static_cast<uint64_t>(size_),
        "stage outside the chain");
    return stages_[i];
  }
  /// The costs of recording stage `i` the way `kind` says. REQUIRES: the
  /// stage has a selective way if kind is kSelective.
  const UnitRecord& record(int64_t i, RecordKind kind) const {
    const UnitStage& s = stage(i);
    if (kind == RecordKind::kFull) {
      return s.record;
    }
    REMAT_PLANNER_CHECK(s.selective.has_value(), "no selective cost");
    return *s.selective;
  }
  /// |x_v| = |g_v| in units.
  int64_t value_units(int64_t v) const {
    REMAT_PLANNER_CHECK(
        static_cast<uint64_t>(v) <= static_cast<uint64_t>(size_),
        "value outside the chain");
    return v == 0 ? input_units_ : stages_[v - 1].output_units;
  }
  /// Gradient live during the forwards of a segment ending at stage b.
  int64_t pending_grad_units(int64_t b) const {
    return b + 1 < size() ? value_units(b + 1) : 0;
  }
  /// Memory of a record option's own ops (R_a or S_a, and B_a) in segment
  /// (a, b).
  int64_t record_units(
      int64_t a, int64_t b, RecordKind kind = RecordKind::kFull) const {
    const UnitRecord& r = record(a, kind);
    return std::max(
        pending_grad_units(b) + r.saved_units + r.forward_tmp_units,
        r.saved_units + value_units(a + 1) + value_units(a) +
            r.backward_tmp_units);
  }

 private:
  // ceil(bytes / unit_bytes), also for negative bytes (backward_tmp_bytes):
  // every size rounds toward +inf.
  static int64_t round_up(int64_t bytes, int64_t unit_bytes) {
    const int64_t quotient = bytes / unit_bytes;  // rounds toward zero
    return quotient + (bytes % unit_bytes > 0 ? 1 : 0);
  }
  int64_t size_;
  int64_t input_units_;
  std::vector<UnitStage> stages_;
};

/// Split j of the segments that start at a, for j = a + 1, a + 2, ...
/// (advance()): the part of the option that does not depend on the
/// segment's last stage b. That is the forwards C_a, N_{a+1}, ..., N_{j-1}
/// it runs first, the value x_j it keeps, and the subsegment (a, j - 1) it
/// runs last; so one walk over j serves every b (the fill relies on this).
class SplitAt {
 public:
  /// Split a + 1 (the forward of stage a alone). REQUIRES: chain and cells
  /// outlive it; the lo of (a, j - 1) is final for every j it reaches.
  SplitAt(
      const UnitChain& chain, const SegmentArray<SegmentCell>& cells, int64_t a)
      : chain_(&chain),
        cells_(&cells),
        first_(a),
        split_(a + 1),
        forward_ms_(chain.stage(a).forward_ms),
        peak_units_(forward_units(0, chain.stage(a))),
        kept_units_(chain.stage(a).output_units),
        earlier_(&cells.at(a, a)) {}
  /// Moves on to split j + 1: adds the forward of stage j, whose input x_j
  /// is loose. REQUIRES: j < chain size.
  void advance() {
    const UnitStage& next = chain_->stage(split_);
    peak_units_ = std::max(peak_units_, forward_units(kept_units_, next));
    forward_ms_ += next.forward_ms;
    kept_units_ = next.output_units;
    ++split_;
    earlier_ = &cells_->at(first_, split_ - 1);
  }
  /// a: the forwards start with stage a.
  int64_t first() const {
    return first_;
  }
  /// j: the forwards end with x_j held.
  int64_t split() const {
    return split_;
  }
  /// Time of the forwards a, ..., j - 1, summed in that order.
  double forward_ms() const {
    return forward_ms_;
  }
  /// The highest memory of any of them, without the pending gradient.
  int64_t peak_units() const {
    return peak_units_;
  }
  /// |x_j|, held while segment (j, b) runs.
  int64_t kept_units() const {
    return kept_units_;
  }
  /// The cell of segment (a, j - 1), which runs last.
  const SegmentCell& earlier() const {
    return *earlier_;
  }
  /// Least memory of split j of segment (a, b): its forwards (peak_units,
  /// with the pending gradient of b), segment (j, b) beside x_j (kept_units)
  /// and segment (a, j - 1) after it, given the lo of those two segments.
  static int64_t from(
      int64_t pending_grad_units,
      int64_t peak_units,
      int64_t kept_units,
      int64_t first_lo,
      int64_t second_lo) {
    return std::max(
        {pending_grad_units + peak_units, kept_units + first_lo, second_lo});
  }

 private:
  // Memory of one of the forwards (without the pending gradient): its loose
  // input (0 for stage a, whose input is held outside), its output and its
  // transient.
  static int64_t forward_units(int64_t loose_input, const UnitStage& stage) {
    return loose_input + stage.output_units + stage.forward_tmp_units;
  }

  const UnitChain* chain_;
  const SegmentArray<SegmentCell>* cells_;
  int64_t first_;
  int64_t split_;
  double forward_ms_;
  int64_t peak_units_;
  int64_t kept_units_;
  const SegmentCell* earlier_;
};

/// One option of segment (a, b) (NOTE: [The segment recurrence]), with the
/// cells of the subsegments it hands on. Its time at memory m >= from is, in
/// this float expression (the fills and the walk must agree to the bit):
///   record:  constant_ms + first(m - shift)             first = (a + 1, b)
///   split j: (constant_ms + first(m - shift)) + second(m)
///                                       first = (j, b), second = (a, j - 1)
struct SegmentOption {
  static constexpr int64_t kRecord = -1;
  static constexpr int64_t kSelective = -2;

  int64_t a = 0;
  int64_t b = 0;
  /// j of "split at j", or kRecord, or kSelective (record stage a
  /// selectively).
  int64_t split = kRecord;
  /// Least memory (units) at which the option is feasible.
  int64_t from = 0;
  /// The option's own time: forward and backward of stage a (record), the
  /// forwards a, ..., j - 1 (split j). Cast to Time where it is added.
  double constant_ms = 0;
  /// Memory the option holds while its first subsegment runs: saved_a
  /// (record) or |x_j| (split j).
  int64_t shift = 0;
  /// The subsegment that runs first, at m - shift; nullptr for the
  /// selective option of a one-stage segment (it has none).
  const SegmentCell* first = nullptr;
  /// The split's subsegment that runs second, at m; nullptr for a record.
  const SegmentCell* second = nullptr;

  /// Records stage a (fully or selectively): one subsegment at most.
  bool is_record() const {
    return split < 0;
  }
  bool is_selective() const {
    return split == kSelective;
  }
};

/// The options of every segment and their feasibility, reading the least
/// memory of subsegments from `cells` (the bounds pass's cells as it writes
/// them, or a SegmentCostTable's: the same lo).
class Recurrence {
 public:
  /// REQUIRES: chain and cells outlive the Recurrence; the lo of every
  /// subsegment an option reads is final.
  Recurrence(const UnitChain& chain, const SegmentArray<SegmentCell>& cells)
      : chain_(&chain), cells_(&cells) {}

  const UnitChain& chain() const {
    return *chain_;
  }
  const SegmentCell& cell(int64_t a, int64_t b) const {
    return cells_->at(a, b);
  }

  /// The record option of segment (a, b): stage a recorded the way `kind`
  /// says, then segment (a + 1, b). REQUIRES: a < b, or a == b for
  /// kSelective (a one-stage segment's full record is the base case, held
  /// in the bounds); a selective way for kSelective.
  SegmentOption record(
      int64_t a, int64_t b, RecordKind kind = RecordKind::kFull) const {
    const UnitRecord& r = chain_->record(a, kind);
    SegmentOption option;
    option.a = a;
    option.b = b;
    option.split = kind == RecordKind::kFull ? SegmentOption::kRecord
                                             : SegmentOption::kSelective;
    option.from = chain_->record_units(a, b, kind);
    if (a < b) {
      option.first = &cells_->at(a + 1, b);
      option.from = std::max(option.from, r.saved_units + option.first->lo);
    } else {
      REMAT_PLANNER_CHECK(
          kind == RecordKind::kSelective, "a one-stage full record option");
    }
    option.constant_ms = r.ms;
    option.shift = r.saved_units;
    return option;
  }

  /// Whether stage a has a selective way to be recorded.
  bool has_selective(int64_t a) const {
    return chain_->stage(a).selective.has_value();
  }

  /// The first split (j = a + 1) of the segments that start at a;
  /// SplitAt::advance() moves to the next.
  SplitAt first_split(int64_t a) const {
    return SplitAt(*chain_, *cells_, a);
  }

  /// Split `split` of segment (split.first(), b). REQUIRES: j <= b (the
  /// cell lookup of (j, b) checks it).
  SegmentOption split(const SplitAt& split, int64_t b) const {
    SegmentOption option;
    option.a = split.first();
    option.b = b;
    option.split = split.split();
    option.shift = split.kept_units();
    option.first = &cells_->at(split.split(), b);
    option.second = &split.earlier();
    option.from = SplitAt::from(
        chain_->pending_grad_units(b),
        split.peak_units(),
        split.kept_units(),
        option.first->lo,
        option.second->lo);
    option.constant_ms = split.forward_ms();
    return option;
  }

  /// Calls visit(option) for every option of segment (a, b) in the
  /// recurrence's order: record, selective record (if stage a has one),
  /// then split j = a + 1, ..., b. A one-stage segment (a == b) has only its
  /// selective option here (its full record is the base case).
  template <typename Visit>
  void for_each_option(int64_t a, int64_t b, Visit&& visit) const {
    if (a < b) {
      visit(record(a, b));
    }
    if (has_selective(a)) {
      visit(record(a, b, RecordKind::kSelective));
    }
    if (a == b) {
      return;
    }
    for (SplitAt split = first_split(a);; split.advance()) {
      visit(this->split(split, b));
      if (split.split() == b) {
        return;
      }
    }
  }

 private:
  const UnitChain* chain_;
  const SegmentArray<SegmentCell>* cells_;
};

}  // namespace remat::planner::detail
