// The exact search over the plans of NOTE: [Graph plans] (graph_solvers.cpp).
//
// NOTE: [Exact graph search]
// A depth-first branch and bound over the stages' modes, in stage order,
// each leaf costed by simulate() (the one definition of a plan's cost). It is
// exact for the class because it prunes a partial assignment (the modes of
// stages 0..i) only on bounds that hold for every way of completing it:
//
//   time: a plan's time is the sum over stages of the time of its way (the
//     forward, the backward, a second forward for kCheckpoint and kRecompute,
//     the selective recomputation for kSelective: schedule_graph runs every
//     stage at most twice), so the assigned stages' times plus the fastest
//     way of each other stage bound it from below;
//   peak: two events of the plan depend only on the modes of stages 0..i.
//     The forward of stage i holds x_0, every record of an earlier recorded
//     stage, every kCheckpoint output of an earlier stage, and every
//     kRecompute output of an earlier stage that a later stage still reads
//     or a recorded stage holds. The backward of stage i holds x_0, the
//     records and kCheckpoint outputs of the earlier stages, the kRecompute
//     outputs of earlier stages that stage i or an earlier recorded stage
//     reads, its own record (recorded again if it was not), the gradient of
//     its output and of every value a later stage reads, plus what the
//     backward op itself produces (the gradients of its inputs, its
//     transient). What the plan recomputes for other stages only adds to
//     both; so each is a lower bound of the plan's peak. Two more: a stage
//     recorded again needs its inputs, and the output of the stage before it
//     has no other reader that could hold it, so a run of kRecompute stages
//     before it (each reading the one before) holds full records during its
//     backward; and every later op holds, besides x_0 and what stages 0..i
//     keep, at least the least its stage needs in any of its ways.
//
// The search starts from the local search's answer (an incumbent to beat),
// tries each stage's fastest ways first (for the least memory, its smallest
// first), and prunes a branch whose bounds cannot beat the incumbent or do not
// fit the budget. On graphs whose skips nest (U-Nets, residual stacks) the
// bounds cut most branches; on larger graphs it may give up after its work
// limit (search nodes, each weighted by its depth), and the caller keeps the
// best plan found.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "graph_search.h"

namespace remat::planner::detail {
namespace {

class ExactSearch {
 public:
  ExactSearch(
      const Graph& graph, const Goal& goal, Candidate& best, int64_t limit)
      : graph_(graph),
        goal_(goal),
        best_(best),
        work_limit_(limit),
        n_(graph.size()),
        last_reader_(static_cast<size_t>(n_ + 1), -1),
        readers_(static_cast<size_t>(n_ + 1)),
        gradients_(static_cast<size_t>(n_), 0),
        suffix_time_(static_cast<size_t>(n_ + 1), 0),
        later_(static_cast<size_t>(n_ + 1), 0),
        reads_previous_(static_cast<size_t>(n_), 0),
        modes_(static_cast<size_t>(n_), StageMode::kRecord) {
    for (int64_t i = 0; i < n_; ++i) {
      for (int64_t v : graph.input_values(i)) {
        last_reader_[v] = i;  // stages ascend: the last one wins
        readers_[v].push_back(i);
        reads_previous_[i] |= v == i ? 1 : 0;
      }
    }
    // The gradients held at the backward of stage i whatever the modes: the
    // output's, and those of the values a later stage reads.
    for (int64_t i = 0; i < n_; ++i) {
      int64_t bytes = graph.value_bytes(i + 1);
      for (int64_t v = 0; v <= i; ++v) {
        if (last_reader_[v] > i) {
          bytes += graph.value_bytes(v);
        }
      }
      gradients_[i] = bytes;
    }
    // The least each later op needs on top of x_0 and what earlier stages
    // hold (see later_).
    for (int64_t i = n_ - 1; i >= 0; --i) {
      const StageCost& cost = graph.stage(i);
      int64_t forward = std::numeric_limits<int64_t>::max();
      int64_t backward = std::numeric_limits<int64_t>::max();
      int64_t input_gradients = 0;
      for (int64_t v : graph.input_values(i)) {
        input_gradients += graph.value_bytes(v);
      }
      for (StageMode way : ways_of(graph, i)) {
        const bool selective = way == StageMode::kSelective;
        int64_t op = cost.output_bytes + cost.forward_extra();
        if (way == StageMode::kRecord) {
          op = cost.saved_bytes + cost.record_extra();
        } else if (selective) {
          op = cost.selective->saved_bytes + cost.selective_forward_extra();
        }
        forward = std::min(forward, op);
        backward = std::min(
            backward,
            (selective ? cost.selective->saved_bytes : cost.saved_bytes) +
                cost.backward_extra(selective));
      }
      backward += gradients_[i] + input_gradients;
      later_[i] = std::max({later_[i + 1], forward, backward});
    }
    for (int64_t i = n_ - 1; i >= 0; --i) {
      double fastest = std::numeric_limits<double>::infinity();
      for (StageMode way : ways_of(graph, i)) {
        fastest = std::min(fastest, time_of(i, way));
      }
      suffix_time_[i] = suffix_time_[i + 1] + fastest;
    }
    for (int64_t i = 0; i < n_; ++i) {
      std::vector<StageMode> ways = ways_of(graph, i);
      std::stable_sort(ways.begin(), ways.end(), [&](StageMode a, StageMode b) {
        return goal.min_memory ? held_of(i, a) < held_of(i, b)
                               : time_of(i, a) < time_of(i, b);
      });
      ways_.push_back(std::move(ways));
    }
  }

  bool run() {
    visit(0, 0.0, 0, 0);
    return work_ <= work_limit_;
  }

 private:
  double time_of(int64_t i, StageMode way) const {
    const StageCost& cost = graph_.stage(i);
    double time = cost.forward_ms + cost.backward_ms;
    if (way == StageMode::kCheckpoint || way == StageMode::kRecompute) {
      time += cost.forward_ms;
    } else if (way == StageMode::kSelective) {
      time += cost.selective->recompute_ms;
    }
    return time;
  }

  // The bytes stage i leaves held from its forward to (at least) the
  // backward of its output's first reader; kRecompute: 0 (see held_output).
  int64_t held_of(int64_t i, StageMode way) const {
    const StageCost& cost = graph_.stage(i);
    switch (way) {
      case StageMode::kRecord:
        return cost.saved_bytes;
      case StageMode::kSelective:
        return cost.selective->saved_bytes;
      case StageMode::kCheckpoint:
        return cost.output_bytes;
      case StageMode::kRecompute:
        return 0;
    }
    return 0;
  }

  static bool recorded(StageMode way) {
    return way == StageMode::kRecord || way == StageMode::kSelective;
  }

  // Whether a stage among `readers` (the readers of one value, ascending)
  // with index below `before` is recorded (those stages are assigned).
  bool held_by_record(
      const std::vector<int64_t>& readers, int64_t before) const {
    for (int64_t r : readers) {
      if (r >= before) {
        break;
      }
      if (recorded(modes_[r])) {
        return true;
      }
    }
    return false;
  }

  // Lower bound of the peak of the forward of stage i run in `way`.
  int64_t forward_bound(int64_t i, StageMode way) const {
    int64_t bytes = graph_.input_bytes();
    for (int64_t j = 0; j < i; ++j) {
      const int64_t v = j + 1;
      if (modes_[j] != StageMode::kRecompute) {
        bytes += held_of(j, modes_[j]);
      } else if (last_reader_[v] >= i || held_by_record(readers_[v], i)) {
        bytes += graph_.value_bytes(v);
      }
    }
    const StageCost& cost = graph_.stage(i);
    switch (way) {
      case StageMode::kRecord:
        return bytes + cost.saved_bytes + cost.record_extra();
      case StageMode::kSelective:
        return bytes + cost.selective->saved_bytes +
               cost.selective_forward_extra();
      case StageMode::kCheckpoint:
      case StageMode::kRecompute:
        return bytes + cost.output_bytes + cost.forward_extra();
    }
    return bytes;
  }

  // Lower bound of the peak of the backward of stage i run in `way`.
  int64_t backward_bound(int64_t i, StageMode way) const {
    const std::vector<int64_t>& inputs = graph_.input_values(i);
    // A stage recorded again needs its inputs; the output of the stage
    // before it, if kRecompute, has no reader before it that could hold it,
    // so that stage is recorded too (now or earlier), and so on back along
    // the chain: stages run_begin..i-1 hold their full records.
    int64_t run_begin = i;
    if (!recorded(way)) {
      while (run_begin > 0 && modes_[run_begin - 1] == StageMode::kRecompute &&
             reads_previous_[run_begin]) {
        --run_begin;
      }
    }
    int64_t bytes = graph_.input_bytes() + gradients_[i];
    for (int64_t j = 0; j < i; ++j) {
      const int64_t v = j + 1;
      if (j >= run_begin) {
        bytes += graph_.stage(j).saved_bytes;
      } else if (modes_[j] != StageMode::kRecompute) {
        bytes += held_of(j, modes_[j]);
      } else if (
          std::binary_search(inputs.begin(), inputs.end(), v) ||
          held_by_record(readers_[v], i)) {
        bytes += graph_.value_bytes(v);
      }
    }
    for (int64_t v : inputs) {
      bytes += graph_.value_bytes(v);  // the gradients the backward produces
    }
    const StageCost& cost = graph_.stage(i);
    const bool selective = way == StageMode::kSelective;
    bytes += selective ? cost.selective->saved_bytes : cost.saved_bytes;
    return bytes + cost.backward_extra(selective);
  }

  bool beaten(int64_t peak_bound, double time_bound) const {
    if (goal_.min_memory) {
      return peak_bound > best_.peak_bytes ||
             (peak_bound == best_.peak_bytes && time_bound >= best_.time_ms);
    }
    if (peak_bound > goal_.budget_bytes) {
      return true;
    }
    return goal_.fits(best_) && time_bound >= best_.time_ms;
  }

  // Visits the assignments of stages i..L-1 after those of 0..i-1, which
  // take `time` and leave `held` bytes (held_of) for every later op.
  void visit(int64_t i, double time, int64_t peak_bound, int64_t held) {
    work_ += i + 1;  // the bounds below cost about one step per stage
    if (work_ > work_limit_) {
      return;
    }
    if (i == n_) {
      work_ += n_ * 4;  // simulate() replays about four ops per stage
      Candidate candidate;
      candidate.modes = modes_;
      evaluate(graph_, candidate);
      if (best_.modes.empty() || goal_.better(candidate, best_)) {
        best_ = std::move(candidate);
      }
      return;
    }
    for (StageMode way : ways_[i]) {
      modes_[i] = way;
      const double time_bound = time + time_of(i, way) + suffix_time_[i + 1];
      const int64_t now_held = held + held_of(i, way);
      const int64_t bound = std::max(
          {peak_bound,
           forward_bound(i, way),
           backward_bound(i, way),
           graph_.input_bytes() + now_held + later_[i + 1]});
      if (!beaten(bound, time_bound)) {
        visit(i + 1, time + time_of(i, way), bound, now_held);
      }
      if (work_ > work_limit_) {
        return;
      }
    }
    modes_[i] = StageMode::kRecord;
  }

  const Graph& graph_;
  const Goal& goal_;
  Candidate& best_;
  const int64_t work_limit_;
  const int64_t n_;
  std::vector<int64_t> last_reader_;           // by value; -1: none
  std::vector<std::vector<int64_t>> readers_;  // by value, ascending
  std::vector<int64_t> gradients_;             // by stage (see constructor)
  std::vector<double> suffix_time_;            // fastest time of stages i..L-1
  // The most that any op of stages i..L-1 needs, at the least, besides x_0
  // and the bytes earlier stages hold (held_of): its output or record and
  // transient; for a backward, its record, transient and the gradients it
  // holds and produces.
  std::vector<int64_t> later_;
  std::vector<char> reads_previous_;          // stage i reads x_i
  std::vector<std::vector<StageMode>> ways_;  // by stage, in search order
  std::vector<StageMode> modes_;
  int64_t work_ = 0;
};

}  // namespace

bool search_exact(
    const Graph& graph, const Goal& goal, Candidate& best, int64_t node_limit) {
  return ExactSearch(graph, goal, best, node_limit).run();
}

}  // namespace remat::planner::detail
