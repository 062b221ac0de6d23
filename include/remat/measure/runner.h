// remat/measure/runner.h — the interleaved runner and the gradient gate of
// remat's benchmarks and of `remat bench`.
//
// CONTRACT (stable; how every time and peak in docs/benchmarks.md is taken):
//  - A Workload is one model (its parameters receive the gradients), one
//    input and one loss. Configurations are ways to run the model's forward
//    (plain, checkpointed, planned, ...); the first one is the baseline.
//  - Parameter gradients are allocated (zeros) before anything is measured
//    and only zeroed between steps, so they never count as activations.
//  - One step: gradients zeroed, the input's gradient dropped, the RNG seeded
//    (the same seed for every configuration of a round, so dropout masks
//    agree), a MemoryMeter started, forward + loss timed, backward timed (on
//    CUDA the device is synchronized before each reading).
//    Activation peak = meter.peak_delta_bytes(): peak live bytes of the step
//    minus the live bytes just before forward.
//  - Gradient gate: first, one step of every configuration (seed `seed`),
//    each configuration's parameter gradients compared with the baseline's:
//    bitwise on CPU (any difference throws GradientMismatch, naming the
//    configuration, the parameter and the largest difference), within
//    `cuda_tolerance` on CUDA. The gate step is not timed.
//  - Rounds: `warmup` rounds discarded, then `rounds` timed rounds, each round
//    running every configuration once in order (A B C A B C ...; round r uses
//    seed `seed + 1 + r`). Each step's wall time and the process's CPU time
//    are kept per round, so that ratios are paired (statistics.h). Adaptive
//    mode (target_half_width > 0): after `rounds`, one more round at a time
//    until the interval of every configuration's step-time ratio is narrower
//    than +-target_half_width (relative), or `max_rounds` were run;
//    RunResult::converged says which. Then the baseline alone is re-run as
//    many rounds (baseline_rerun): if it moved by more than the spread, the
//    machine's speed changed during the run. The 1-minute load average is
//    read before the rounds and after the re-run (busy_machine_warning).
//  - peak_bytes is the largest activation peak over all of a configuration's
//    steps (gate, warm-up and timed).
//  - Requires remat::install_tracking_allocator() on CPU (Runner's
//    constructor calls it). Not supported: configurations that change the
//    parameters (no optimizer step is ever taken).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "remat/measure/statistics.h"

namespace remat::measure {

/// A forward of the workload's model: input -> output.
using ForwardFn = std::function<torch::Tensor(const torch::Tensor&)>;
/// A loss of the model's output: output -> scalar.
using LossFn = std::function<torch::Tensor(const torch::Tensor&)>;

/// One way to run the model.
struct Configuration {
  std::string name;   // "none", "per-block", "optimal@25%", ...
  ForwardFn forward;  // must compute the same function as the baseline's
};

/// What the configurations run on.
struct Workload {
  torch::nn::Module* model = nullptr;  // gradients gated; not owned
  torch::Tensor input;                 // on the run's device
  /// Default (empty): sum(output * w), w fixed random weights of the
  /// output's shape drawn once (seed `seed`): a real gradient of the
  /// output's size, as with any real loss.
  LossFn loss;
};

/// The protocol's untimed warm-up rounds before the timed ones (the
/// default of RunnerOptions::warmup; fit_size's timed checks run as many
/// warm-up steps).
inline constexpr int kDefaultWarmupRounds = 3;
/// The protocol's timed rounds (the default of RunnerOptions::rounds;
/// fit_size's timed checks run as many timed steps).
inline constexpr int kDefaultTimedRounds = 10;

/// How Runner::run measures. Defaults follow the protocol.
struct RunnerOptions {
  int warmup = kDefaultWarmupRounds;  // untimed rounds; Default: 3
  int rounds = kDefaultTimedRounds;   // timed rounds; Default: 10 (at least 1)
  uint64_t seed = 1000;  // RNG seed of the gate step; round r: seed + 1 + r
  /// Allowed max |difference| of gradients on CUDA (CPU: bitwise always).
  double cuda_tolerance = 1e-5;
  /// Adaptive mode: add rounds until every step-time ratio's interval has a
  /// relative half width at most this (0.03: +-3 %). Default: 0 (off).
  double target_half_width = 0;
  /// Adaptive mode: the most timed rounds. Default: 0 (no more than rounds).
  int max_rounds = 0;
  /// Progress lines ("round 3/10") to stderr. Default: false.
  bool verbose = false;
};

/// The measurements of one configuration.
struct Measurement {
  std::string name;
  std::vector<double> forward_ms;   // per timed round: forward + loss
  std::vector<double> backward_ms;  // per timed round
  std::vector<double> step_ms;      // per timed round: forward + backward
  std::vector<double> cpu_ms;       // per timed round: the process's CPU time
  int64_t peak_bytes = 0;           // activation peak (see the top)
  double max_grad_diff = 0;  // largest |gradient - baseline's| (gate step)

  Summary forward() const {
    return summarize(forward_ms);
  }
  Summary backward() const {
    return summarize(backward_ms);
  }
  Summary step() const {
    return summarize(step_ms);
  }
  Summary cpu() const {
    return summarize(cpu_ms);
  }
  /// This configuration's step time over the baseline's, round by round.
  RatioInterval step_ratio(const Measurement& baseline) const;
  /// The same for the process's CPU time.
  RatioInterval cpu_ratio(const Measurement& baseline) const;
};

/// Everything one Runner::run measured.
struct RunResult {
  std::vector<Measurement> configurations;  // [0] is the baseline
  Measurement baseline_rerun;  // the baseline alone after the rounds
  int rounds = 0;              // timed rounds run
  bool converged = true;       // adaptive mode: every interval met the target
  double load_before = -1;     // 1-minute load average before the rounds
  double load_after = -1;      // ... and after the re-run (-1: unknown)
  const Measurement& baseline() const {
    return configurations.front();
  }
};

/// Whether every configuration's step-time ratio interval is within
/// options.target_half_width (true when the target is 0).
bool intervals_within(const RunResult& result, const RunnerOptions& options);

/// A sentence saying the machine was not idle during `result`, run with
/// `threads` threads (load average >= 0.5 before, or >= threads + 0.5
/// after); nullopt when it was.
std::optional<std::string> busy_machine_warning(
    const RunResult& result, int threads);

/// Thrown by the gradient gate: a configuration computed other gradients.
class GradientMismatch : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Runs configurations of one workload interleaved (see the top).
///
/// Example:
///   Runner runner({&*model, input, {}}, RunnerOptions{});
///   RunResult result = runner.run({
///       {"none", [&](const torch::Tensor& x) { return model->forward(x); }},
///       {"sequential(4)", [&](const torch::Tensor& x) {
///          return remat::checkpoint_sequential(model, 4, x); }}});
///   RatioInterval ratio =
///       result.configurations[1].step_ratio(result.baseline());
///   // ratio.median, [ratio.low, ratio.high]; a difference if excludes_one()
class Runner {
 public:
  /// Throws std::invalid_argument if workload.model is null or the input
  /// undefined.
  Runner(Workload workload, RunnerOptions options = {});

  /// Gate, warm-up, timed rounds, baseline re-run. Throws
  /// std::invalid_argument if `configurations` is empty, GradientMismatch
  /// from the gate, and whatever a configuration throws.
  RunResult run(const std::vector<Configuration>& configurations);

  /// One measured step of `forward` with `seed` (the building block of run(),
  /// for scenarios that need single steps, e.g. a probe of the baseline's
  /// peak). Fills one entry of each time series and peak_bytes.
  Measurement step(const ForwardFn& forward, uint64_t seed);

 private:
  void step_into(const ForwardFn& forward, uint64_t seed, Measurement& into);
  std::vector<torch::Tensor> gradients() const;

  Workload workload_;
  RunnerOptions options_;
  torch::Tensor loss_weights_;
};

}  // namespace remat::measure
