// The graph solvers: schedule_graph() and the searches over its plans.
//
// NOTE: [Graph plans]
// A graph plan of this solver runs every stage once in the forward pass --
// recorded (kRecord, kSelective) or not (kCheckpoint, kRecompute) -- and then
// the backwards in reverse stage order. Before the backward of a stage that
// is not recorded, the stage is recorded again; before any recorded
// recomputation, every input it needs that is no longer held (the output of
// a kRecompute stage whose record is gone and that no live record reads) is
// recomputed first, recursively, recorded, so that its record serves its own
// backward later. kCheckpoint outputs are never recomputed: the memory
// model holds them until their last read.
//
// The search: the mode of each stage is one of its ways (three, four with a
// selective cost; the last stage is always recorded). With at most
// kMaxExhaustiveGraphPlans combinations every one is simulated. Otherwise a
// local search runs from three starts (all recorded, all checkpointed, all
// recomputed; for the least memory also every k-th stage checkpointed and
// the rest recomputed, k = 2, 3, max(4, sqrt(L))). It passes over the stages,
// largest records first, and gives each the way that lowers the peak most
// (ties: the faster), until the plan fits the budget or a pass changes nothing;
// then it passes over them, slowest forwards first, giving each the fastest way
// that still fits, until a pass changes nothing. For the least memory, the
// descent by peak is followed by one that also lowers the op peaks below it
// (NOTE: [Below the peak]). All of it runs within a work limit
// (NOTE: [A bounded local search]). The best plan of all starts is
// the incumbent of the exact branch and bound (NOTE: [Exact graph search] in
// graph_exact.cpp), which answers with the best plan of the class when it
// finishes within SolverOptions::graph_search_work and with the best it found
// otherwise.
// Each pass simulates every way of every stage once. Every plan is costed by
// simulate(): one definition of peak and time.
#include "remat/planner/solvers.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "graph_search.h"
#include "remat/planner/simulate.h"

namespace remat::planner {

namespace detail {

std::vector<StageMode> ways_of(const Graph& graph, int64_t i) {
  std::vector<StageMode> ways{StageMode::kRecord};
  if (graph.stage(i).selective) {
    ways.push_back(StageMode::kSelective);
  }
  if (i < graph.size() - 1) {
    ways.push_back(StageMode::kCheckpoint);
    ways.push_back(StageMode::kRecompute);
  }
  return ways;
}

void evaluate(const Graph& graph, Candidate& candidate, bool with_op_peaks) {
  Simulation simulation =
      simulate(graph, schedule_graph(graph, candidate.modes));
  if (!simulation.valid) {
    throw std::logic_error(
        "remat::planner: schedule_graph built an invalid plan: " +
        simulation.error);
  }
  candidate.peak_bytes = simulation.peak_bytes;
  candidate.time_ms = simulation.time_ms;
  candidate.op_peaks.clear();
  if (with_op_peaks) {
    std::vector<int64_t>& peaks = simulation.op_peak_bytes;
    std::sort(peaks.begin(), peaks.end(), std::greater<>());
    peaks.erase(std::unique(peaks.begin(), peaks.end()), peaks.end());
    candidate.op_peaks = std::move(peaks);
  }
}

// NOTE: [Windows]
// Between the local search and the exact search: for a window of a few
// stages, every combination of their ways, the other stages' ways fixed.
// The windows are every run of `width` consecutive stages (one starting
// every width / 2 stages) and, for every value a stage reads that is not the
// output of the stage before it (a skip), the value's producer and that
// reader with their neighbours: the stages whose ways interact through the
// value.
//   The fastest plan within a budget: windows are 6 stages wide. A plan's
// time is the sum of its stages' (way_time), so a window's combinations are
// simulated in ascending time, only those faster than the best plan, and the
// first that fits is the window's best. The windows start from a plan that
// fits, or not at all: below the least memory that the least-memory search
// finds, solve_optimal must find nothing (it promises nullopt exactly when
// the budget is below min_feasible_budget_bytes), and above it the
// least-memory plan fits.
//   The least memory: windows are 4 stages wide and every combination is
// simulated.
// Passes over all windows repeat while one improves, at most kWindowPasses,
// and stop when the work (four per stage of every simulated plan, as in the
// exact search) passes SolverOptions::graph_search_work.
namespace {

constexpr int64_t kWindowPasses = 3;

std::vector<std::vector<int64_t>> windows_of(
    const Graph& graph, int64_t width) {
  const int64_t n = graph.size();
  std::vector<std::vector<int64_t>> windows;
  for (int64_t first = 0;; first += width / 2) {
    std::vector<int64_t> window;
    for (int64_t i = first; i < std::min(n, first + width); ++i) {
      window.push_back(i);
    }
    windows.push_back(std::move(window));
    if (first + width >= n) {
      break;
    }
  }
  for (int64_t reader = 0; reader < n; ++reader) {
    for (int64_t v : graph.input_values(reader)) {
      if (v == 0 || v == reader) {
        continue;  // the graph input, or the output of the stage before
      }
      std::vector<int64_t> window;
      for (int64_t center : {v - 1, reader}) {
        for (int64_t i = center - 1; i <= center + 1; ++i) {
          if (i >= 0 && i < n) {
            window.push_back(i);
          }
        }
      }
      std::sort(window.begin(), window.end());
      window.erase(std::unique(window.begin(), window.end()), window.end());
      windows.push_back(std::move(window));
    }
  }
  std::sort(windows.begin(), windows.end());
  windows.erase(std::unique(windows.begin(), windows.end()), windows.end());
  return windows;
}

// One window: replaces `best` by the window's best combination if it is
// better. Returns whether it did. Adds the work of every simulated plan to
// `work` and stops early when it passes `work_limit`.
bool improve_window(
    const Graph& graph,
    const Goal& goal,
    const std::vector<int64_t>& window,
    Candidate& best,
    int64_t& work,
    int64_t work_limit) {
  struct Combination {
    double time_ms;
    std::vector<StageMode> ways;
  };
  std::vector<std::vector<StageMode>> ways;
  double fixed_ms = best.time_ms;
  for (int64_t i : window) {
    ways.push_back(ways_of(graph, i));
    fixed_ms -= way_time(graph, i, best.modes[i]);
  }
  const bool by_time = !goal.min_memory;
  std::vector<Combination> combinations;
  std::vector<size_t> digit(window.size(), 0);
  for (;;) {
    Combination c{fixed_ms, {}};
    bool same = true;
    for (size_t k = 0; k < window.size(); ++k) {
      c.ways.push_back(ways[k][digit[k]]);
      c.time_ms += way_time(graph, window[k], c.ways.back());
      same = same && c.ways.back() == best.modes[window[k]];
    }
    if (!same && (!by_time || c.time_ms < best.time_ms)) {
      combinations.push_back(std::move(c));
    }
    size_t k = 0;
    while (k < window.size() && ++digit[k] == ways[k].size()) {
      digit[k++] = 0;
    }
    if (k == window.size()) {
      break;
    }
  }
  if (by_time) {
    std::stable_sort(
        combinations.begin(),
        combinations.end(),
        [](const Combination& a, const Combination& b) {
          return a.time_ms < b.time_ms;
        });
  }
  bool improved = false;
  for (const Combination& c : combinations) {
    work += simulation_work(graph);
    if (work > work_limit) {
      return improved;
    }
    Candidate candidate;
    candidate.modes = best.modes;
    for (size_t k = 0; k < window.size(); ++k) {
      candidate.modes[window[k]] = c.ways[k];
    }
    evaluate(graph, candidate);
    if (goal.better(candidate, best)) {
      best = std::move(candidate);
      improved = true;
      if (by_time) {
        return true;  // the fastest combination that fits
      }
    }
  }
  return improved;
}

}  // namespace

void search_windows(
    const Graph& graph, const Goal& goal, Candidate& best, int64_t work_limit) {
  if (!goal.min_memory && !goal.fits(best)) {
    return;
  }
  const std::vector<std::vector<int64_t>> windows =
      windows_of(graph, goal.min_memory ? 4 : 6);
  int64_t work = 0;
  for (int64_t pass = 0; pass < kWindowPasses; ++pass) {
    bool improved = false;
    for (const std::vector<int64_t>& window : windows) {
      improved = improve_window(graph, goal, window, best, work, work_limit) ||
                 improved;
    }
    if (!improved || work > work_limit) {
      return;
    }
  }
}

}  // namespace detail

namespace {
using detail::Candidate;
using detail::evaluate;
using detail::faster;
using detail::Goal;
using detail::smaller;
using detail::ways_of;

/// Builds the plan of NOTE: [Graph plans] for a mode assignment.
class ScheduleBuilder {
 public:
  ScheduleBuilder(const Graph& graph, const std::vector<StageMode>& modes)
      : graph_(graph),
        modes_(modes),
        recorded_(static_cast<size_t>(graph.size()), 0),
        readers_recorded_(static_cast<size_t>(graph.size() + 1), 0) {}

  Plan build() {
    const int64_t n = graph_.size();
    for (int64_t i = 0; i < n; ++i) {
      const StageMode mode = mode_of(i);
      if (mode == StageMode::kRecord || mode == StageMode::kSelective) {
        record(
            i,
            mode == StageMode::kSelective ? OpKind::kForwardSelective
                                          : OpKind::kForwardRecord);
      } else {
        plan_.ops.push_back({OpKind::kForwardNoSave, i});
      }
    }
    for (int64_t i = n - 1; i >= 0; --i) {
      if (!recorded_[i]) {
        recompute(i);
      }
      plan_.ops.push_back({OpKind::kBackward, i});
      recorded_[i] = 0;
      for (int64_t v : graph_.input_values(i)) {
        --readers_recorded_[v];
      }
    }
    return std::move(plan_);
  }

 private:
  StageMode mode_of(int64_t i) const {
    if (i == graph_.size() - 1 && modes_[i] != StageMode::kSelective) {
      return StageMode::kRecord;
    }
    return modes_[i];
  }

  void record(int64_t i, OpKind kind) {
    plan_.ops.push_back({kind, i});
    recorded_[i] = 1;
    for (int64_t v : graph_.input_values(i)) {
      ++readers_recorded_[v];
    }
  }

  // Whether x_v is held at this point of the backward pass.
  bool held(int64_t v) const {
    if (v == 0 || readers_recorded_[v] > 0) {
      return true;
    }
    const int64_t producer = v - 1;
    return recorded_[producer] || mode_of(producer) == StageMode::kCheckpoint;
  }

  // Records stage i again, after recomputing the inputs it lacks.
  void recompute(int64_t i) {
    for (int64_t v : graph_.input_values(i)) {
      if (!held(v)) {
        recompute(v - 1);
      }
    }
    record(i, OpKind::kForwardRecord);
  }

  const Graph& graph_;
  const std::vector<StageMode>& modes_;
  std::vector<char> recorded_;
  std::vector<int64_t> readers_recorded_;
  Plan plan_;
};

int64_t combinations(const Graph& graph) {
  int64_t count = 1;
  for (int64_t i = 0; i < graph.size(); ++i) {
    count *= static_cast<int64_t>(ways_of(graph, i).size());
    if (count > kMaxExhaustiveGraphPlans) {
      return count;
    }
  }
  return count;
}

Candidate search_exhaustive(const Graph& graph, const Goal& goal) {
  const int64_t n = graph.size();
  std::vector<std::vector<StageMode>> ways;
  for (int64_t i = 0; i < n; ++i) {
    ways.push_back(ways_of(graph, i));
  }
  std::vector<size_t> digit(static_cast<size_t>(n), 0);
  Candidate best;
  bool have_best = false;
  while (true) {
    Candidate candidate;
    for (int64_t i = 0; i < n; ++i) {
      candidate.modes.push_back(ways[i][digit[i]]);
    }
    evaluate(graph, candidate);
    if (!have_best || goal.better(candidate, best)) {
      best = std::move(candidate);
      have_best = true;
    }
    int64_t i = 0;
    while (i < n && ++digit[i] == ways[i].size()) {
      digit[i++] = 0;
    }
    if (i == n) {
      return best;
    }
  }
}

// NOTE: [Below the peak]
// For the least memory, a descent by peak alone stalls on plateaus: where
// several ops share the peak, or where lowering it takes two changes, no
// single change lowers it and the descent stops. So each start's descent by
// peak is followed by a second one that compares plans by their distinct op
// peaks, highest first (then time): it also takes a change that keeps the
// peak but lowers the highest op peak below it that differs, which opens
// the way to changes that lower the peak itself. It takes no change that
// raises the peak, so every start ends no higher than the first descent
// left it; its work counts against the same limit. Measured (programs of
// their own against the library, E5's generators and seeds): the least
// peak on E5's 37- and 73-stage U-Nets fell from 0.300 and 0.220 of
// store-all's to 0.260 and 0.168, on its random DAGs of 100 and 200 stages
// from 0.220 and 0.191 to 0.202 and 0.156; on 64 other seeded graphs
// (U-Nets of 2 to 4 levels with jittered costs and selective stages, random
// DAGs of 12 to 145 stages) it fell on 18, by up to 20 %, and rose on one
// by 1.7 % (the windows and the branch and bound after it end elsewhere
// from another incumbent). Test
// GraphSolvers.TheLeastMemoryLocalSearchLeavesPlateaus.
//
// NOTE: [A bounded local search]
// A pass of the local search simulates every way of every stage, O(L^2),
// and a search makes a few tens of passes: 5 s at 800 stages and hours at
// 10,000. So it counts its work as the other searches do (four per stage of
// every simulated plan) and stops, keeping the plan it has, when the work
// passes max(SolverOptions::graph_search_work, kMinLocalSearchWork). The
// floor keeps the default's answers on the graphs the tests and E5 plan
// (E5's 200-stage DAG: 6 * 10^6 for the least memory, 3 * 10^6 within a
// budget; an 800-stage DAG's least-memory search reaches the floor, with
// the unbounded search's answer), and bounds a 10,000-stage graph's to
// seconds.
constexpr int64_t kMinLocalSearchWork = 100000000;

/// Work spent and its limit, shared by the descents of one local search.
struct WorkBudget {
  int64_t spent = 0;
  int64_t limit = 0;
  bool spent_out() const {
    return spent > limit;
  }
};

/// Passes over the stages, in `order`: for each stage, the way `better`
/// prefers most among its ways, if it prefers it to the current plan, is
/// taken at once. Stops after a pass that changes nothing, when
/// `more(current)` turns false, or when `work` is spent out; returns the
/// last plan. With `with_op_peaks`, every plan tried is evaluated with its
/// op peaks (`current` must have them).
template <typename Better, typename More>
Candidate descend(
    const Graph& graph,
    Candidate current,
    const std::vector<int64_t>& order,
    Better better,
    More more,
    WorkBudget& work,
    bool with_op_peaks = false) {
  bool changed = true;
  while (changed && more(current) && !work.spent_out()) {
    changed = false;
    for (int64_t i : order) {
      if (work.spent_out()) {
        break;
      }
      Candidate best = current;
      for (StageMode way : ways_of(graph, i)) {
        if (way == current.modes[i]) {
          continue;
        }
        Candidate candidate = current;
        candidate.modes[i] = way;
        evaluate(graph, candidate, with_op_peaks);
        work.spent += detail::simulation_work(graph);
        if (better(candidate, best)) {
          best = std::move(candidate);
        }
      }
      if (best.modes != current.modes) {
        current = std::move(best);
        changed = true;
        if (!more(current)) {
          break;
        }
      }
    }
  }
  return current;
}

/// The stages by decreasing `key`, ties by index.
template <typename Key>
std::vector<int64_t> stages_by(const Graph& graph, Key key) {
  std::vector<int64_t> order(static_cast<size_t>(graph.size()));
  for (int64_t i = 0; i < graph.size(); ++i) {
    order[i] = i;
  }
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return key(graph.stage(a)) > key(graph.stage(b));
  });
  return order;
}

Candidate search_local(const Graph& graph, const Goal& goal, int64_t work) {
  const int64_t n = graph.size();
  WorkBudget budget{0, std::max(work, kMinLocalSearchWork)};
  const auto always = [](const Candidate&) { return true; };
  // Memory first where records are large, speed first where forwards are
  // slow.
  const std::vector<int64_t> by_bytes =
      stages_by(graph, [](const StageCost& c) { return c.saved_bytes; });
  const std::vector<int64_t> by_time =
      stages_by(graph, [](const StageCost& c) { return c.forward_ms; });
  // The starts: every stage in one way, and, for the least memory, every
  // k-th stage checkpointed and the rest recomputed (k = 2, 3, sqrt(L)).
  std::vector<std::vector<StageMode>> starts;
  for (StageMode way :
       {StageMode::kRecord, StageMode::kCheckpoint, StageMode::kRecompute}) {
    starts.emplace_back(static_cast<size_t>(n), way);
  }
  if (goal.min_memory) {
    const auto root = static_cast<int64_t>(std::lround(std::sqrt(n)));
    for (int64_t k : {int64_t{2}, int64_t{3}, std::max<int64_t>(4, root)}) {
      std::vector<StageMode> modes;
      for (int64_t i = 0; i < n; ++i) {
        modes.push_back(
            i % k == k - 1 ? StageMode::kCheckpoint : StageMode::kRecompute);
      }
      starts.push_back(std::move(modes));
    }
  }
  Candidate best;
  bool have_best = false;
  for (std::vector<StageMode>& start : starts) {
    Candidate current;
    current.modes = std::move(start);
    current.modes.back() = StageMode::kRecord;
    evaluate(graph, current);
    if (goal.min_memory) {
      current =
          descend(graph, std::move(current), by_bytes, smaller, always, budget);
      // NOTE: [Below the peak]
      evaluate(graph, current, /*with_op_peaks=*/true);
      current = descend(
          graph,
          std::move(current),
          by_bytes,
          detail::lower_profile,
          always,
          budget,
          /*with_op_peaks=*/true);
    } else {
      // Lower the peak until the plan fits, then make it faster while it
      // fits.
      current = descend(
          graph,
          std::move(current),
          by_bytes,
          smaller,
          [&](const Candidate& c) { return !goal.fits(c); },
          budget);
      if (goal.fits(current)) {
        current = descend(
            graph,
            std::move(current),
            by_time,
            [&](const Candidate& a, const Candidate& b) {
              return goal.fits(a) && faster(a, b);
            },
            always,
            budget);
      }
    }
    if (!have_best || goal.better(current, best)) {
      best = std::move(current);
      have_best = true;
    }
  }
  return best;
}

// options.graph_search_work, refused below 0 naming `function`.
int64_t search_work(const char* function, const SolverOptions& options) {
  if (options.graph_search_work < 0) {
    throw std::invalid_argument(
        std::string("remat::planner::") + function +
        ": options.graph_search_work: expected >= 0, got " +
        std::to_string(options.graph_search_work));
  }
  return options.graph_search_work;
}

Candidate search(const Graph& graph, const Goal& goal, int64_t work) {
  if (combinations(graph) <= kMaxExhaustiveGraphPlans) {
    return search_exhaustive(graph, goal);
  }
  Candidate best = search_local(graph, goal, work);
  detail::search_windows(graph, goal, best, work);
  detail::search_exact(graph, goal, best, work);
  return best;
}

}  // namespace

Plan schedule_graph(const Graph& graph, const std::vector<StageMode>& modes) {
  if (static_cast<int64_t>(modes.size()) != graph.size()) {
    throw std::invalid_argument(
        "remat::planner::schedule_graph: expected one mode per stage (" +
        std::to_string(graph.size()) + "), got " +
        std::to_string(modes.size()));
  }
  for (int64_t i = 0; i < graph.size(); ++i) {
    if (modes[i] == StageMode::kSelective && !graph.stage(i).selective) {
      throw std::invalid_argument(
          "remat::planner::schedule_graph: stage " + std::to_string(i) +
          " is given kSelective but has no selective cost");
    }
  }
  return ScheduleBuilder(graph, modes).build();
}

Plan solve_store_all(const Graph& graph) {
  return schedule_graph(
      graph,
      std::vector<StageMode>(
          static_cast<size_t>(graph.size()), StageMode::kRecord));
}

std::optional<Plan> solve_optimal(
    const Graph& graph, int64_t budget_bytes, const SolverOptions& options) {
  const int64_t work = search_work("solve_optimal", options);
  if (graph.is_chain()) {
    return solve_optimal(graph.as_chain(), budget_bytes, options);
  }
  if (budget_bytes <= 0) {
    throw std::invalid_argument(
        "remat::planner::solve_optimal: expected budget_bytes > 0, got " +
        std::to_string(budget_bytes));
  }
  Plan store_all = solve_store_all(graph);
  if (simulate(graph, store_all).peak_bytes <= budget_bytes) {
    return store_all;
  }
  const Candidate best = search(graph, Goal{budget_bytes, false}, work);
  if (best.peak_bytes <= budget_bytes) {
    return schedule_graph(graph, best.modes);
  }
  // The search may miss a fitting plan that the least-memory search finds;
  // keep the promise "nullopt exactly below the minimum".
  const Candidate least = search(graph, Goal{0, true}, work);
  if (least.peak_bytes <= budget_bytes) {
    return schedule_graph(graph, least.modes);
  }
  return std::nullopt;
}

int64_t min_feasible_budget_bytes(
    const Graph& graph, const SolverOptions& options) {
  const int64_t work = search_work("min_feasible_budget_bytes", options);
  if (graph.is_chain()) {
    return min_feasible_budget_bytes(graph.as_chain());
  }
  return search(graph, Goal{0, true}, work).peak_bytes;
}

Plan solve_min_memory(const Graph& graph, const SolverOptions& options) {
  const int64_t work = search_work("solve_min_memory", options);
  if (graph.is_chain()) {
    return solve_min_memory(graph.as_chain());
  }
  return schedule_graph(graph, search(graph, Goal{0, true}, work).modes);
}

}  // namespace remat::planner
