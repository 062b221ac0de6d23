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
//    optimal: solve_optimal at the cap), and, with max_time_ratio, whose
//    predicted time per unit of size is at most that multiple of no
//    checkpointing's on its profile at its answer.
// 3. Check at the answer: profile there and, if the real chain fits (the
//    cap, and the time limit on that profile's times: the model's times
//    are least right at large sizes, where caches stop holding a step's
//    working set), run one measured step under the plan. Every profile seen
//    replaces the model's one farthest from it (the model is least right far
//    from its profiles: a transient peak that moves from one op to another as
//    the size grows is a maximum of polynomials, not one), and the search runs
//    again between the largest size seen to fit and the smallest seen not
//    to (a measured step over the cap counts as not fitting; the next try
//    is then 90 % of it, at least one less). When the model puts the answer
//    at the largest size seen to fit, the next size is profiled too, so the
//    answer is the largest whose profile fits (unless the time limit stops
//    it first). A few rounds at most; what is returned was seen to fit.
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

namespace remat {
namespace {

constexpr int kMaxChecks = 12;  // profile-and-measure rounds per strategy

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

/// What a strategy may cost: the cap, and at most `max_ms_per_unit`
/// predicted per unit of size (0: no limit).
struct Limits {
  int64_t cap_bytes = 0;
  double max_ms_per_unit = 0;
};

std::optional<Choice> choose(
    const std::string& strategy,
    const planner::Chain& chain,
    int64_t size,
    const Limits& limits) {
  const int64_t cap = limits.cap_bytes;
  auto fits = [&](planner::Plan plan,
                  int64_t segments) -> std::optional<Choice> {
    const planner::Simulation simulation = planner::simulate(chain, plan);
    if (!simulation.valid || simulation.peak_bytes > cap ||
        (limits.max_ms_per_unit > 0 &&
         simulation.time_ms >
             limits.max_ms_per_unit * static_cast<double>(size))) {
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
    double best_ms = std::numeric_limits<double>::infinity();
    for (int64_t k = 1; k <= chain.size(); ++k) {
      planner::Plan plan = planner::solve_uniform(chain, k);
      const double ms = planner::simulate(chain, plan).time_ms;
      if (ms < best_ms) {
        if (auto choice = fits(std::move(plan), k)) {
          best = std::move(choice);
          best_ms = ms;
        }
      }
    }
    return best;
  }
  std::optional<planner::Plan> plan = planner::solve_optimal(chain, cap);
  return plan ? fits(std::move(*plan), 0) : std::nullopt;
}

/// The largest size in [lo, hi] that `strategy` fits on the model; lo - 1
/// when none does. Fitting the cap is monotone in the size (binary search);
/// a time limit fails at small sizes too (fixed costs per step), so below
/// the cap's answer the size steps down geometrically to the first that
/// meets it, then a binary search finds the largest up to the last failure.
int64_t largest_on_model(
    const std::string& strategy,
    const ChainModel& model,
    int64_t lo,
    int64_t hi,
    const Limits& limits) {
  auto fits = [&](int64_t size, const Limits& with) {
    return choose(strategy, model.at(size), size, with).has_value();
  };
  const Limits cap_only{limits.cap_bytes, 0};
  auto largest = [&](int64_t low, int64_t high, const Limits& with) {
    while (low < high) {  // invariant: fits(low)
      const int64_t mid = low + (high - low + 1) / 2;
      if (fits(mid, with)) {
        low = mid;
      } else {
        high = mid - 1;
      }
    }
    return low;
  };
  if (!fits(lo, cap_only)) {
    return lo - 1;
  }
  const int64_t under_cap = largest(lo, hi, cap_only);
  if (limits.max_ms_per_unit <= 0 || fits(under_cap, limits)) {
    return under_cap;
  }
  int64_t failed = under_cap;
  for (int64_t size = under_cap * 19 / 20; size >= lo;
       size = std::min(size - 1, size * 19 / 20)) {
    if (fits(size, limits)) {
      return largest(size, failed - 1, limits);
    }
    failed = size;
  }
  return lo - 1;
}

/// One training step of `problem` under `plan`; fills the measured fields
/// of `answer`.
void measure_step(
    const FitProblem& problem,
    const planner::Plan& plan,
    const FitSizeOptions& options,
    FitAnswer& answer) {
  const torch::Tensor& input = problem.input;
  PlannedChain net(
      problem.stages,
      plan,
      PlannedChainOptions().selective_policy(
          options.profile().selective_policy()));
  detail::ModelStateGuard state(
      detail::modules_of(problem.stages), input.device());
  MemoryMeter meter(input.device());
  detail::synchronize(input.device());
  const auto start = std::chrono::steady_clock::now();
  torch::Tensor output = net->forward(input);
  torch::Tensor loss =
      options.loss() ? options.loss()(output) : output.to(torch::kFloat).sum();
  output =
      torch::Tensor();  // as a training loop: the output goes with backward
  loss.backward();
  detail::synchronize(input.device());
  answer.measured_step_ms = detail::elapsed_ms(start);
  // The loss and its seed gradient are outside the chain; the input inside.
  answer.measured_peak_bytes = meter.peak_delta_bytes() -
                               2 * static_cast<int64_t>(loss.nbytes()) +
                               static_cast<int64_t>(input.nbytes());
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

  std::vector<FitAnswer> answers;
  Limits limits{cap_bytes, 0};
  for (const std::string strategy :
       {"none", "checkpoint_sequential", "optimal"}) {
    FitAnswer answer;
    answer.strategy = strategy;
    // Sizes below `fitted` + 1 were seen to fit (answer holds the largest);
    // sizes from `failed` on were seen not to.
    ChainModel refined = model;
    std::optional<planner::Chain> answer_chain;  // the profile at the answer
    int64_t fitted = n1 - 1;
    int64_t failed = options.max_size() + 1;
    auto meets_time_limit = [&](int64_t at) {
      return limits.max_ms_per_unit <= 0 ||
             choose(
                 strategy,
                 refined.at(at),
                 at,
                 Limits{
                     std::numeric_limits<int64_t>::max(),
                     limits.max_ms_per_unit})
                 .has_value();
    };
    int64_t size =
        largest_on_model(strategy, refined, n1, options.max_size(), limits);
    for (int check = 0; check < kMaxChecks; ++check) {
      if (size <= fitted) {
        // Nothing larger fits on the model: see that the next size does
        // not fit either, unless that is known (or beyond the time limit).
        if (fitted + 1 >= failed || !meets_time_limit(fitted + 1)) {
          break;
        }
        size = fitted + 1;
      }
      const FitProblem problem = problem_at(size);
      const planner::Chain chain =
          profile_chain(problem.stages, problem.input, options.profile());
      // The profile checks the cap and the time limit: the model's times
      // are least right far from the probes, where the answers are.
      std::optional<Choice> choice = choose(strategy, chain, size, limits);
      if (choice) {
        FitAnswer candidate;
        candidate.strategy = strategy;
        candidate.size = size;
        candidate.batch = problem.input.dim() >= 1 ? problem.input.size(0) : 1;
        candidate.segments = choice->segments;
        candidate.plan = choice->plan;
        candidate.predicted_peak_bytes = choice->peak_bytes;
        candidate.predicted_step_ms = choice->time_ms;
        measure_step(problem, choice->plan, options, candidate);
        if (candidate.measured_peak_bytes <= cap_bytes) {
          answer = std::move(candidate);
          answer_chain = chain;
          fitted = size;
          refined = refined.with(size, chain);
          size = largest_on_model(strategy, refined, size, failed - 1, limits);
        } else {
          // Measured over the cap: not an answer, and the model cannot
          // tell why; step down.
          failed = size;
          size = std::max(fitted, std::min(size - 1, size * 9 / 10));
        }
        continue;
      }
      // The model was wrong here (over the cap or the time limit): take
      // this profile into it and search again below.
      failed = size;
      refined = refined.with(size, chain);
      size = largest_on_model(
          strategy, refined, std::max(n1, fitted), size - 1, limits);
    }
    if (strategy == "none" && answer.size > 0 && options.max_time_ratio() > 0) {
      // The reference of the checkpointing strategies' time limit: no
      // checkpointing's time per unit of size on its profile at its answer.
      const planner::Chain& at_answer = *answer_chain;
      limits.max_ms_per_unit =
          options.max_time_ratio() *
          planner::simulate(at_answer, planner::solve_store_all(at_answer))
              .time_ms /
          static_cast<double>(answer.size);
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
