// fit.cpp: fit_batch, the largest batch that trains under a cap
// (remat/fit.h).
//
// NOTE: [Fitting a batch]
// 1. Profile the chain at batch b1 = probe_batch and b2 = 2 b1. Every field
//    of every stage (times, bytes) is modelled as affine in b through the
//    two profiles; bytes are clamped at their smallest legal value.
// 2. Per strategy, binary-search the largest b in [b1, max_batch] that the
//    strategy fits under the cap on the modelled chain (none: the store-all
//    peak; checkpoint_sequential: the fastest solve_uniform(k) that fits;
//    optimal: solve_optimal at the cap), and, with max_time_ratio, whose
//    predicted time per sample is at most that multiple of no
//    checkpointing's at its answer (both predicted on the model).
// 3. Check at the answer: profile there; if the real chain no longer fits,
//    step down (to 90 %, at least by one) and check again; then run one
//    measured step under the plan; over the cap, step down again. A few
//    rounds at most; what is returned was seen to fit.
#include "remat/fit.h"

#include <algorithm>
#include <chrono>
#include <cmath>
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

/// `a` at b1 and `b` at b2, taken to `batch` on the line through them.
double along(double a, double b, int64_t b1, int64_t b2, int64_t batch) {
  return a + (b - a) * static_cast<double>(batch - b1) /
                 static_cast<double>(b2 - b1);
}

int64_t along_bytes(
    int64_t a,
    int64_t b,
    int64_t b1,
    int64_t b2,
    int64_t batch,
    int64_t floor) {
  const double value =
      along(static_cast<double>(a), static_cast<double>(b), b1, b2, batch);
  return std::max<int64_t>(floor, static_cast<int64_t>(std::ceil(value)));
}

/// The chain at `batch` on the affine model through (b1, c1) and (b2, c2).
planner::Chain modelled_chain(
    const planner::Chain& c1,
    int64_t b1,
    const planner::Chain& c2,
    int64_t b2,
    int64_t batch) {
  std::vector<planner::StageCost> stages;
  int64_t input_bytes =
      along_bytes(c1.input_bytes(), c2.input_bytes(), b1, b2, batch, 0);
  int64_t value_bytes = input_bytes;  // |x_i|: bounds backward_tmp below
  for (int64_t i = 0; i < c1.size(); ++i) {
    const planner::StageCost& x = c1.stage(i);
    const planner::StageCost& y = c2.stage(i);
    planner::StageCost cost;
    cost.forward_ms =
        std::max(0.0, along(x.forward_ms, y.forward_ms, b1, b2, batch));
    cost.backward_ms =
        std::max(0.0, along(x.backward_ms, y.backward_ms, b1, b2, batch));
    cost.output_bytes =
        along_bytes(x.output_bytes, y.output_bytes, b1, b2, batch, 0);
    cost.saved_bytes =
        along_bytes(x.saved_bytes, y.saved_bytes, b1, b2, batch, 0);
    cost.forward_tmp_bytes =
        along_bytes(x.forward_tmp_bytes, y.forward_tmp_bytes, b1, b2, batch, 0);
    cost.record_tmp_bytes = along_bytes(
        x.record_transient(), y.record_transient(), b1, b2, batch, 0);
    cost.backward_tmp_bytes = along_bytes(
        x.backward_tmp_bytes,
        y.backward_tmp_bytes,
        b1,
        b2,
        batch,
        -value_bytes);
    value_bytes = cost.output_bytes;
    stages.push_back(cost);
  }
  return planner::Chain(std::move(stages), input_bytes);
}

/// What a strategy runs on a chain under the cap, if anything fits.
struct Choice {
  planner::Plan plan;
  int64_t segments = 0;
  int64_t peak_bytes = 0;
  double time_ms = 0;
};

/// What a strategy may cost: the cap, and at most `max_ms_per_sample`
/// predicted per sample (0: no limit).
struct Limits {
  int64_t cap_bytes = 0;
  double max_ms_per_sample = 0;
};

std::optional<Choice> choose(
    const std::string& strategy,
    const planner::Chain& chain,
    int64_t batch,
    const Limits& limits) {
  const int64_t cap = limits.cap_bytes;
  auto fits = [&](planner::Plan plan,
                  int64_t segments) -> std::optional<Choice> {
    const planner::Simulation simulation = planner::simulate(chain, plan);
    if (!simulation.valid || simulation.peak_bytes > cap ||
        (limits.max_ms_per_sample > 0 &&
         simulation.time_ms >
             limits.max_ms_per_sample * static_cast<double>(batch))) {
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

/// The largest batch in [lo, hi] that `strategy` fits on the model; lo - 1
/// when none does. Fitting the cap is monotone in the batch (binary search);
/// a time limit fails at small batches too (fixed costs per step), so below
/// the cap's answer the batch steps down geometrically to the first that
/// meets it, then a binary search finds the largest up to the last failure.
int64_t largest_on_model(
    const std::string& strategy,
    const planner::Chain& c1,
    int64_t b1,
    const planner::Chain& c2,
    int64_t b2,
    int64_t lo,
    int64_t hi,
    const Limits& limits) {
  auto fits = [&](int64_t batch, const Limits& with) {
    return choose(strategy, modelled_chain(c1, b1, c2, b2, batch), batch, with)
        .has_value();
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
  if (limits.max_ms_per_sample <= 0 || fits(under_cap, limits)) {
    return under_cap;
  }
  int64_t failed = under_cap;
  for (int64_t batch = under_cap * 19 / 20; batch >= lo;
       batch = std::min(batch - 1, batch * 19 / 20)) {
    if (fits(batch, limits)) {
      return largest(batch, failed - 1, limits);
    }
    failed = batch;
  }
  return lo - 1;
}

/// One training step of `stages` under `plan` on `input`; fills the
/// measured fields of `answer`.
void measure_step(
    const std::vector<Stage>& stages,
    const planner::Plan& plan,
    const torch::Tensor& input,
    const FitOptions& options,
    FitAnswer& answer) {
  PlannedChain net(stages, plan);
  detail::ModelStateGuard state(detail::modules_of(stages), input.device());
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

}  // namespace

std::vector<FitAnswer> fit_batch(
    const std::function<torch::Tensor(int64_t)>& make_input,
    const std::vector<Stage>& stages,
    int64_t cap_bytes,
    const FitOptions& options) {
  TORCH_CHECK(
      cap_bytes > 0,
      "remat::fit_batch: expected cap_bytes > 0, got ",
      cap_bytes);
  TORCH_CHECK(
      options.max_time_ratio() >= 0,
      "remat::fit_batch: expected max_time_ratio >= 0, got ",
      options.max_time_ratio());
  TORCH_CHECK(
      options.probe_batch() >= 1,
      "remat::fit_batch: expected probe_batch >= 1, got ",
      options.probe_batch());
  TORCH_CHECK(
      options.max_batch() >= options.probe_batch(),
      "remat::fit_batch: expected max_batch >= probe_batch (",
      options.probe_batch(),
      "), got ",
      options.max_batch());
  TORCH_CHECK(
      static_cast<bool>(make_input),
      "remat::fit_batch: expected a make_input function, got none");
  auto input_of = [&](int64_t batch) {
    torch::Tensor input = make_input(batch);
    TORCH_CHECK(
        input.defined() && input.dim() >= 1 && input.size(0) == batch,
        "remat::fit_batch: make_input(",
        batch,
        ") must return a tensor whose first dimension is ",
        batch,
        ", got ",
        input.defined() ? input.sizes() : c10::IntArrayRef{});
    return input;
  };
  auto profile_at = [&](int64_t batch) {
    return profile_chain(stages, input_of(batch), options.profile());
  };
  const int64_t b1 = options.probe_batch();
  const int64_t b2 = 2 * b1;
  const planner::Chain c1 = profile_at(b1);
  const planner::Chain c2 = profile_at(b2);

  std::vector<FitAnswer> answers;
  Limits limits{cap_bytes, 0};
  for (const std::string strategy :
       {"none", "checkpoint_sequential", "optimal"}) {
    FitAnswer answer;
    answer.strategy = strategy;
    int64_t batch = largest_on_model(
        strategy, c1, b1, c2, b2, b1, options.max_batch(), limits);
    for (int check = 0; check < kMaxChecks && batch >= b1; ++check) {
      const torch::Tensor input = input_of(batch);
      const planner::Chain chain =
          profile_chain(stages, input, options.profile());
      // The time limit was applied on the model (the reference is a
      // prediction on it too); the real profile checks the cap.
      std::optional<Choice> choice =
          choose(strategy, chain, batch, Limits{cap_bytes, 0});
      if (choice) {
        answer.batch = batch;
        answer.segments = choice->segments;
        answer.plan = choice->plan;
        answer.predicted_peak_bytes = choice->peak_bytes;
        answer.predicted_step_ms = choice->time_ms;
        measure_step(stages, choice->plan, input, options, answer);
        if (answer.measured_peak_bytes <= cap_bytes) {
          break;
        }
        answer = FitAnswer();  // measured over the cap: not an answer
        answer.strategy = strategy;
      }
      batch = std::min(batch - 1, batch * 9 / 10);
    }
    if (strategy == "none" && answer.batch > 0 &&
        options.max_time_ratio() > 0) {
      // The reference of the checkpointing strategies' time limit: no
      // checkpointing's predicted time per sample at its answer, on the
      // same model, so that profiling noise cannot tip the comparison.
      const planner::Chain at_answer =
          modelled_chain(c1, b1, c2, b2, answer.batch);
      limits.max_ms_per_sample =
          options.max_time_ratio() *
          planner::simulate(at_answer, planner::solve_store_all(at_answer))
              .time_ms /
          static_cast<double>(answer.batch);
    }
    answers.push_back(std::move(answer));
  }
  return answers;
}

}  // namespace remat
