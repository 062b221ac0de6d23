// runtime.h: running and measuring training steps of a planned model.
//
// An Executor runs a model's forward the way a PlanChoice says:
//   none        the plain Sequential
//   uniform:K   remat::checkpoint_sequential(model, K, x) in --mode; in
//               reentrant mode with K >= 2 an input that does not require
//               grad is replaced by a detached copy that does (a reentrant
//               checkpoint passes gradients only through such inputs; the
//               input gradient it then computes is counted in the peak).
//               Inputs that cannot require grad are refused beforehand
//               (check_trainable).
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

/// Refuses, before any work, a strategy that would not train every stage of
/// a `stages`-stage model fed inputs like `sample`: uniform:K with K >= 2
/// (checkpoint_sequential checkpoints the first K - 1 segments) in
/// Mode::kReentrant when the input is not floating point (int64 token ids).
/// A reentrant checkpoint passes gradients only through inputs that require
/// grad, so the parameters of every checkpointed segment would get none.
/// (A floating-point input is made to require grad by the Executor instead.)
/// Throws UnsupportedStrategyError naming the flags, the input and the fix.
///
/// Example:
///   check_trainable(parse_strategy("uniform:2"), Mode::kReentrant, 6,
///                   batch.inputs);  // throws for a GPT's token ids
void check_trainable(
    const StrategySpec& strategy,
    Mode mode,
    int64_t stages,
    const torch::Tensor& sample);

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

/// The measured activation peak of one step of `model` run as `choice`
/// says (no optimizer step; gradients are left zeroed).
int64_t measure_step_peak(
    torch::nn::Sequential model,
    const PlanChoice& choice,
    const Workload& workload,
    const Batch& batch,
    uint64_t seed);

/// The measurements that fix the budget frame of a model.
struct MeasuredReference {
  /// Activation peak of the plain Sequential (no checkpointing): 100%.
  int64_t no_checkpoint_peak_bytes = 0;
  /// Activation peak of PlannedSequential running the store-all plan.
  int64_t planned_store_all_peak_bytes = 0;
  /// 100% = no_checkpoint_peak_bytes; offset = simulated store-all peak
  /// minus planned_store_all_peak_bytes, so that a plan solved within
  /// (budget + offset) planner bytes measures within the budget when
  /// PlannedSequential runs it (its overhead over the cost model -- the loss,
  /// gradient accumulation -- is the same for every plan).
  BudgetFrame frame;
};

/// Measures one plain and one planned store-all step of `model` on `batch`.
MeasuredReference measure_reference(
    const planner::Chain& chain,
    torch::nn::Sequential model,
    const Workload& workload,
    const Batch& batch,
    uint64_t seed);

/// Median of `values` (upper median for even sizes); 0 when empty.
double median(std::vector<double> values);

}  // namespace remat::cli
