// fit.cpp: fit_size and fit_batch, the largest size (batch, sequence
// length) that trains under a cap (remat/fit.h).
//
// NOTE: [Fitting a size]
// 1. Profile the chain at sizes n1 = probe_size and 2 n1 (SizeModel::kAffine,
//    fit_batch) or n1, 2 n1 and 4 n1 (kQuadratic). Every field of every stage
//    (times, bytes, the selective costs when profiled) is modelled as the
//    polynomial through those profiles (the line, the parabola), in Newton's
//    form; bytes are rounded up and clamped at their smallest legal value,
//    times at 0. A stage's selective costs are kept when every profile has
//    them.
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
// 4. With max_time_ratio, every check also times kTimedSteps steps after
//    kWarmupSteps (their median is FitAnswer::measured_step_ms). No
//    checkpointing's time per unit at its answer is the reference. A
//    checkpointing strategy whose answer is over the limit bisects, on measured
//    checks, between no checkpointing's answer and its own for the largest size
//    within it. Times are measured, not modelled: the profile's stage times
//    extrapolate badly to large sizes (on a CPU the time per sample grows with
//    the batch once a step's working set leaves the caches), and a step's time
//    is not the sum of its stages' profiled times.
// fit_batch is fit_size over the batch with the affine model; the only
// thing of its own is the check that make_input(b) has batch b.
#include "remat/fit.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <utility>

#include <c10/util/Exception.h>

#include "model_state.h"
#include "plan_executor.h"
#include "remat/memory_meter.h"
#include "remat/planned_chain.h"
#include "remat/planner/simulate.h"
#include "remat/planner/solvers.h"
#include "remat/planner/statistics.h"

namespace remat {
namespace {

constexpr int kMaxChecks = 12;  // profile-and-measure rounds per strategy
// With a time limit, a check's time is the median of kTimedSteps steps after
// kWarmupSteps (the benchmarks' protocol); the first step measures the peak.
constexpr int kWarmupSteps = 3;
constexpr int kTimedSteps = 10;

/// The chains profiled at a few sizes, and the chain at any size on the
/// polynomial through them (degree: one less than the number of profiles).
class ChainModel {
 public:
  ChainModel(std::vector<int64_t> sizes, std::vector<planner::Chain> chains)
      : sizes_(std::move(sizes)), chains_(std::move(chains)) {
    TORCH_INTERNAL_ASSERT(
        (sizes_.size() == 2 || sizes_.size() == 3) &&
        sizes_.size() == chains_.size());
  }

  /// The model with `chain`, profiled at `size`, in place of the profile
  /// farthest from it (or of the one at that size).
  ChainModel with(int64_t size, const planner::Chain& chain) const {
    size_t farthest = 0;
    for (size_t k = 0; k < sizes_.size(); ++k) {
      if (sizes_[k] == size) {
        farthest = k;
        break;
      }
      if (std::abs(sizes_[k] - size) > std::abs(sizes_[farthest] - size)) {
        farthest = k;
      }
    }
    ChainModel result = *this;
    result.sizes_[farthest] = size;
    result.chains_[farthest] = chain;
    return result;
  }

  /// The modelled chain at `size`.
  planner::Chain at(int64_t size) const {
    auto time = [&](auto field) { return std::max(0.0, value(field, size)); };
    auto bytes = [&](auto field, int64_t floor) {
      return std::max<int64_t>(
          floor, static_cast<int64_t>(std::ceil(value(field, size))));
    };
    const int64_t input_bytes = bytes(
        [](const planner::Chain& c) {
          return static_cast<double>(c.input_bytes());
        },
        0);
    std::vector<planner::StageCost> stages;
    int64_t value_bytes = input_bytes;  // |x_i|: bounds backward_tmp below
    for (int64_t i = 0; i < chains_.front().size(); ++i) {
      auto field = [i](auto member) {
        return [i, member](const planner::Chain& c) {
          return static_cast<double>(member(c.stage(i)));
        };
      };
      planner::StageCost cost;
      cost.forward_ms =
          time(field([](const planner::StageCost& s) { return s.forward_ms; }));
      cost.backward_ms = time(
          field([](const planner::StageCost& s) { return s.backward_ms; }));
      cost.output_bytes = bytes(
          field([](const planner::StageCost& s) { return s.output_bytes; }), 0);
      cost.saved_bytes = bytes(
          field([](const planner::StageCost& s) { return s.saved_bytes; }), 0);
      cost.forward_tmp_bytes = bytes(
          field(
              [](const planner::StageCost& s) { return s.forward_tmp_bytes; }),
          0);
      cost.record_tmp_bytes = bytes(
          field(
              [](const planner::StageCost& s) { return s.record_transient(); }),
          0);
      cost.backward_tmp_bytes = bytes(
          field(
              [](const planner::StageCost& s) { return s.backward_tmp_bytes; }),
          -value_bytes);
      const bool selective = std::all_of(
          chains_.begin(), chains_.end(), [i](const planner::Chain& c) {
            return c.stage(i).selective.has_value();
          });
      if (selective) {
        auto part = [&field](auto member) {
          return field([member](const planner::StageCost& s) {
            return member(*s.selective);
          });
        };
        planner::SelectiveCost costs;
        costs.saved_bytes = bytes(
            part([](const planner::SelectiveCost& s) { return s.saved_bytes; }),
            0);
        costs.forward_tmp_bytes = bytes(
            part([](const planner::SelectiveCost& s) {
              return s.forward_tmp_bytes;
            }),
            0);
        costs.backward_tmp_bytes = bytes(
            part([](const planner::SelectiveCost& s) {
              return s.backward_tmp_bytes;
            }),
            -value_bytes);
        costs.recompute_ms = time(part(
            [](const planner::SelectiveCost& s) { return s.recompute_ms; }));
        cost.selective = costs;
      }
      value_bytes = cost.output_bytes;
      stages.push_back(cost);
    }
    return planner::Chain(std::move(stages), input_bytes);
  }

 private:
  /// `field` of the profiled chains, taken to `size` on the polynomial
  /// through them. Newton's form: f0 + (f1 - f0) (n - n0) / (n1 - n0)
  /// [+ (n - n0) (n - n1) f[n0, n1, n2]].
  template <typename Field>
  double value(const Field& field, int64_t size) const {
    auto at = [&](size_t k) { return field(chains_[k]); };
    auto n = [&](size_t k) { return static_cast<double>(sizes_[k]); };
    const double x = static_cast<double>(size);
    const double f0 = at(0), f1 = at(1);
    double result = f0 + (f1 - f0) * (x - n(0)) / (n(1) - n(0));
    if (sizes_.size() == 3) {
      const double slope01 = (f1 - f0) / (n(1) - n(0));
      const double slope12 = (at(2) - f1) / (n(2) - n(1));
      result += (x - n(0)) * (x - n(1)) * (slope12 - slope01) / (n(2) - n(0));
    }
    return result;
  }

  std::vector<int64_t> sizes_;
  std::vector<planner::Chain> chains_;
};

/// What a strategy runs on a chain under the cap, if anything fits.
struct Choice {
  planner::Plan plan;
  int64_t segments = 0;
  int64_t peak_bytes = 0;
  double time_ms = 0;
};

std::optional<Choice> choose(
    const std::string& strategy,
    const planner::Chain& chain,
    int64_t cap_bytes) {
  auto fits = [&](planner::Plan plan,
                  int64_t segments) -> std::optional<Choice> {
    const planner::Simulation simulation = planner::simulate(chain, plan);
    if (!simulation.valid || simulation.peak_bytes > cap_bytes) {
      return std::nullopt;
    }
    return Choice{
        std::move(plan), segments, simulation.peak_bytes, simulation.time_ms};
  };
  if (strategy == "none") {
    return fits(planner::solve_store_all(chain), 0);
  }
  if (strategy == "checkpoint_sequential") {
    std::optional<Choice> best;
    for (int64_t k = 1; k <= chain.size(); ++k) {
      auto choice = fits(planner::solve_uniform(chain, k), k);
      if (choice && (!best || choice->time_ms < best->time_ms)) {
        best = std::move(choice);
      }
    }
    return best;
  }
  std::optional<planner::Plan> plan = planner::solve_optimal(chain, cap_bytes);
  return plan ? fits(std::move(*plan), 0) : std::nullopt;
}

/// The largest size in [lo, hi] that `strategy` fits under the cap on the
/// model (binary search: fitting is monotone in the size); lo - 1 when none
/// does.
int64_t largest_on_model(
    const std::string& strategy,
    const ChainModel& model,
    int64_t lo,
    int64_t hi,
    int64_t cap_bytes) {
  auto fits = [&](int64_t size) {
    return choose(strategy, model.at(size), cap_bytes).has_value();
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

/// Training steps of `problem` under `plan`: the first measures the peak
/// and, unless `timed`, the time; if `timed`, the time is the median of
/// kTimedSteps after kWarmupSteps. Fills the measured fields of `answer`.
void measure_steps(
    const FitProblem& problem,
    const planner::Plan& plan,
    const FitSizeOptions& options,
    bool timed,
    FitAnswer& answer) {
  const torch::Tensor& input = problem.input;
  PlannedChain net(
      problem.stages,
      plan,
      PlannedChainOptions().selective_policy(
          options.profile().selective_policy()));
  detail::ModelStateGuard state(
      detail::modules_of(problem.stages), input.device());
  std::vector<double> times;
  const int steps = timed ? kWarmupSteps + kTimedSteps : 1;
  for (int step = 0; step < steps; ++step) {
    MemoryMeter meter(input.device());
    detail::synchronize(input.device());
    const auto start = std::chrono::steady_clock::now();
    torch::Tensor output = net->forward(input);
    torch::Tensor loss = options.loss() ? options.loss()(output)
                                        : output.to(torch::kFloat).sum();
    output = torch::Tensor();  // as a training loop: it goes with backward
    loss.backward();
    detail::synchronize(input.device());
    const double ms = detail::elapsed_ms(start);
    if (step == 0) {
      // The loss and its seed gradient are outside the chain; the input
      // inside.
      answer.measured_peak_bytes = meter.peak_delta_bytes() -
                                   2 * static_cast<int64_t>(loss.nbytes()) +
                                   static_cast<int64_t>(input.nbytes());
      answer.measured_step_ms = ms;
    }
    if (step >= kWarmupSteps) {
      times.push_back(ms);
    }
  }
  if (!times.empty()) {
    answer.measured_step_ms = planner::median(times);
  }
}

/// How the entry point calling fit() names itself and its size options in
/// errors.
struct Names {
  const char* function;
  const char* probe;
  const char* max;
};

/// fit_size under the names of its caller (NOTE: [Fitting a size]).
std::vector<FitAnswer> fit(
    const std::function<FitProblem(int64_t)>& make_problem,
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
  auto problem_at = [&](int64_t size) {
    FitProblem problem = make_problem(size);
    TORCH_CHECK(
        !problem.stages.empty() && problem.input.defined(),
        names.function,
        ": make_problem(",
        size,
        ") must return stages and an input, got ",
        problem.stages.size(),
        " stages and ",
        problem.input.defined() ? "an" : "an undefined",
        " input");
    return problem;
  };
  const int64_t n1 = options.probe_size();
  std::vector<int64_t> sizes{n1, 2 * n1};
  if (options.size_model() == SizeModel::kQuadratic) {
    sizes.push_back(4 * n1);
  }
  std::vector<planner::Chain> profiled;
  for (const int64_t size : sizes) {
    const FitProblem problem = problem_at(size);
    profiled.push_back(
        profile_chain(problem.stages, problem.input, options.profile()));
  }
  const ChainModel model(sizes, std::move(profiled));

  // With a time limit every check times its step (NOTE: [Fitting a size]).
  const bool timed = options.max_time_ratio() > 0;
  // One check at `size`: the chain profiled there and, if the strategy fits
  // it under the cap, its measured steps; an answer if they stayed under.
  struct Check {
    planner::Chain chain;
    std::optional<FitAnswer> answer;
    bool measured_over_cap = false;
  };
  auto check = [&](const std::string& strategy, int64_t size) {
    const FitProblem problem = problem_at(size);
    Check result{
        profile_chain(problem.stages, problem.input, options.profile()), {}};
    if (std::optional<Choice> choice =
            choose(strategy, result.chain, cap_bytes)) {
      FitAnswer candidate;
      candidate.strategy = strategy;
      candidate.size = size;
      candidate.batch = problem.input.dim() >= 1 ? problem.input.size(0) : 1;
      candidate.segments = choice->segments;
      candidate.plan = choice->plan;
      candidate.predicted_peak_bytes = choice->peak_bytes;
      candidate.predicted_step_ms = choice->time_ms;
      measure_steps(problem, choice->plan, options, timed, candidate);
      result.measured_over_cap = candidate.measured_peak_bytes > cap_bytes;
      if (!result.measured_over_cap) {
        result.answer = std::move(candidate);
      }
    }
    return result;
  };

  std::vector<FitAnswer> answers;
  double reference_ms_per_unit = 0;  // none's, measured at its answer
  int64_t reference_size = 0;
  for (const std::string strategy :
       {"none", "checkpoint_sequential", "optimal"}) {
    FitAnswer answer;
    answer.strategy = strategy;
    // Sizes below `fitted` + 1 were seen to fit (answer holds the largest);
    // sizes from `failed` on were seen not to.
    ChainModel refined = model;
    int64_t fitted = n1 - 1;
    int64_t failed = options.max_size() + 1;
    int64_t size =
        largest_on_model(strategy, refined, n1, options.max_size(), cap_bytes);
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
        refined = refined.with(size, result.chain);
        size = largest_on_model(strategy, refined, size, failed - 1, cap_bytes);
      } else if (result.measured_over_cap) {
        // The profile fits, the measured step does not, and the model
        // cannot tell why: step down.
        failed = size;
        size = std::max(fitted, std::min(size - 1, size * 9 / 10));
      } else {
        // The model was wrong here: take this profile into it and search
        // again below.
        failed = size;
        refined = refined.with(size, result.chain);
        size = largest_on_model(
            strategy, refined, std::max(n1, fitted), size - 1, cap_bytes);
      }
    }
    auto ms_per_unit = [](const FitAnswer& a) {
      return a.measured_step_ms / static_cast<double>(a.size);
    };
    if (strategy == "none") {
      if (answer.size > 0) {
        reference_ms_per_unit = ms_per_unit(answer);
        reference_size = answer.size;
      }
    } else if (
        timed && reference_size > 0 && answer.size > 0 &&
        ms_per_unit(answer) >
            options.max_time_ratio() * reference_ms_per_unit) {
      // Over the time limit at the cap's answer: the largest size from
      // no checkpointing's answer up that meets it, by bisection on
      // measured times (they grow with the size as the plan recomputes
      // more under the same cap).
      const double limit = options.max_time_ratio() * reference_ms_per_unit;
      FitAnswer within;
      within.strategy = strategy;
      int64_t lo = std::min(reference_size, answer.size - 1);
      int64_t hi = answer.size - 1;
      while (lo <= hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        Check result = check(strategy, mid);
        if (result.answer && ms_per_unit(*result.answer) <= limit) {
          within = std::move(*result.answer);
          lo = mid + 1;
        } else {
          hi = mid - 1;
        }
      }
      answer = std::move(within);
    }
    answers.push_back(std::move(answer));
  }
  return answers;
}

}  // namespace

std::vector<FitAnswer> fit_batch(
    const std::function<torch::Tensor(int64_t)>& make_input,
    const std::vector<Stage>& stages,
    int64_t cap_bytes,
    const FitOptions& options) {
  // Checked at the first call, after fit()'s checks of the options.
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
  return fit(
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

}  // namespace remat
