// simulate() on graphs: the single definition of what a plan on a graph
// costs.
//
// NOTE: [The memory model on graphs]
// The chain's model (NOTE: [The memory model] in simulate.cpp) with values
// that several stages read. Values, records and gradients are as for chains:
// x_0 the graph input (held for the whole step), x_{i+1} the output of stage
// i, R_i the record of stage i (saved_bytes, CONTAINING x_{i+1}, EXCLUDING
// its inputs), g_v the gradient of x_v (the size of x_v).
//
// Lifetimes follow from the plan itself, as a compiler's would: a value
// computed by a forward that does not record it (kForwardNoSave,
// kForwardCheckpoint: the two mean the same on a graph) is held standalone
// from that op until its last read before it is computed again (or the end
// of the plan), and dropped right after that read. The reads of x_v are the
// forwards and the backwards of the stages that read it: a recorded stage
// holds its inputs until its backward. A value a recorded forward produces
// lives inside the record until the stage's backward. Gradients: g_v appears
// with the first backward of a stage that reads x_v and is freed by the
// backward of its producer (g_0 stays to the end); the last stage's output
// gradient appears with the first backward.
//
// Ops on stage i, with B = live bytes before the op:
//   forward (all kinds): REQUIRES backward of stage i not yet run, every
//     input of stage i held, x_{i+1} not held (neither standalone, nor in a
//     record, nor an input of a live record); the last stage may only be
//     recorded. Peak B + produced + transient, as for chains. Then the
//     inputs read for the last time are dropped, and an output nothing reads
//     is dropped at once. Time += forward_ms.
//   kBackward: REQUIRES the backwards in order L-1, ..., 0 (so every reader
//     of x_{i+1} has run its backward: g_{i+1} is complete) and R_i held.
//     Peak B + sum over the distinct inputs v of |g_v| + the backward's
//     transient (backward_extra). Then g_v is held for each input (new ones
//     add bytes; the rest accumulate in place), R_i and g_{i+1} are freed,
//     and inputs read for the last time are dropped.
//   End: REQUIRES every backward run.
#include "remat/planner/simulate.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "replay_loop.h"

namespace remat::planner {
namespace {

std::string value_name(int64_t v) {
  return "x_" + std::to_string(v);
}

bool is_record(OpKind kind) {
  return kind == OpKind::kForwardRecord || kind == OpKind::kForwardSelective;
}

/// For each op of a plan: the values it reads for the last time before they
/// are computed again (or ever), and whether a forward's output is read at
/// all afterwards. Ops on stages out of range read nothing (simulate stops
/// at them).
struct Liveness {
  // The last reads of op k: last_reads[begin[k] .. begin[k + 1]).
  std::vector<int64_t> last_reads;
  std::vector<size_t> begin;
  std::vector<char> output_unused;

  Liveness(const Graph& graph, const Plan& plan)
      : begin(plan.ops.size() + 1, 0), output_unused(plan.ops.size(), 0) {
    const int64_t n = graph.size();
    std::vector<char> read_next(static_cast<size_t>(n + 1), 0);
    // Filled from the last op backwards, then reversed.
    std::vector<size_t> count(plan.ops.size(), 0);
    for (size_t k = plan.ops.size(); k-- > 0;) {
      const Op& op = plan.ops[k];
      if (op.stage < 0 || op.stage >= n) {
        continue;
      }
      if (op.kind != OpKind::kBackward) {
        const int64_t out = op.stage + 1;
        output_unused[k] = read_next[out] ? 0 : 1;
        read_next[out] = 0;  // computed here
      }
      for (int64_t v : graph.input_values(op.stage)) {
        if (!read_next[v]) {
          last_reads.push_back(v);
          ++count[k];
        }
        read_next[v] = 1;
      }
    }
    std::reverse(last_reads.begin(), last_reads.end());
    for (size_t k = 0; k < plan.ops.size(); ++k) {
      begin[k + 1] = begin[k] + count[k];
    }
  }
};

/// The graph's state machine (see the NOTE at the top).
class GraphReplay {
 public:
  GraphReplay(const Graph& graph, const Plan& plan)
      : graph_(graph),
        plan_(plan),
        liveness_(graph, plan),
        standalone_(static_cast<size_t>(graph.size() + 1), 0),
        in_record_(static_cast<size_t>(graph.size() + 1), 0),
        readers_recorded_(static_cast<size_t>(graph.size() + 1), 0),
        has_gradient_(static_cast<size_t>(graph.size() + 1), 0),
        recorded_(static_cast<size_t>(graph.size()), kNotRecorded),
        next_backward_(graph.size() - 1),
        current_bytes_(graph.input_bytes()),
        peak_bytes_(graph.input_bytes()) {}

  /// Applies op k. Returns "" or the broken rule.
  std::string apply(size_t k) {
    const Op& op = plan_.ops[k];
    const int64_t n = graph_.size();
    if (op.stage < 0 || op.stage >= n) {
      return "stage " + std::to_string(op.stage) + " out of range [0, " +
             std::to_string(n) + ")";
    }
    released_.clear();
    std::string error = op.kind == OpKind::kBackward ? backward_error(op.stage)
                                                     : forward_error(op);
    if (!error.empty()) {
      return error;
    }
    if (op.kind == OpKind::kBackward) {
      run_backward(op.stage);
    } else {
      run_forward(op, liveness_.output_unused[k] != 0);
    }
    for (size_t r = liveness_.begin[k]; r < liveness_.begin[k + 1]; ++r) {
      drop(liveness_.last_reads[r]);
    }
    return "";
  }

  bool finished() const {
    return next_backward_ < 0;
  }
  int64_t next_backward_stage() const {
    return next_backward_;
  }
  int64_t current_bytes() const {
    return current_bytes_;
  }
  int64_t peak_bytes() const {
    return peak_bytes_;
  }
  int64_t last_op_peak_bytes() const {
    return last_op_peak_bytes_;
  }
  double time_ms() const {
    return time_ms_;
  }
  /// The standalone values the last op dropped.
  const std::vector<int64_t>& released() const {
    return released_;
  }

 private:
  static constexpr uint8_t kNotRecorded = 0;
  static constexpr uint8_t kFullRecord = 1;
  static constexpr uint8_t kSelectiveRecord = 2;

  bool held(int64_t v) const {
    return v == 0 || standalone_[v] || in_record_[v] || readers_recorded_[v];
  }

  std::string forward_error(const Op& op) const {
    const int64_t i = op.stage;
    if (i > next_backward_) {
      return "forward of stage " + std::to_string(i) + " after its backward";
    }
    for (int64_t v : graph_.input_values(i)) {
      if (!held(v)) {
        return "forward of stage " + std::to_string(i) + " needs " +
               value_name(v) +
               ", which is not held (dropped or never computed)";
      }
    }
    if (held(i + 1)) {
      return "forward of stage " + std::to_string(i) + " would compute " +
             value_name(i + 1) + ", which is already held";
    }
    if (i == graph_.size() - 1 && !is_record(op.kind)) {
      return "forward of the last stage " + std::to_string(i) +
             " must be kForwardRecord or kForwardSelective (its output only "
             "feeds the loss)";
    }
    if (op.kind == OpKind::kForwardSelective && !graph_.stage(i).selective) {
      return "selective forward of stage " + std::to_string(i) +
             ", which has no selective cost (StageCost::selective is unset)";
    }
    return "";
  }

  void run_forward(const Op& op, bool output_unused) {
    const int64_t i = op.stage;
    const StageCost& cost = graph_.stage(i);
    int64_t produced = cost.output_bytes;
    int64_t transient = cost.forward_extra();
    if (op.kind == OpKind::kForwardRecord) {
      produced = cost.saved_bytes;
      transient = cost.record_extra();
    } else if (op.kind == OpKind::kForwardSelective) {
      produced = cost.selective->saved_bytes;
      transient = cost.selective_forward_extra();
    }
    last_op_peak_bytes_ = current_bytes_ + produced + transient;
    peak_bytes_ = std::max(peak_bytes_, last_op_peak_bytes_);
    current_bytes_ += produced;
    if (is_record(op.kind)) {
      recorded_[i] =
          op.kind == OpKind::kForwardSelective ? kSelectiveRecord : kFullRecord;
      in_record_[i + 1] = 1;
      for (int64_t v : graph_.input_values(i)) {
        ++readers_recorded_[v];
      }
    } else {
      standalone_[i + 1] = 1;
      if (output_unused) {
        drop(i + 1);
      }
    }
    time_ms_ += cost.forward_ms;
  }

  std::string backward_error(int64_t i) const {
    return detail::backward_order_error(
        i, next_backward_, recorded_[i] != kNotRecorded);
  }

  void run_backward(int64_t i) {
    const int64_t n = graph_.size();
    const StageCost& cost = graph_.stage(i);
    const bool selective = recorded_[i] == kSelectiveRecord;
    int64_t live = current_bytes_;
    if (i == n - 1) {
      live += graph_.value_bytes(n);  // the output's gradient appears
    }
    int64_t produced = 0;
    int64_t added = 0;
    for (int64_t v : graph_.input_values(i)) {
      produced += graph_.value_bytes(v);
      if (!has_gradient_[v]) {
        added += graph_.value_bytes(v);
        has_gradient_[v] = 1;
      }
      --readers_recorded_[v];
    }
    last_op_peak_bytes_ = live + produced + cost.backward_extra(selective);
    peak_bytes_ = std::max(peak_bytes_, last_op_peak_bytes_);
    live += added - graph_.value_bytes(i + 1) -
            (selective ? cost.selective->saved_bytes : cost.saved_bytes);
    has_gradient_[i + 1] = 0;
    recorded_[i] = kNotRecorded;
    in_record_[i + 1] = 0;
    current_bytes_ = live;
    next_backward_ = i - 1;
    time_ms_ += cost.backward_ms;
    if (selective) {
      time_ms_ += cost.selective->recompute_ms;
    }
  }

  // Drops a standalone x_v that no live record reads (x_0 is never dropped).
  void drop(int64_t v) {
    if (v > 0 && standalone_[v] && readers_recorded_[v] == 0) {
      standalone_[v] = 0;
      current_bytes_ -= graph_.value_bytes(v);
      released_.push_back(v);
    }
  }

  const Graph& graph_;
  const Plan& plan_;
  const Liveness liveness_;
  std::vector<char> standalone_;           // x_v held outside any record
  std::vector<char> in_record_;            // x_{i+1} inside R_i
  std::vector<int64_t> readers_recorded_;  // live records that read x_v
  std::vector<char> has_gradient_;         // g_v held
  std::vector<uint8_t> recorded_;          // by stage
  int64_t next_backward_;
  int64_t current_bytes_;
  int64_t peak_bytes_;
  int64_t last_op_peak_bytes_ = 0;
  double time_ms_ = 0;
  std::vector<int64_t> released_;
};

}  // namespace

Simulation simulate(const Graph& graph, const Plan& plan) {
  GraphReplay replay(graph, plan);
  return detail::replay_plan(
      plan,
      replay,
      graph.cold_write_ms_per_mib(),
      [&](size_t k) { return replay.apply(k); },
      [](size_t) {});
}

std::vector<std::vector<int64_t>> released_values(
    const Graph& graph, const Plan& plan) {
  std::vector<std::vector<int64_t>> released(plan.ops.size());
  GraphReplay replay(graph, plan);
  const Simulation simulation = detail::replay_plan(
      plan,
      replay,
      graph.cold_write_ms_per_mib(),
      [&](size_t k) { return replay.apply(k); },
      [&](size_t k) { released[k] = replay.released(); });
  if (!simulation.valid) {
    throw std::invalid_argument(
        "remat::planner::released_values: the plan is not valid for the "
        "graph: " +
        simulation.error);
  }
  return released;
}

}  // namespace remat::planner
