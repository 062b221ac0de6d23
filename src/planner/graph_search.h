// What the graph searches share (graph_solvers.cpp, graph_exact.cpp): a mode
// assignment with its simulated cost, what a search is asked, and the ways
// each stage may run. See NOTE: [Graph plans] in graph_solvers.cpp.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "remat/planner/graph.h"
#include "remat/planner/solvers.h"

namespace remat::planner::detail {

/// A mode assignment with its simulated cost.
struct Candidate {
  std::vector<StageMode> modes;
  int64_t peak_bytes = std::numeric_limits<int64_t>::max();
  double time_ms = std::numeric_limits<double>::infinity();
  /// The distinct peaks of the plan's ops, highest first; filled only when
  /// evaluate() is asked for them (NOTE: [Below the peak] in
  /// graph_solvers.cpp).
  std::vector<int64_t> op_peaks;
};

/// Sets candidate's peak and time from simulate(schedule_graph(...)), and,
/// with `with_op_peaks`, its op_peaks.
void evaluate(
    const Graph& graph, Candidate& candidate, bool with_op_peaks = false);

// Lexicographic preferences of the searches.
inline bool faster(const Candidate& a, const Candidate& b) {
  return a.time_ms < b.time_ms ||
         (a.time_ms == b.time_ms && a.peak_bytes < b.peak_bytes);
}
inline bool smaller(const Candidate& a, const Candidate& b) {
  return a.peak_bytes < b.peak_bytes ||
         (a.peak_bytes == b.peak_bytes && a.time_ms < b.time_ms);
}
/// As smaller(), but between equal peaks the lower op peaks below it win
/// (compared highest first), then the faster.
inline bool lower_profile(const Candidate& a, const Candidate& b) {
  if (a.peak_bytes != b.peak_bytes) {
    return a.peak_bytes < b.peak_bytes;
  }
  if (a.op_peaks != b.op_peaks) {
    return a.op_peaks < b.op_peaks;
  }
  return a.time_ms < b.time_ms;
}

/// What a search is asked: the fastest plan within budget_bytes, or (with
/// min_memory) the plan of least peak.
struct Goal {
  int64_t budget_bytes = 0;
  bool min_memory = false;

  bool fits(const Candidate& c) const {
    return min_memory || c.peak_bytes <= budget_bytes;
  }
  bool better(const Candidate& a, const Candidate& b) const {
    if (min_memory) {
      return smaller(a, b);
    }
    if (fits(a) != fits(b)) {
      return fits(a);
    }
    return fits(a) ? faster(a, b) : smaller(a, b);
  }
};

/// The ways stage i may run: kRecord, kSelective (with a selective cost),
/// and, for every stage but the last, kCheckpoint and kRecompute.
std::vector<StageMode> ways_of(const Graph& graph, int64_t i);

/// The work one simulate() of a plan of `graph` counts for in the searches'
/// work limits: simulate() replays about four ops per stage.
inline int64_t simulation_work(const Graph& graph) {
  return 4 * graph.size();
}

/// The time stage i adds to a plan when run in `way`: its forward and
/// backward, a second forward for kCheckpoint and kRecompute (the class runs
/// every stage at most twice), the selective recomputation for kSelective.
/// A plan's time is the sum over its stages.
inline double way_time(const Graph& graph, int64_t i, StageMode way) {
  const StageCost& cost = graph.stage(i);
  double time = cost.forward_ms + cost.backward_ms;
  if (way == StageMode::kCheckpoint || way == StageMode::kRecompute) {
    time += cost.forward_ms;
  } else if (way == StageMode::kSelective) {
    time += cost.selective->recompute_ms;
  }
  return time;
}

/// Improves `best` (a candidate with modes) by trying every combination of
/// ways on small windows of stages, the rest fixed (NOTE: [Windows] in
/// graph_solvers.cpp), until its work passes `work_limit`.
void search_windows(
    const Graph& graph, const Goal& goal, Candidate& best, int64_t work_limit);

/// The branch-and-bound search of NOTE: [Exact graph search]: improves
/// `best` (a valid candidate, or one with no modes) to the best plan of the
/// class for `goal`. Returns false if it gave up after `work_limit` (search
/// nodes, each weighted by its depth), leaving in `best` the best plan found
/// so far.
bool search_exact(
    const Graph& graph, const Goal& goal, Candidate& best, int64_t work_limit);

}  // namespace remat::planner::detail
