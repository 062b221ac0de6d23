// remat/fit.h: the largest batch that trains under a memory cap, with no
// checkpointing, with the best checkpoint_sequential, and with the optimal
// plan.
//
// fit_batch() answers the question the other way round from auto_checkpoint:
// not "how little memory for this batch" but "how large a batch fits in this
// memory". It profiles the chain at two batch sizes and models every cost of
// every stage as affine in the batch (times and bytes of activations grow
// with it), searches the largest batch each strategy fits under the cap on
// that model, then checks the answer: the chain is profiled again at the
// answer (a prediction that no longer fits moves the answer down), and one
// training step at that size, run by PlannedChain under the plan, is measured
// (a measured peak over the cap moves it down again). So every answer
// returned was seen to fit, and its time per sample is a measured one.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <torch/arg.h>
#include <torch/types.h>

#include "remat/planner/plan.h"
#include "remat/profile.h"
#include "remat/stage.h"

namespace remat {

/// Options of fit_batch().
struct FitOptions {
  /// The smaller of the two profiled batches (the other is twice it), and
  /// the smallest batch considered. Default: 4.
  TORCH_ARG(int64_t, probe_batch) = 4;
  /// The largest batch considered. Default: 4096.
  TORCH_ARG(int64_t, max_batch) = 4096;
  /// How each stage is profiled. Default: one warm-up run, one timed run.
  TORCH_ARG(ProfileOptions, profile) = ProfileOptions().warmup(1).repeats(1);
  /// The largest predicted time per sample a checkpointing strategy may
  /// take, as a multiple of no checkpointing's at its own answer (e.g. 1.3:
  /// at most 30 % slower per sample), both predicted on the affine model. 0: no
  /// limit, the largest batch that fits whatever it costs. Without a fitting
  /// no-checkpointing answer there is no reference and no limit. Default: 0.
  TORCH_ARG(double, max_time_ratio) = 0;
  /// The loss of the measured step, from the chain output. Default: the sum
  /// of the output (in fp32).
  TORCH_ARG(std::function<torch::Tensor(const torch::Tensor&)>, loss) = {};
};

/// The largest batch one strategy trains under the cap.
struct FitAnswer {
  std::string strategy;  ///< "none", "checkpoint_sequential", "optimal"
  int64_t batch = 0;     ///< 0: not even probe_batch fits
  int64_t segments = 0;  ///< checkpoint_sequential: its segment count
  planner::Plan plan;    ///< the plan at that batch
  int64_t predicted_peak_bytes = 0;  ///< simulate() on the chain profiled there
  double predicted_step_ms = 0;      ///< simulate()'s time there
  int64_t measured_peak_bytes = 0;   ///< the measured step's activation peak
                                     ///< plus the input's bytes
  double measured_step_ms = 0;       ///< the measured step's time
  /// Measured time per sample: measured_step_ms / batch (0 if batch is 0).
  double ms_per_sample() const {
    return batch > 0 ? measured_step_ms / static_cast<double>(batch) : 0;
  }
};

/// For each strategy (no checkpointing, the fastest checkpoint_sequential(k)
/// that fits, the optimal plan), the largest batch in [probe_batch,
/// max_batch] whose training step stays under `cap_bytes` (activations plus
/// the input, the planner's units), measured. `make_input(b)` makes an input
/// of batch size b (the same kind of input every time; random values are
/// fine). Answers come in that order; each was verified by a measured step.
///
/// Example:
// clang-format off
///   auto answers = remat::fit_batch(
///       [](int64_t b) { return torch::randn({b, 512}); }, stages, 256LL << 20);
///   for (const auto& a : answers) std::cout << a.strategy << ": " << a.batch << "\n";
// clang-format on
///
/// Throws c10::Error if cap_bytes <= 0, max_time_ratio < 0, probe_batch < 1,
/// max_batch < probe_batch, `make_input` is empty or makes an input whose first
/// dimension is not the batch asked for, and as profile_chain.
std::vector<FitAnswer> fit_batch(
    const std::function<torch::Tensor(int64_t)>& make_input,
    const std::vector<Stage>& stages,
    int64_t cap_bytes,
    const FitOptions& options = {});

}  // namespace remat
