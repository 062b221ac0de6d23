// remat/planner/simulate.h: replay a plan on the cost model.
//
// simulate() is the single definition of what a plan costs: its validity, its
// peak bytes and its time. Every solver's claim is checked against it, and the
// LibTorch runtime executes plans so that the measured activation peak matches
// it. The memory model (what is live when, and the peak inside each op) is
// defined in docs/planner.md, "The memory model".
//
// Replay is the same machine one op at a time, for callers that execute a plan
// step by step (the runtime, explain()) or search over op sequences (tests).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "remat/planner/chain.h"
#include "remat/planner/graph.h"
#include "remat/planner/plan.h"

namespace remat::planner {

/// The outcome of simulate().
struct Simulation {
  /// True when the plan follows every rule and runs every backward.
  bool valid = false;
  /// Empty when valid; otherwise the first broken rule, naming the op index
  /// and the op, e.g. "op 3 (B1): backward of stage 1, which is not recorded".
  std::string error;
  /// Highest live bytes at any point (the chain input x_0 included; see the
  /// memory model). For an invalid plan: the peak of the ops before the error.
  int64_t peak_bytes = 0;
  /// Sum of forward_ms of every forward op and backward_ms of every backward
  /// op, in milliseconds: the time every solver minimizes. For an invalid
  /// plan: time of the ops before the error.
  double time_ms = 0;
  /// The predicted step time: time_ms plus the chain's (or graph's)
  /// cold_write_ms_per_mib() for every MiB of peak_bytes, the step's first
  /// touch of its working set (docs/planner.md, "Time"). Equals time_ms when
  /// that cost is 0 (the default).
  double step_ms = 0;
  /// Step by step, one entry per op applied (for an invalid plan: the ops
  /// before the error): the live bytes after the op ...
  std::vector<int64_t> live_after_bytes;
  /// ... and the highest live bytes inside it (its transients included).
  /// peak_bytes is the largest of these and input bytes.
  std::vector<int64_t> op_peak_bytes;
};

/// Replays `plan` on `chain` and reports validity, peak bytes and time.
/// Never throws for a bad plan (a bad plan is an expected outcome: valid is
/// false and error says why).
///
/// Example:
// clang-format off
///   Simulation sim = simulate(chain, solve_sqrt(chain));
///   if (!sim.valid) std::cerr << sim.error;
// clang-format on
Simulation simulate(const Chain& chain, const Plan& plan);

/// Replays `plan` on `graph` (docs/planner.md, "Graphs"): the chain's rules
/// with values that several stages read, held from the op that computes
/// them until their last read. A plan valid on a chain is valid on
/// graph_of(chain) with the same peak and time. Never throws for a bad plan.
///
/// Example:
// clang-format off
///   Simulation sim = simulate(graph, solve_store_all(graph));
// clang-format on
Simulation simulate(const Graph& graph, const Plan& plan);

/// For an executor of `plan` on `graph`: after op k, the values x_v whose
/// standalone copies the memory model drops (besides records, which their
/// backward frees). Throws std::invalid_argument with simulate()'s error if
/// the plan is not valid for the graph.
std::vector<std::vector<int64_t>> released_values(
    const Graph& graph, const Plan& plan);

/// The simulate() state machine, one op at a time. Copyable (cheap for short
/// chains), so a search can branch on it. A Replay refers to its chain, which
/// must outlive it (a temporary chain is refused at compile time).
///
/// Example:
// clang-format off
///   Replay replay(chain);
///   for (const Op& op : plan.ops) {
///     if (std::string error = replay.apply(op); !error.empty()) { ... }
///   }
///   bool done = replay.finished();
// clang-format on
class Replay {
 public:
  /// Where a value x_v is held.
  enum class Holding : uint8_t {
    kAbsent,    ///< not held
    kLoose,     ///< held standalone; dropped by the next forward that reads it
    kKept,      ///< held standalone until the backward of stage v (x_0: always)
    kInRecord,  ///< held inside the record of stage v - 1
  };

  /// Starts before the first op: only x_0 is held.
  explicit Replay(const Chain& chain);
  /// A Replay keeps a reference to its chain: a temporary would dangle.
  explicit Replay(Chain&& chain) = delete;

  /// Applies `op`. Returns "" on success; otherwise the broken rule (without
  /// an op index prefix) and leaves the state unchanged.
  std::string apply(const Op& op);
  /// True once the backward of stage 0 has run.
  bool finished() const {
    return next_backward_ < 0;
  }
  /// Bytes live now (x_0 included).
  int64_t current_bytes() const {
    return current_bytes_;
  }
  /// Highest live bytes so far, including transients inside ops.
  int64_t peak_bytes() const {
    return peak_bytes_;
  }
  /// Highest live bytes inside the last op applied (its transients
  /// included); the input bytes before the first op.
  int64_t last_op_peak_bytes() const {
    return last_op_peak_bytes_;
  }
  /// Time of the ops applied so far, in milliseconds.
  double time_ms() const {
    return time_ms_;
  }
  /// The stage whose backward must run next; -1 once finished().
  int64_t next_backward_stage() const {
    return next_backward_;
  }
  /// Where x_`value` is held, 0 <= value <= chain size. Throws
  /// std::out_of_range otherwise.
  Holding holding(int64_t value) const;
  /// Whether stage `stage` is recorded now. Throws std::out_of_range unless
  /// 0 <= stage < chain size.
  bool recorded(int64_t stage) const;
  /// Whether stage `stage` is recorded now by kForwardSelective. Throws
  /// std::out_of_range unless 0 <= stage < chain size.
  bool recorded_selectively(int64_t stage) const;

 private:
  // How a stage is recorded.
  static constexpr uint8_t kNotRecorded = 0;
  static constexpr uint8_t kFullRecord = 1;       // kForwardRecord
  static constexpr uint8_t kSelectiveRecord = 2;  // kForwardSelective

  // The steps of apply(): a check gives the broken rule or "" and changes
  // nothing; a run applies the op. REQUIRES (runs): the op's check passed.
  std::string backward_error(int64_t stage) const;
  void run_backward(int64_t stage);
  std::string forward_error(const Op& op) const;
  void run_forward(const Op& op);

  const Chain* chain_;
  std::vector<Holding> holding_;   // size L + 1, indexed by value
  std::vector<uint8_t> recorded_;  // size L, indexed by stage
  int64_t next_backward_;
  int64_t current_bytes_;
  int64_t peak_bytes_;
  int64_t last_op_peak_bytes_;
  double time_ms_ = 0;
};

}  // namespace remat::planner
