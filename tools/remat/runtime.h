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
// and a graph model's (a TrainingGraph, workload.h):
//   none        remat::run_graph: the stages run plainly
//   optimal, per-block, encoder
//               remat::PlannedGraph(stages, plan)
// Given the chain or graph the plan was made on (SelfCorrection), an optimal
// plan corrects itself (PlannedChainOptions::self_correct,
// PlannedGraphOptions::self_correct) within choice.budget_bytes (or, without
// one, the plan's predicted peak); every other strategy runs its plan as
// given.
// A Trainer owns a model's optimizer and measures each step with
// remat::measure::measure_step (remat/measure/step.h): parameter gradients
// are allocated (zeroed, not freed) before the step; the activation peak is
// the step's, less the loss value and its seed gradient. Forward, loss and
// backward run in the trainer's precision (an AutocastGuard for the CPU,
// whose cast cache is off: a parameter's bf16 copy is a saved tensor like
// any other); the loss is the chain's last stage (workload.h).
// The optimizer step runs after the measurement, outside autocast. In a
// process group, a GradientSync averages the gradients over the ranks during
// backward; its finish() is part of the measured backward, and the loss
// reported is the mean of the ranks' losses (the global batch's). Each step
// reseeds the global RNG with its own seed, so two trainers fed the same
// batches and seeds see the same dropout masks and (for deterministic CPU ops)
// produce bitwise equal losses.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <remat/checkpoint.h>
#include <remat/compress.h>
#include <remat/config.h>
#include <remat/dynamic.h>
#include <remat/graph.h>
#if REMAT_WITH_DISTRIBUTED
#include <remat/distributed.h>
#endif
#include <remat/memory_meter.h>
#include <remat/planned_sequential.h>
#include <remat/planner.h>
#include <remat/precision.h>
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
/// Throws UnsupportedStrategyError naming the flags, the input and the fix;
/// UsageError for uniform:K with K > stages (the library would run
/// uniform:stages under the name the user gave).
///
/// Example:
// clang-format off
///   check_trainable(planner::Strategy::parse("uniform:2"), Mode::kReentrant, 6,
///                   batch.inputs);  // throws for a GPT's token ids
// clang-format on
void check_trainable(
    const planner::Strategy& strategy,
    Mode mode,
    int64_t stages,
    const torch::Tensor& sample);

/// A deep copy of `model` (parameters, buffers), for a baseline run.
torch::nn::Sequential clone_sequential(const torch::nn::Sequential& model);

/// Self-correction of an executor's optimal plan (see the top): the costs
/// the plan was made on (`chain` for a chain model, `graph` for a graph
/// model) and the library options' window and threshold.
struct SelfCorrection {
  std::optional<planner::Chain> chain;
  std::optional<planner::Graph> graph;
  /// How re-plans are solved: the options of the plan they replace.
  planner::SolverOptions solver;
  int64_t correction_steps = PlannedChainOptions().correction_steps();
  double correction_threshold = PlannedChainOptions().correction_threshold();
};

/// What a self-correcting executor has measured and switched (the library's
/// corrections() and measured chain or graph, for either kind of model).
struct CorrectionReport {
  /// The stage costs the plan was made on.
  std::vector<planner::StageCost> profiled;
  /// The last measured window's stage costs (empty before the first).
  std::vector<planner::StageCost> measured;
  /// The plan in force and its predicted time (simulate()) on the profiled
  /// costs and, after the first window, on the measured ones (else 0).
  planner::Plan plan;
  double plan_profiled_ms = 0;
  double plan_measured_ms = 0;
  /// One switch (PlanCorrection / GraphPlanCorrection), with the predicted
  /// peak of the plan switched to.
  struct Switch {
    int64_t after_steps = 0;
    planner::Plan from;
    planner::Plan to;
    double from_ms = 0;
    double to_ms = 0;
    int64_t to_peak_bytes = 0;
  };
  std::vector<Switch> switches;
};

/// Runs a model's forward according to a plan choice (see the top).
class Executor {
 public:
  /// With `correction` (its chain set), an optimal plan corrects itself.
  Executor(
      torch::nn::Sequential model,
      const PlanChoice& choice,
      Mode mode,
      const std::optional<SelfCorrection>& correction = std::nullopt);
  /// A graph model's executor: `choice.plan` by PlannedGraph, or, for a
  /// choice of Strategy::Kind::kNone with `plain`, the stages run plainly.
  /// With `correction` (its graph set), an optimal plan corrects itself.
  Executor(
      TrainingGraph graph,
      const PlanChoice& choice,
      bool plain,
      const std::optional<SelfCorrection>& correction = std::nullopt);
  /// The model output for `input`, with checkpointing as planned.
  torch::Tensor forward(const torch::Tensor& input);
  /// "PlannedSequential", "checkpoint_sequential (4 segments, nonreentrant)",
  /// "plain Sequential", "PlannedGraph" or "run_graph (plain)".
  std::string description() const;
  /// The model's output (without the loss) for `input`, run plainly: what a
  /// score (the Dice of a segmentation) is computed from.
  torch::Tensor predict(const torch::Tensor& input);
  /// Whether the plan corrects itself.
  bool self_correcting() const {
    return self_correcting_;
  }
  /// Self-correction's measurements and switches so far (nullopt unless
  /// self_correcting()).
  std::optional<CorrectionReport> correction_report() const;

 private:
  torch::nn::Sequential model_{nullptr};
  std::optional<TrainingGraph> graph_;
  planner::Strategy strategy_;
  Mode mode_ = Mode::kNonReentrant;
  std::shared_ptr<PlannedSequentialImpl> planned_;
  std::shared_ptr<PlannedGraphImpl> planned_graph_;
  bool self_correcting_ = false;
};

/// Measurements of one training step.
struct StepResult {
  double loss = 0;
  double forward_ms = 0;   ///< forward + loss
  double backward_ms = 0;  ///< backward
  double step_ms() const {
    return forward_ms + backward_ms;
  }
  /// Activation peak of forward + backward (see the top of this header).
  int64_t activation_peak_bytes = 0;
  /// Bytes of parameter memory held through the step, measured before the
  /// forward: the storages of the parameters, buffers and gradients (of the
  /// shards and their gradients when sharded; the modules' own parameters
  /// then hold none).
  int64_t parameter_state_bytes = 0;
  /// Bytes the optimizer's state held through the step: what its earlier
  /// updates left allocated (measured around each update; 0 at the first
  /// step, whose update creates AdamW's moments).
  int64_t optimizer_state_bytes = 0;
  /// Bytes the optimizer's state holds after this step's update (measured
  /// like optimizer_state_bytes; equal to it without an update).
  int64_t optimizer_state_after_bytes = 0;
  /// The step's model state and activations together:
  /// parameter_state_bytes + optimizer_state_bytes + activation_peak_bytes.
  int64_t model_and_activation_bytes() const {
    return parameter_state_bytes + optimizer_state_bytes +
           activation_peak_bytes;
  }
  /// A dynamic trainer's (Trainer::run_dynamic) scope counters for the
  /// step's forward and backward; nullopt otherwise.
  std::optional<DynamicRematStats> dynamic;
};

/// The optimizer a Trainer steps with.
struct OptimizerChoice {
  /// "adamw" (torch::optim::AdamW, its default betas, eps and weight decay)
  /// or "sgd" (plain SGD: no momentum, no weight decay; exact comparisons
  /// between runs, where AdamW's division by the gradient's magnitude
  /// amplifies rounding).
  std::string name = "adamw";
  double lr = 3e-3;
  /// Bytes of optimizer state per byte of trainable parameters
  /// (ProfileOptions::optimizer_state_ratio): 2 for adamw (two moments), 0
  /// for sgd.
  double state_ratio() const {
    return name == "adamw" ? 2 : 0;
  }
};

/// A model with its executor and optimizer.
class Trainer {
 public:
  /// With `compress`, the forward runs under a CompressActivations guard.
  /// Forward, loss and backward run under an AutocastGuard for the CPU in
  /// `precision` (its default options: no cast cache). The executor is
  /// Executor(model, choice, mode, correction). With `group` (only
  /// when remat was built with remat::distributed), the
  /// gradients are averaged over its ranks (distributed::GradientSync), or,
  /// with `shard`, the model is sharded over them (distributed::
  /// ShardedStages: the executor runs its stages, AdamW updates its shards).
  /// REQUIRES: `group` if `shard`.
  Trainer(
      torch::nn::Sequential model,
      const PlanChoice& choice,
      Mode mode,
      const OptimizerChoice& optimizer,
      std::optional<CompressOptions> compress = std::nullopt,
      Precision precision = Precision::kFloat32,
      const std::optional<SelfCorrection>& correction = std::nullopt
#if REMAT_WITH_DISTRIBUTED
      ,
      std::optional<distributed::ProcessGroup> group = std::nullopt,
      bool shard = false
#endif
  );
  /// A graph model's trainer: `graph` run by Executor(graph, choice, plain,
  /// correction), stepped by `optimizer`, in `precision`. No compression,
  /// no group.
  Trainer(
      TrainingGraph graph,
      const PlanChoice& choice,
      bool plain,
      const OptimizerChoice& optimizer,
      Precision precision = Precision::kFloat32,
      const std::optional<SelfCorrection>& correction = std::nullopt);
  /// Forward through the training model (its last stage is the loss, with
  /// `batch`'s targets: workload.h), backward (measured), then the
  /// optimizer step when `update` is true. Reseeds the global RNG with
  /// `seed` first. REQUIRES: the model is a Workload::training_model() or
  /// training_graph().
  StepResult step(const Batch& batch, uint64_t seed, bool update = true);
  /// The model's output for `input` in evaluation mode, without grad
  /// (Executor::predict); the model is back in training mode at the next
  /// step.
  torch::Tensor predict(const torch::Tensor& input);
  const Executor& executor() const {
    return *executor_;
  }
  /// Runs the forward and backward of every following step inside a
  /// DynamicRemat scope of `options` (with a plan of Strategy none, the
  /// model itself runs plainly: the scope alone decides what is kept);
  /// StepResult::dynamic then reports the scope's counters.
  /// REQUIRES: the Trainer's precision is fp32, it compresses nothing and
  /// has no group (the scope refuses autocast and other saved-tensor hooks).
  void run_dynamic(DynamicRematOptions options);
  /// Runs `use` with the model's full parameters in its modules (gathered
  /// from the shards when sharded: a collective, every rank must call it).
  void with_full_parameters(const std::function<void()>& use);

 private:
  /// The module owning every parameter and buffer trained (the Sequential,
  /// or the U-Net of a graph).
  std::shared_ptr<torch::nn::Module> module_;
  /// Sets a batch's targets on the model's LossHead.
  std::function<void(const Batch&)> set_targets_;
#if REMAT_WITH_DISTRIBUTED
  std::unique_ptr<distributed::ShardedStages> sharded_;
#endif
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::optional<CompressOptions> compress_;
  std::optional<DynamicRematOptions> dynamic_;
  Precision precision_;
#if REMAT_WITH_DISTRIBUTED
  std::optional<distributed::ProcessGroup> group_;
  std::unique_ptr<distributed::GradientSync> sync_;
#endif
  MemoryMeter meter_;
  /// Bytes the optimizer's updates have left allocated (its state).
  int64_t optimizer_state_bytes_ = 0;
};

/// Bytes of the distinct storages of `tensors` and of their gradients.
int64_t held_bytes(const std::vector<torch::Tensor>& tensors);

/// The model state of training `model` with `optimizer`, measured on a copy
/// of it (live bytes, MemoryMeter): parameter_bytes, its parameters and
/// buffers; gradient_bytes, its gradients allocated as zeros; optimizer_bytes,
/// what one update on those gradients leaves allocated (AdamW's moments).
/// What a profile's model state (ProfileOptions::optimizer_state_ratio)
/// predicts, seen.
planner::ModelState measure_model_state(
    const torch::nn::Sequential& model, const OptimizerChoice& optimizer);

/// The --compress flag: nullopt for "none", else the stored type of
/// "bf16", "fp16" or "int8". Throws UsageError naming the text otherwise.
std::optional<CompressOptions> parse_compress(const std::string& text);

}  // namespace remat::cli
