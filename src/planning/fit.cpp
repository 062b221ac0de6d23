// fit.cpp: fit_size and fit_batch, the largest size (batch, sequence
// length) that trains under a cap (remat/fit.h).
//
// NOTE: [Fitting a size]
// 1. Profile the chain at sizes n1 = probe_size and 2 n1 (SizeModel::kAffine,
//    fit_batch) or n1, 2 n1 and 4 n1 (kQuadratic). No size above max_size is
//    ever made or profiled (make_problem may not be able to: a model built
//    for max_size positions): where the largest of those is above it, the
//    sizes are spread over [n1, max_size] instead (n1, the midpoint,
//    max_size); where the range holds fewer sizes than the model needs, it
//    is profiled at every size in it, and the model through them (a
//    constant, a line) is exact wherever the search can look
//    (fit_profile_sizes). Every field of every stage (times, bytes, the
//    selective costs when profiled) is modelled as the polynomial through
//    those profiles (the line, the parabola), in Newton's form; bytes are
//    rounded up and clamped at their smallest legal value, times at 0. A
//    stage's selective costs are kept when every profile has them.
// 2. Per strategy, binary-search the largest n in [n1, max_size] that the
//    strategy fits under the cap on the modelled chain (none: the store-all
//    peak; checkpoint_sequential: the fastest solve_uniform(k) that fits;
//    optimal: solve_optimal at the cap).
// 3. Check at the answer: profile there and, if the real chain fits, run
//    one measured step under the plan. Every profile seen replaces the
//    model's one farthest from it (the model is least right far from its
//    profiles: a transient peak that moves from one op to another as the
//    size grows is a maximum of polynomials, not one), and the search runs
//    again between the largest size seen to fit and the smallest seen not
//    to (a measured step over the cap counts as not fitting; the next try
//    is then 90 % of it, at least one less). When the model puts the answer
//    at the largest size seen to fit, the next size is profiled too, so the
//    answer is the largest whose profile fits. A few rounds at most; what
//    is returned was seen to fit.
// 4. With max_time_ratio, the limit is decided on predicted times:
//    simulate()'s step time per unit of the plan (units_of_size: a sample, a
//    position, a pixel) on the chain profiled at that very size, against no
//    checkpointing's at its answer. A checkpointing strategy whose answer is
//    over the limit bisects, on checks, between no checkpointing's answer and
//    its own for the largest size within it. Each size is profiled once per fit
//    and the profile kept, so every strategy is judged on the same numbers
//    there; and the optimal strategy takes the fastest of its solver's plan and
//    the other strategy's plan (a chain's checkpoint_sequential, a graph's
//    per-block: in its class, but the solver's memory slots may miss it), so at
//    a size where that strategy fits within the limit, optimal does too: its
//    search starts from that strategy's answer, and its answer is never
//    smaller. (Deciding on measured steps instead made the answer follow the
//    noise of single medians.) Then every answer is confirmed by measurement:
//    kTimedSteps rounds after kWarmupSteps, each running no checkpointing at
//    its answer and every strategy at its own, interleaved (the order rotating
//    by round); a strategy's time per unit over no checkpointing's of the same
//    round gives the paired ratio FitAnswer::measured_time_ratio with its 95 %
//    interval, which the caller reads against the limit.
// fit_batch is fit_size over the batch with the affine model; the only
// thing of its own is the check that make_input(b) has batch b. A graph
// (GraphFitProblem) runs the same steps on planner::Graph (a chain is
// modelled and solved as its graph, planner::graph_of, with the chain
// solvers where a strategy is a chain's): its strategies are none, per-block
// (schedule_graph with every stage kCheckpoint) and optimal, its steps run
// by PlannedGraph.
#include "remat/fit.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <utility>

#include <c10/util/Exception.h>

#include "chain_model.h"
#include "graph_stages.h"
#include "model_state.h"
#include "plan_executor.h"
#include "remat/graph.h"
#include "remat/measure/runner.h"
#include "remat/measure/statistics.h"
#include "remat/measure/step.h"
#include "remat/planned_chain.h"
#include "remat/planner/simulate.h"
#include "remat/planner/solvers.h"

namespace remat {
namespace {

using detail::ChainModel;

constexpr int kMaxChecks = 12;  // profile-and-measure rounds per strategy
// With a time limit, a check's time is the median of kTimedSteps steps after
// kWarmupSteps (the measurement protocol's counts, remat::measure); the first
// step measures the peak.
constexpr int kWarmupSteps = measure::kDefaultWarmupRounds;
constexpr int kTimedSteps = measure::kDefaultTimedRounds;

/// What a strategy runs on a chain under the cap, if anything fits.
struct Choice {
  planner::Plan plan;
  int64_t segments = 0;
  int64_t peak_bytes = 0;
  double step_ms = 0;  ///< simulate()'s predicted step
};

/// The strategies of a kind of problem, in the order of the answers.
template <typename Problem>
struct Strategies;
template <>
struct Strategies<FitProblem> {
  static std::vector<std::string> names() {
    return {"none", "checkpoint_sequential", "optimal"};
  }
};
template <>
struct Strategies<GraphFitProblem> {
  static std::vector<std::string> names() {
    return {"none", "per-block", "optimal"};
  }
};

std::optional<Choice> choose(
    const std::string& strategy,
    const planner::Graph& graph,
    int64_t cap_bytes) {
  auto fits = [&](planner::Plan plan,
                  int64_t segments) -> std::optional<Choice> {
    const planner::Simulation simulation = planner::simulate(graph, plan);
    if (!simulation.valid || simulation.peak_bytes > cap_bytes) {
      return std::nullopt;
    }
    return Choice{
        std::move(plan), segments, simulation.peak_bytes, simulation.step_ms};
  };
  if (strategy == "none") {
    return fits(planner::solve_store_all(graph), 0);
  }
  if (strategy == "per-block") {
    return fits(
        planner::schedule_graph(
            graph,
            std::vector<planner::StageMode>(
                static_cast<size_t>(graph.size()),
                planner::StageMode::kCheckpoint)),
        0);
  }
  if (strategy == "checkpoint_sequential") {
    const planner::Chain chain = graph.as_chain();
    std::optional<Choice> best;
    for (int64_t k = 1; k <= chain.size(); ++k) {
      auto choice = fits(planner::solve_uniform(chain, k), k);
      if (choice && (!best || choice->step_ms < best->step_ms)) {
        best = std::move(choice);
      }
    }
    return best;
  }
  std::optional<planner::Plan> plan =
      graph.is_chain() ? planner::solve_optimal(graph.as_chain(), cap_bytes)
                       : planner::solve_optimal(graph, cap_bytes);
  std::optional<Choice> best = plan ? fits(std::move(*plan), 0) : std::nullopt;
  // The other strategy's plans are in the optimal plan's class; the
  // solver's memory slots may miss one that fits (NOTE: [Fitting a size], 4).
  // A chain's other strategy is checkpoint_sequential (a chain plan, which
  // PlannedChain runs), a graph's per-block.
  std::optional<Choice> other = choose(
      graph.is_chain() ? "checkpoint_sequential" : "per-block",
      graph,
      cap_bytes);
  if (other && (!best || other->step_ms < best->step_ms)) {
    other->segments = 0;
    best = std::move(other);
  }
  return best;
}

/// The largest size in [lo, hi] that `strategy` fits under the cap on the
/// model (binary search: fitting is monotone in the size); lo - 1 when none
/// does. A size whose modelled bytes are past any memory does not fit.
int64_t largest_on_model(
    const std::string& strategy,
    const ChainModel& model,
    int64_t lo,
    int64_t hi,
    int64_t cap_bytes) {
  auto fits = [&](int64_t size) {
    const std::optional<planner::Graph> graph = model.at(size);
    return graph && choose(strategy, *graph, cap_bytes).has_value();
  };
  if (!fits(lo)) {
    return lo - 1;
  }
  while (lo < hi) {  // invariant: fits(lo)
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

/// A chain profiled, as its graph.
planner::Graph profile_problem(
    const FitProblem& problem, const ProfileOptions& options) {
  return planner::graph_of(
      profile_chain(problem.stages, problem.input, options));
}

planner::Graph profile_problem(
    const GraphFitProblem& problem, const ProfileOptions& options) {
  return profile_graph(problem.stages, problem.input, options);
}

/// The problem's stages under `plan`.
PlannedChain planned(
    const FitProblem& problem,
    const planner::Plan& plan,
    const Policy& policy) {
  return PlannedChain(
      problem.stages, plan, PlannedChainOptions().selective_policy(policy));
}

PlannedGraph planned(
    const GraphFitProblem& problem,
    const planner::Plan& plan,
    const Policy& policy) {
  return PlannedGraph(
      problem.stages, plan, PlannedGraphOptions().selective_policy(policy));
}

/// The modules of the problem's stages.
std::vector<std::shared_ptr<torch::nn::Module>> modules_of_problem(
    const FitProblem& problem) {
  return detail::modules_of(problem.stages);
}

std::vector<std::shared_ptr<torch::nn::Module>> modules_of_problem(
    const GraphFitProblem& problem) {
  return detail::modules_of(detail::module_holders(problem.stages));
}

/// One training step of `net` on `problem`'s input, measured.
template <typename Problem, typename Net>
measure::StepMeasurement measured_step(
    const Problem& problem, Net& net, const FitSizeOptions& options) {
  const torch::Tensor& input = problem.input;
  return measure::measure_step(input.device(), [&] {
    // The output goes with the loss's backward, as in a training loop.
    const torch::Tensor output = net->forward(input);
    return options.loss() ? options.loss()(output)
                          : output.to(torch::kFloat).sum();
  });
}

/// One training step of `problem` under `plan`, its peak and time in the
/// measured fields of `answer`.
template <typename Problem>
void measure_step(
    const Problem& problem,
    const planner::Plan& plan,
    const FitSizeOptions& options,
    FitAnswer& answer) {
  auto net = planned(problem, plan, options.profile().selective_policy());
  detail::ModelStateGuard state(
      modules_of_problem(problem), problem.input.device());
  const measure::StepMeasurement measured =
      measured_step(problem, net, options);
  // The memory model counts the input.
  answer.measured_peak_bytes = measured.activation_peak_bytes() +
                               static_cast<int64_t>(problem.input.nbytes());
  answer.measured_step_ms = measured.step_ms();
}

/// How the entry point calling fit() names itself and its size options in
/// errors.
struct Names {
  const char* function;
  const char* probe;
  const char* max;
};

/// The units of work of `size` (FitSizeOptions::units_of_size), checked.
double units_of(const FitSizeOptions& options, int64_t size) {
  if (!options.units_of_size()) {
    return static_cast<double>(size);
  }
  const double units = options.units_of_size()(size);
  TORCH_CHECK(
      std::isfinite(units) && units > 0,
      "remat::fit_size: units_of_size(",
      size,
      ") must be a positive finite number, got ",
      units);
  return units;
}

/// fit()'s checks of its arguments.
template <typename Problem>
void check_arguments(
    const std::function<Problem(int64_t)>& make_problem,
    int64_t cap_bytes,
    const FitSizeOptions& options,
    const Names& names) {
  TORCH_CHECK(
      cap_bytes > 0,
      names.function,
      ": expected cap_bytes > 0, got ",
      cap_bytes);
  TORCH_CHECK(
      options.max_time_ratio() >= 0,
      names.function,
      ": expected max_time_ratio >= 0, got ",
      options.max_time_ratio());
  TORCH_CHECK(
      options.probe_size() >= 1,
      names.function,
      ": expected ",
      names.probe,
      " >= 1, got ",
      options.probe_size());
  // The search's bounds (max_size + 1) must not overflow.
  constexpr int64_t kMaxSize = int64_t{1} << 60;
  TORCH_CHECK(
      options.max_size() <= kMaxSize,
      names.function,
      ": expected ",
      names.max,
      " <= 2^60 (",
      kMaxSize,
      "), got ",
      options.max_size());
  TORCH_CHECK(
      options.max_size() >= options.probe_size(),
      names.function,
      ": expected ",
      names.max,
      " >= ",
      names.probe,
      " (",
      options.probe_size(),
      "), got ",
      options.max_size());
  TORCH_CHECK(
      static_cast<bool>(make_problem),
      names.function,
      ": expected a make_problem function, got none");
  units_of(options, options.probe_size());  // throws if not positive
  units_of(options, options.max_size());
}

/// What each stage reads: a chain's stages read the one before (nothing to
/// compare), a graph's their inputs.
std::vector<std::vector<int>> inputs_of(const FitProblem& /*problem*/) {
  return {};
}

std::vector<std::vector<int>> inputs_of(const GraphFitProblem& problem) {
  std::vector<std::vector<int>> inputs;
  inputs.reserve(problem.stages.size());
  for (const GraphStage& stage : problem.stages) {
    inputs.push_back(stage.inputs);
  }
  return inputs;
}

/// make_problem, its result checked.
template <typename Problem>
class Problems {
 public:
  Problems(
      const std::function<Problem(int64_t)>& make_problem, const Names& names)
      : make_problem_(make_problem), names_(names) {}

  /// The problem at `size`. Throws c10::Error if it has no stages or no
  /// input.
  Problem at(int64_t size) const {
    Problem problem = make_problem_(size);
    TORCH_CHECK(
        !problem.stages.empty() && problem.input.defined(),
        names_.function,
        ": make_problem(",
        size,
        ") must return stages and an input, got ",
        problem.stages.size(),
        " stages and ",
        problem.input.defined() ? "an" : "an undefined",
        " input");
    // Sizes share one model of the stages: their count may not change, nor
    // what each stage reads.
    if (!first_) {
      first_ = std::make_pair(size, problem.stages.size());
      first_inputs_ = inputs_of(problem);
    }
    TORCH_CHECK(
        problem.stages.size() == first_->second,
        names_.function,
        ": make_problem must return the same stages at every size, got ",
        first_->second,
        " stages at size ",
        first_->first,
        " and ",
        problem.stages.size(),
        " at size ",
        size);
    const std::vector<std::vector<int>> inputs = inputs_of(problem);
    for (size_t i = 0; i < inputs.size(); ++i) {
      TORCH_CHECK(
          inputs[i] == first_inputs_[i],
          names_.function,
          ": make_problem must return the same graph at every size, got "
          "stage ",
          i,
          " reading ",
          c10::IntArrayRef(std::vector<int64_t>(
              first_inputs_[i].begin(), first_inputs_[i].end())),
          " at size ",
          first_->first,
          " and ",
          c10::IntArrayRef(
              std::vector<int64_t>(inputs[i].begin(), inputs[i].end())),
          " at size ",
          size);
    }
    return problem;
  }

 private:
  const std::function<Problem(int64_t)>& make_problem_;
  Names names_;
  mutable std::optional<std::pair<int64_t, size_t>> first_;  // size, stages
  mutable std::vector<std::vector<int>> first_inputs_;  // (graphs) at first_
};

/// The sizes step 1 (NOTE: [Fitting a size]) profiles, all in [probe_size,
/// max_size]. REQUIRES: 1 <= probe_size <= max_size.
std::vector<int64_t> profile_sizes(const FitSizeOptions& options) {
  const int64_t n1 = options.probe_size();
  const int64_t max_size = options.max_size();
  const int64_t count = options.size_model() == SizeModel::kQuadratic ? 3 : 2;
  std::vector<int64_t> sizes;
  if (max_size - n1 < count - 1) {
    // Fewer sizes in the range than the model needs: every one of them.
    // (Counted from n1: size <= max_size would overflow at INT64_MAX.)
    for (int64_t k = 0; k <= max_size - n1; ++k) {
      sizes.push_back(n1 + k);
    }
  } else if (n1 <= (max_size >> (count - 1))) {
    // n1, 2 n1 [, 4 n1]: in the range (and no overflow).
    for (int64_t k = 0; k < count; ++k) {
      sizes.push_back(n1 << k);
    }
  } else {
    // Spread over [n1, max_size]: distinct, since max_size - n1 >= count - 1.
    const int64_t step = (max_size - n1) / (count - 1);
    for (int64_t k = 0; k + 1 < count; ++k) {
      sizes.push_back(n1 + k * step);
    }
    sizes.push_back(max_size);
  }
  return sizes;
}

/// Step 1 (NOTE: [Fitting a size]): the model through the chains profiled
/// at profile_sizes().
template <typename Problem>
ChainModel profiled_model(
    const Problems<Problem>& problems, const FitSizeOptions& options) {
  const std::vector<int64_t> sizes = profile_sizes(options);
  std::vector<planner::Graph> profiled;
  for (const int64_t size : sizes) {
    const Problem problem = problems.at(size);
    profiled.push_back(profile_problem(problem, options.profile()));
  }
  return ChainModel(sizes, std::move(profiled));
}

/// One check at a size: the chain profiled there and, if the strategy fits
/// it under the cap, its measured step; an answer if it stayed under.
struct Check {
  planner::Graph graph;
  std::optional<FitAnswer> answer;
  bool measured_over_cap = false;
};

/// Runs the checks of one fit (NOTE: [Fitting a size], 3 and 4).
template <typename Problem>
struct Checker {
  const Problems<Problem>& problems;
  const FitSizeOptions& options;
  int64_t cap_bytes = 0;
  /// The chain profiled at each size checked, profiled once per fit.
  mutable std::map<int64_t, planner::Graph> profiles;

  Check operator()(const std::string& strategy, int64_t size) const {
    const Problem problem = problems.at(size);
    auto profiled = profiles.find(size);
    if (profiled == profiles.end()) {
      profiled =
          profiles.emplace(size, profile_problem(problem, options.profile()))
              .first;
    }
    Check result{profiled->second, {}};
    if (std::optional<Choice> choice =
            choose(strategy, result.graph, cap_bytes)) {
      FitAnswer candidate;
      candidate.strategy = strategy;
      candidate.size = size;
      candidate.batch = problem.input.dim() >= 1 ? problem.input.size(0) : 1;
      candidate.segments = choice->segments;
      candidate.plan = choice->plan;
      candidate.predicted_peak_bytes = choice->peak_bytes;
      candidate.predicted_step_ms = choice->step_ms;
      measure_step(problem, choice->plan, options, candidate);
      result.measured_over_cap = candidate.measured_peak_bytes > cap_bytes;
      if (!result.measured_over_cap) {
        result.answer = std::move(candidate);
      }
    }
    return result;
  }
};

/// Steps 2 and 3 (NOTE: [Fitting a size]): the largest size in [n1,
/// max_size] that `strategy` was seen to fit under the cap, searched on the
/// model and checked; an answer of size 0 when none was. `known_fit` (0:
/// none) is checked first, a size where a strategy in this one's class was
/// seen to fit, so the answer is not below it where it fits here too.
template <typename Problem>
FitAnswer largest_under_cap(
    const std::string& strategy,
    const ChainModel& model,
    const Checker<Problem>& check,
    int64_t n1,
    int64_t max_size,
    int64_t known_fit = 0) {
  const int64_t cap_bytes = check.cap_bytes;
  FitAnswer answer;
  answer.strategy = strategy;
  // Sizes below `fitted` + 1 were seen to fit (answer holds the largest);
  // sizes from `failed` on were seen not to.
  ChainModel refined = model;
  int64_t fitted = n1 - 1;
  int64_t failed = max_size + 1;
  if (known_fit >= n1 && known_fit <= max_size) {
    Check result = check(strategy, known_fit);
    if (result.answer) {
      answer = std::move(*result.answer);
      fitted = known_fit;
      refined = refined.with(known_fit, result.graph);
    }
  }
  int64_t size = largest_on_model(
      strategy, refined, std::max(n1, fitted), max_size, cap_bytes);
  for (int round = 0; round < kMaxChecks; ++round) {
    if (size <= fitted) {
      // Nothing larger fits on the model: see that the next size does
      // not fit either, unless that is known.
      if (fitted + 1 >= failed) {
        break;
      }
      size = fitted + 1;
    }
    Check result = check(strategy, size);
    if (result.answer) {
      answer = std::move(*result.answer);
      fitted = size;
      refined = refined.with(size, result.graph);
      size = largest_on_model(strategy, refined, size, failed - 1, cap_bytes);
    } else if (result.measured_over_cap) {
      // The profile fits, the measured step does not, and the model
      // cannot tell why: step down.
      failed = size;
      size = std::max(fitted, std::min(size - 1, size - (size + 9) / 10));
    } else {
      // The model was wrong here: take this profile into it and search
      // again below.
      failed = size;
      refined = refined.with(size, result.graph);
      size = largest_on_model(
          strategy, refined, std::max(n1, fitted), size - 1, cap_bytes);
    }
  }
  return answer;
}

/// The predicted time per unit of size of an answer's plan (simulate() on
/// the chain profiled at its size).
double predicted_ms_per_unit(
    const FitSizeOptions& options, const FitAnswer& answer) {
  return answer.predicted_step_ms / units_of(options, answer.size);
}

/// Step 4 (NOTE: [Fitting a size]), for a strategy over the time limit at
/// the cap's answer `at_cap`: the largest size from no checkpointing's
/// answer (`reference_size`) up whose predicted time per unit is within
/// `limit_ms_per_unit`, by bisection (the time grows with the size as the
/// plan recomputes more under the same cap), tried first at `known_within`
/// (0: none), a size where a strategy in this one's class was within; an
/// answer of size 0 when no size is.
template <typename Problem>
FitAnswer largest_within_time(
    const std::string& strategy,
    const FitAnswer& at_cap,
    int64_t reference_size,
    int64_t known_within,
    double limit_ms_per_unit,
    const Checker<Problem>& check) {
  FitAnswer within;
  within.strategy = strategy;
  int64_t lo = std::min(reference_size, at_cap.size - 1);
  int64_t hi = at_cap.size - 1;
  auto try_size = [&](int64_t size) {
    Check result = check(strategy, size);
    if (result.answer && predicted_ms_per_unit(check.options, *result.answer) <=
                             limit_ms_per_unit) {
      within = std::move(*result.answer);
      return true;
    }
    return false;
  };
  if (known_within > lo && known_within <= hi && try_size(known_within)) {
    lo = known_within + 1;
  }
  while (lo <= hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (try_size(mid)) {
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  return within;
}

/// The confirmation of step 4 (NOTE: [Fitting a size]): `answers[0]` (no
/// checkpointing, which has a size: it is the reference) and every other
/// answer with a size, each at its own size
/// under its plan, in interleaved rounds; fills measured_step_ms (the median
/// of the timed rounds) and, for the others, measured_time_ratio.
template <typename Problem>
void confirm_times(
    const Problems<Problem>& problems,
    const FitSizeOptions& options,
    std::vector<FitAnswer>& answers) {
  std::vector<FitAnswer*> timed;
  for (FitAnswer& answer : answers) {
    if (answer.size > 0) {
      timed.push_back(&answer);
    }
  }
  std::vector<Problem> timed_problems;
  std::vector<std::shared_ptr<torch::nn::Module>> modules;
  for (const FitAnswer* answer : timed) {
    timed_problems.push_back(problems.at(answer->size));
    for (auto& module : modules_of_problem(timed_problems.back())) {
      if (std::find(modules.begin(), modules.end(), module) == modules.end()) {
        modules.push_back(std::move(module));
      }
    }
  }
  // One guard over every module: guards of the same modules made one after
  // another each save what the one before set (zeroed gradients), and the
  // last one restored would win.
  detail::ModelStateGuard guard(modules, timed_problems.front().input.device());
  const Policy& policy = options.profile().selective_policy();
  std::vector<decltype(planned(timed_problems.front(), {}, policy))> nets;
  for (size_t i = 0; i < timed.size(); ++i) {
    nets.push_back(planned(timed_problems[i], timed[i]->plan, policy));
  }
  // ms per unit of size, per timed round, per answer timed.
  std::vector<std::vector<double>> per_unit(timed.size());
  std::vector<std::vector<double>> step_ms(timed.size());
  for (int round = 0; round < kWarmupSteps + kTimedSteps; ++round) {
    for (size_t k = 0; k < timed.size(); ++k) {
      const size_t i = (k + static_cast<size_t>(round)) % timed.size();
      const double ms =
          measured_step(timed_problems[i], nets[i], options).step_ms();
      if (round >= kWarmupSteps) {
        step_ms[i].push_back(ms);
        per_unit[i].push_back(ms / units_of(options, timed[i]->size));
      }
    }
  }
  for (size_t i = 0; i < timed.size(); ++i) {
    timed[i]->measured_step_ms = measure::summarize(step_ms[i]).median;
    if (i > 0) {
      timed[i]->measured_time_ratio =
          measure::paired_ratio(per_unit[i], per_unit[0]);
    }
  }
}

/// fit_size under the names of its caller (NOTE: [Fitting a size]).
template <typename Problem>
std::vector<FitAnswer> fit(
    const std::function<Problem(int64_t)>& make_problem,
    int64_t cap_bytes,
    const FitSizeOptions& options,
    const Names& names) {
  check_arguments(make_problem, cap_bytes, options, names);
  const Problems<Problem> problems(make_problem, names);
  const ChainModel model = profiled_model(problems, options);
  const Checker<Problem> check{problems, options, cap_bytes, {}};
  const double limit = options.max_time_ratio();

  std::vector<FitAnswer> answers;
  answers.reserve(Strategies<Problem>::names().size());  // `reference` stays
  const FitAnswer* reference = nullptr;  // no checkpointing's, if it fits
  // The largest answer of a strategy in the optimal plan's class.
  int64_t contained_size = 0;
  for (const std::string& strategy : Strategies<Problem>::names()) {
    FitAnswer answer = largest_under_cap(
        strategy,
        model,
        check,
        options.probe_size(),
        options.max_size(),
        strategy == "optimal" ? contained_size : 0);
    if (strategy != "none" && limit > 0 && reference != nullptr &&
        answer.size > 0) {
      const double limit_ms_per_unit =
          limit * predicted_ms_per_unit(options, *reference);
      if (predicted_ms_per_unit(options, answer) > limit_ms_per_unit) {
        answer = largest_within_time(
            strategy,
            answer,
            reference->size,
            strategy == "optimal" ? contained_size : 0,
            limit_ms_per_unit,
            check);
      }
    }
    if (strategy != "none" && strategy != "optimal") {
      contained_size = std::max(contained_size, answer.size);
    }
    answers.push_back(std::move(answer));
    if (strategy == "none" && answers.back().size > 0) {
      reference = &answers.back();
    }
  }
  if (limit > 0 && reference != nullptr) {
    for (FitAnswer& answer : answers) {
      if (answer.size > 0) {
        answer.predicted_time_ratio =
            predicted_ms_per_unit(options, answer) /
            predicted_ms_per_unit(options, *reference);
      }
    }
    confirm_times(problems, options, answers);
  }
  return answers;
}

}  // namespace

std::vector<int64_t> fit_profile_sizes(const FitSizeOptions& options) {
  TORCH_CHECK(
      options.probe_size() >= 1,
      "remat::fit_profile_sizes: expected probe_size >= 1, got ",
      options.probe_size());
  TORCH_CHECK(
      options.max_size() >= options.probe_size(),
      "remat::fit_profile_sizes: expected max_size >= probe_size (",
      options.probe_size(),
      "), got ",
      options.max_size());
  return profile_sizes(options);
}

std::vector<FitAnswer> fit_batch(
    const std::function<torch::Tensor(int64_t)>& make_input,
    const std::vector<Stage>& stages,
    int64_t cap_bytes,
    const FitOptions& options) {
  // Checked at the first call, after fit()'s checks of the options.
  TORCH_CHECK(
      !stages.empty(), "remat::fit_batch: expected at least one stage, got 0");
  auto make_problem = [&](int64_t batch) {
    TORCH_CHECK(
        static_cast<bool>(make_input),
        "remat::fit_batch: expected a make_input function, got none");
    torch::Tensor input = make_input(batch);
    TORCH_CHECK(
        input.defined() && input.dim() >= 1 && input.size(0) == batch,
        "remat::fit_batch: make_input(",
        batch,
        ") must return a tensor whose first dimension is ",
        batch,
        ", got ",
        input.defined() ? input.sizes() : c10::IntArrayRef{});
    return FitProblem{stages, std::move(input)};
  };
  return fit<FitProblem>(
      make_problem,
      cap_bytes,
      FitSizeOptions()
          .probe_size(options.probe_batch())
          .max_size(options.max_batch())
          .size_model(SizeModel::kAffine)
          .profile(options.profile())
          .max_time_ratio(options.max_time_ratio())
          .loss(options.loss()),
      Names{"remat::fit_batch", "probe_batch", "max_batch"});
}

std::vector<FitAnswer> fit_size(
    const std::function<FitProblem(int64_t)>& make_problem,
    int64_t cap_bytes,
    const FitSizeOptions& options) {
  return fit(
      make_problem,
      cap_bytes,
      options,
      Names{"remat::fit_size", "probe_size", "max_size"});
}

std::vector<FitAnswer> fit_size(
    const std::function<GraphFitProblem(int64_t)>& make_problem,
    int64_t cap_bytes,
    const FitSizeOptions& options) {
  return fit(
      make_problem,
      cap_bytes,
      options,
      Names{"remat::fit_size", "probe_size", "max_size"});
}

}  // namespace remat
