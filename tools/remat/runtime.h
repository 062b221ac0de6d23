// runtime.h: running and measuring training steps of a planned model.
//
// An Executor runs a model's forward the way a PlanChoice says:
//   none        the plain Sequential
//   uniform:K   remat::checkpoint_sequential(model, K, x) in --mode
//   optimal, chen, sqrt
//               remat::PlannedSequential(model, plan) (its own executor;
//               --mode does not apply)
// A Trainer owns a model's optimizer and measures steps the bench-protocol
// way: parameter gradients are allocated (zeroed, not freed) before the
// MemoryMeter is reset right before forward; the activation peak is the
// meter's peak_delta_bytes over forward + loss + backward. The optimizer step
// runs after the measurement. Each step reseeds the global RNG with its own
// seed, so two trainers fed the same batches and seeds see the same dropout
// masks and (for deterministic CPU ops) produce bitwise equal losses.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <remat/checkpoint.h>
#include <remat/memory_meter.h>
#include <remat/planned_sequential.h>
#include <remat/planner.h>
#include <torch/torch.h>

#include "strategy.h"
#include "workload.h"

namespace remat::cli {

/// Parses --mode: "reentrant" or "nonreentrant". Throws
/// std::invalid_argument naming the value otherwise.
Mode parse_mode(const std::string& text);

/// A deep copy of `model` (parameters, buffers), for a baseline run.
torch::nn::Sequential clone_sequential(const torch::nn::Sequential& model);

/// Runs a model's forward according to a plan choice (see the top).
class Executor {
 public:
  Executor(torch::nn::Sequential model, const PlanChoice& choice, Mode mode);
  /// The model output for `input`, with checkpointing as planned.
  torch::Tensor forward(const torch::Tensor& input);
  /// "PlannedSequential", "checkpoint_sequential (4 segments, nonreentrant)"
  /// or "plain Sequential".
  std::string description() const;

 private:
  torch::nn::Sequential model_;
  StrategySpec strategy_;
  Mode mode_;
  std::shared_ptr<PlannedSequentialImpl> planned_;
};

/// Measurements of one training step.
struct StepResult {
  double loss = 0;
  double forward_ms = 0;   ///< forward + loss
  double backward_ms = 0;  ///< backward
  double step_ms() const {
    return forward_ms + backward_ms;
  }
  /// Activation peak of forward + backward (bench-protocol.md).
  int64_t activation_peak_bytes = 0;
};

/// A model with its executor and optimizer (AdamW).
class Trainer {
 public:
  Trainer(
      torch::nn::Sequential model,
      const PlanChoice& choice,
      Mode mode,
      double lr);
  /// Forward, loss, backward (measured), then the optimizer step when
  /// `update` is true. Reseeds the global RNG with `seed` first.
  StepResult step(
      const Workload& workload,
      const Batch& batch,
      uint64_t seed,
      bool update = true);
  const Executor& executor() const {
    return executor_;
  }

 private:
  torch::nn::Sequential model_;
  Executor executor_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  MemoryMeter meter_;
};

/// The measured activation peak of one no-checkpoint step of `model` on
/// `batch` (no optimizer step; gradients are left zeroed).
int64_t measure_store_all_peak(
    torch::nn::Sequential model,
    const Workload& workload,
    const Batch& batch,
    uint64_t seed);

/// The measured budget frame for a model: 100% is its measured
/// no-checkpoint activation peak; the offset maps measured bytes onto the
/// chain's simulated bytes (strategy.h).
BudgetFrame measured_frame(
    const planner::Chain& chain, int64_t measured_store_all_peak_bytes);

/// Median of `values` (upper median for even sizes); 0 when empty.
double median(std::vector<double> values);

}  // namespace remat::cli
