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
#include <optional>
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
      int64_t forward = std::numeric_limits<int64_t>::max();
      int64_t backward = std::numeric_limits<int64_t>::max();
      for (StageMode way : ways_of(graph, i)) {
        forward = std::min(forward, forward_adds(i, way));
        backward = std::min(backward, backward_adds(i, way));
      }
      backward += backward_gradients(i);
      later_[i] = std::max({later_[i + 1], forward, backward});
    }
    for (int64_t i = n_ - 1; i >= 0; --i) {
      double fastest = std::numeric_limits<double>::infinity();
      for (StageMode way : ways_of(graph, i)) {
        fastest = std::min(fastest, time_of(i, way));
      }
      suffix_time_[i] = suffix_time_[i + 1] + fastest;
    }
    if (!goal.min_memory) {
      set_up_knapsacks();
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
    return way_time(graph_, i, way);
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

  // What the forward of stage i run in `way` adds to what is live: its
  // record or output and the op's transient.
  int64_t forward_adds(int64_t i, StageMode way) const {
    const StageCost& cost = graph_.stage(i);
    switch (way) {
      case StageMode::kRecord:
        return cost.saved_bytes + cost.record_extra();
      case StageMode::kSelective:
        return cost.selective->saved_bytes + cost.selective_forward_extra();
      case StageMode::kCheckpoint:
      case StageMode::kRecompute:
        return cost.output_bytes + cost.forward_extra();
    }
    return 0;
  }

  // What the backward of stage i after `way` holds of the stage itself: its
  // record (recorded again in full if `way` did not record it) and the op's
  // transient.
  int64_t backward_adds(int64_t i, StageMode way) const {
    const StageCost& cost = graph_.stage(i);
    const bool selective = way == StageMode::kSelective;
    return (selective ? cost.selective->saved_bytes : cost.saved_bytes) +
           cost.backward_extra(selective);
  }

  // The gradients the backward of stage i holds whatever the modes
  // (gradients_) and those it produces, of its inputs.
  int64_t backward_gradients(int64_t i) const {
    int64_t bytes = gradients_[i];
    for (int64_t v : graph_.input_values(i)) {
      bytes += graph_.value_bytes(v);
    }
    return bytes;
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
    return bytes + forward_adds(i, way);
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
    int64_t bytes = graph_.input_bytes() + backward_gradients(i);
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
    return bytes + backward_adds(i, way);
  }

  // NOTE: [Memory against time]
  // When stage j runs its forward or its backward, every earlier stage l
  // holds at least held_of(l, mode_l) (a record until its backward, a
  // kCheckpoint output until its first reader's backward), so a plan fits
  // the budget only if, for every j,
  //   input + sum over l < j of held_of(l, mode_l) + need_of(j, mode_j)
  //     <= budget,
  // where need_of is what stage j's own forward or backward adds. For the
  // stages not yet assigned (a suffix s..L-1) each such j, for each way of
  // stage j, is a multiple-choice knapsack over the stages s..j-1: each
  // takes one way, of held bytes w and time t, within what the assigned
  // stages and stage j leave. Its linear relaxation bounds their least time
  // from below: start
  // every stage at its fastest way and give up bytes along the lower convex
  // hulls of the (w, t) points of the stages together, cheapest milliseconds
  // per byte first, the last step taken in part. With the time stage j's
  // way adds beyond its fastest, the least over its ways bounds what
  // constraint j costs. The bound is the largest over j, taken over the last
  // stage and the kKnapsacks stages whose
  // constraint is tightest with every stage in its fastest way (any subset
  // of the j gives a bound; each costs a walk). set_up_knapsacks() sorts the
  // hull steps of every stage once; suffix_time() walks them for each j,
  // skipping other stages, and counts every kStepsPerWork steps walked as
  // one unit of work (a step costs about that fraction of a bound's step).
  static constexpr size_t kKnapsacks = 4;
  static constexpr int64_t kStepsPerWork = 8;
  struct HullStep {
    double ms_per_byte = 0;
    int64_t stage = 0;
    int64_t bytes = 0;  // given up
    double ms = 0;      // added
  };

  // What stage i adds to what is live at its forward or its backward when
  // run in `way` (its held bytes not counted).
  int64_t need_of(int64_t i, StageMode way) const {
    return std::max(
        forward_adds(i, way), backward_gradients(i) + backward_adds(i, way));
  }

  void set_up_knapsacks() {
    fastest_held_.assign(static_cast<size_t>(n_ + 1), 0);
    least_held_.assign(static_cast<size_t>(n_ + 1), 0);
    own_.assign(static_cast<size_t>(n_), {});
    for (int64_t i = 0; i < n_; ++i) {
      const std::vector<StageMode> ways = ways_of(graph_, i);
      double fastest = std::numeric_limits<double>::infinity();
      for (StageMode way : ways) {
        fastest = std::min(fastest, time_of(i, way));
      }
      for (StageMode way : ways) {
        own_[i].push_back({need_of(i, way), time_of(i, way) - fastest});
      }
      // The fastest way (ties: the fewest bytes) starts the hull.
      StageMode at = ways.front();
      int64_t least = held_of(i, at);
      for (StageMode way : ways) {
        least = std::min(least, held_of(i, way));
        if (time_of(i, way) < time_of(i, at) ||
            (time_of(i, way) == time_of(i, at) &&
             held_of(i, way) < held_of(i, at))) {
          at = way;
        }
      }
      fastest_held_[i + 1] = fastest_held_[i] + held_of(i, at);
      least_held_[i + 1] = least_held_[i] + least;
      // The lower hull towards fewer bytes: from each point, the next is
      // the one of fewer bytes with the least slope (ties: the fewest bytes).
      for (;;) {
        std::optional<StageMode> next;
        double next_slope = 0;
        for (StageMode way : ways) {
          const int64_t bytes = held_of(i, at) - held_of(i, way);
          if (bytes <= 0) {
            continue;
          }
          const double slope =
              (time_of(i, way) - time_of(i, at)) / static_cast<double>(bytes);
          if (!next || slope < next_slope ||
              (slope == next_slope && held_of(i, way) < held_of(i, *next))) {
            next = way;
            next_slope = slope;
          }
        }
        if (!next) {
          break;
        }
        hull_.push_back(
            {next_slope,
             i,
             held_of(i, at) - held_of(i, *next),
             time_of(i, *next) - time_of(i, at)});
        at = *next;
      }
    }
    std::stable_sort(
        hull_.begin(), hull_.end(), [](const HullStep& a, const HullStep& b) {
          return a.ms_per_byte < b.ms_per_byte;
        });
    // The constraints: the tightest with every stage at its fastest way,
    // and the last stage's.
    std::vector<std::pair<int64_t, int64_t>> tightness;  // (-overflow, j)
    for (int64_t j = 0; j + 1 < n_; ++j) {
      int64_t least_need = std::numeric_limits<int64_t>::max();
      for (const Own& own : own_[j]) {
        least_need = std::min(least_need, own.bytes);
      }
      tightness.push_back({-(fastest_held_[j] + least_need), j});
    }
    std::sort(tightness.begin(), tightness.end());
    for (size_t k = 0; k < std::min(kKnapsacks, tightness.size()); ++k) {
      knapsacks_.push_back(tightness[k].second);
    }
    knapsacks_.push_back(n_ - 1);
    std::sort(knapsacks_.begin(), knapsacks_.end());
  }

  // The least time the stages s..j-1 add to their fastest ways to hold at
  // most `cap` bytes together, relaxed (NOTE: [Memory against time]); +inf
  // if their least bytes exceed it.
  double relaxed_extra(int64_t s, int64_t j, int64_t cap) {
    if (least_held_[j] - least_held_[s] > cap) {
      return std::numeric_limits<double>::infinity();
    }
    int64_t over = fastest_held_[j] - fastest_held_[s] - cap;
    double extra = 0;
    for (const HullStep& step : hull_) {
      if (over <= 0) {
        break;
      }
      ++walked_;
      if (step.stage < s || step.stage >= j) {
        continue;
      }
      const int64_t take = std::min(over, step.bytes);
      extra += step.ms *
               (static_cast<double>(take) / static_cast<double>(step.bytes));
      over -= take;
    }
    return extra;
  }

  // The least time of stages s..L-1 in any plan that fits the budget when
  // stages 0..s-1 hold `held` bytes (NOTE: [Memory against time]); +inf if
  // none can. Without a budget (the least memory), their fastest ways.
  double suffix_time(int64_t s, int64_t held) {
    if (goal_.min_memory) {
      return suffix_time_[s];
    }
    const int64_t room = goal_.budget_bytes - graph_.input_bytes() - held;
    double most = 0;
    for (int64_t j : knapsacks_) {
      if (j < s) {
        continue;
      }
      // Stage j's own way decides both what it needs and what it costs.
      double least = std::numeric_limits<double>::infinity();
      for (const Own& own : own_[j]) {
        if (own.extra_ms < least) {
          least = std::min(
              least, own.extra_ms + relaxed_extra(s, j, room - own.bytes));
        }
      }
      most = std::max(most, least);
      if (most == std::numeric_limits<double>::infinity()) {
        break;  // nothing fits
      }
    }
    work_ += walked_ / kStepsPerWork;
    walked_ %= kStepsPerWork;
    // A relative margin far above float rounding keeps the bound below the
    // true least time however simulate() orders its sums.
    return suffix_time_[s] + most * (1 - 1e-9);
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
      work_ += simulation_work(graph_);
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
      const int64_t now_held = held + held_of(i, way);
      const double time_bound =
          time + time_of(i, way) + suffix_time(i + 1, now_held);
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
  // NOTE: [Memory against time]; set for a time goal only.
  std::vector<HullStep> hull_;  // every stage's, by ms per byte
  // [i]: the sum over stages 0..i-1 of held_of in the fastest way, and of
  // the least held_of.
  std::vector<int64_t> fastest_held_;
  std::vector<int64_t> least_held_;
  struct Own {
    int64_t bytes = 0;    // need_of(j, way)
    double extra_ms = 0;  // time_of(j, way) beyond j's fastest way
  };
  std::vector<std::vector<Own>> own_;  // by stage, one per way
  std::vector<int64_t> knapsacks_;     // the j of the constraints, ascending
  int64_t walked_ = 0;                 // hull steps not yet counted as work
  int64_t work_ = 0;
};

}  // namespace

bool search_exact(
    const Graph& graph, const Goal& goal, Candidate& best, int64_t node_limit) {
  return ExactSearch(graph, goal, best, node_limit).run();
}

}  // namespace remat::planner::detail
