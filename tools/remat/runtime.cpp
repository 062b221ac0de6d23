// runtime.cpp: executors, measured training steps (see runtime.h).
#include "runtime.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <vector>

#include <remat/measure/step.h>

#include "cli_error.h"

namespace remat::cli {
namespace {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(
    const OptimizerChoice& choice, std::vector<torch::Tensor> parameters) {
  if (choice.name == "sgd") {
    return std::make_unique<torch::optim::SGD>(
        std::move(parameters), torch::optim::SGDOptions(choice.lr));
  }
  if (choice.name == "adamw") {
    return std::make_unique<torch::optim::AdamW>(
        std::move(parameters), torch::optim::AdamWOptions(choice.lr));
  }
  throw UsageError(
      "--optimizer: expected adamw or sgd, got '" + choice.name + "'");
}

/// Segments checkpoint_sequential runs for `strategy` on `stages` stages.
int64_t uniform_segments(const planner::Strategy& strategy, int64_t stages) {
  return std::min<int64_t>(strategy.segments, stages);
}

/// Whether reentrant checkpoint_sequential needs an input that requires grad
/// (it checkpoints at least one segment; see check_trainable).
bool reentrant_needs_input_grad(
    const planner::Strategy& strategy, Mode mode, int64_t stages) {
  return strategy.kind == planner::Strategy::Kind::kUniform &&
         mode == Mode::kReentrant && uniform_segments(strategy, stages) >= 2;
}

}  // namespace

Mode parse_mode(const std::string& text) {
  if (text == "nonreentrant") {
    return Mode::kNonReentrant;
  }
  if (text == "reentrant") {
    return Mode::kReentrant;
  }
  throw std::invalid_argument(
      "expected reentrant or nonreentrant; got '" + text + "'");
}

void check_trainable(
    const planner::Strategy& strategy,
    Mode mode,
    int64_t stages,
    const torch::Tensor& sample) {
  if (strategy.kind == planner::Strategy::Kind::kUniform &&
      strategy.segments > stages) {
    throw UsageError(
        strategy.to_string() +
        " asks for more segments than the model has "
        "stages (" +
        std::to_string(stages) +
        ", its loss included): use uniform:K with K <= " +
        std::to_string(stages));
  }
  if (!reentrant_needs_input_grad(strategy, mode, stages) ||
      sample.requires_grad() || sample.is_floating_point() ||
      sample.is_complex()) {
    return;
  }
  const int64_t checkpointed = uniform_segments(strategy, stages) - 1;
  std::ostringstream message;
  message << "--strategy " << strategy.to_string()
          << " --mode reentrant cannot train this model: its input ("
          << c10::toString(sample.scalar_type()) << " " << sample.sizes()
          << ", e.g. token ids) is not floating point, so it cannot require "
             "grad, and a reentrant checkpoint passes gradients only through "
             "inputs that require grad: the parameters of the "
          << checkpointed << " checkpointed segment"
          << (checkpointed == 1 ? "" : "s")
          << " would get no gradients; use --mode nonreentrant (the default)";
  throw UnsupportedStrategyError(message.str());
}

torch::nn::Sequential clone_sequential(const torch::nn::Sequential& model) {
  auto copy =
      std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone());
  TORCH_INTERNAL_ASSERT(copy, "Sequential::clone returned another type");
  return torch::nn::Sequential(copy);
}

namespace {

/// The budget a self-correcting plan of `choice` re-solves: the choice's,
/// or, without one, the plan's predicted peak (the options' default).
std::optional<Budget> correction_budget(const PlanChoice& choice) {
  if (!choice.budget_bytes) {
    return std::nullopt;
  }
  return Budget::bytes(*choice.budget_bytes);
}

/// The self-correction of `plan` (the plan in force) on `profiled`, with
/// `corrections` and `measured` (a chain's or a graph's), as a report.
template <class Costs>
CorrectionReport report_of(
    const Costs& profiled,
    const planner::Plan& plan,
    const std::vector<BasicPlanCorrection<Costs>>& corrections,
    const std::optional<Costs>& measured) {
  CorrectionReport report;
  report.profiled = profiled.stages();
  report.plan = plan;
  report.plan_profiled_ms = planner::simulate(profiled, plan).time_ms;
  if (measured) {
    report.measured = measured->stages();
    report.plan_measured_ms = planner::simulate(*measured, plan).time_ms;
  }
  for (const auto& correction : corrections) {
    report.switches.push_back(
        {correction.after_steps,
         correction.from,
         correction.to,
         correction.from_ms,
         correction.to_ms,
         planner::simulate(correction.measured, correction.to).peak_bytes});
  }
  return report;
}

}  // namespace

Executor::Executor(
    torch::nn::Sequential model,
    const PlanChoice& choice,
    Mode mode,
    const std::optional<SelfCorrection>& correction)
    : model_(std::move(model)), strategy_(choice.strategy), mode_(mode) {
  switch (strategy_.kind) {
    case planner::Strategy::Kind::kOptimal:
    case planner::Strategy::Kind::kChen:
    case planner::Strategy::Kind::kSqrt: {
      PlannedSequentialOptions options;
      options.selective_policy(choice.selective_policy);
      if (correction && correction->chain &&
          strategy_.kind == planner::Strategy::Kind::kOptimal) {
        options.chain(correction->chain)
            .solver(correction->solver)
            .budget(correction_budget(choice))
            .self_correct(true)
            .correction_steps(correction->correction_steps)
            .correction_threshold(correction->correction_threshold);
        self_correcting_ = true;
      }
      planned_ = PlannedSequential(model_, choice.plan, options).ptr();
      break;
    }
    case planner::Strategy::Kind::kUniform:
    case planner::Strategy::Kind::kNone:
      break;
  }
}

Executor::Executor(
    TrainingGraph graph,
    const PlanChoice& choice,
    bool plain,
    const std::optional<SelfCorrection>& correction)
    : graph_(std::move(graph)), strategy_(choice.strategy) {
  TORCH_INTERNAL_ASSERT(
      !plain || strategy_.kind == planner::Strategy::Kind::kNone,
      "a plain graph run is no checkpointing");
  if (!plain) {
    PlannedGraphOptions options;
    if (correction && correction->graph &&
        strategy_.kind == planner::Strategy::Kind::kOptimal) {
      options.graph(correction->graph)
          .solver(correction->solver)
          .budget(correction_budget(choice))
          .self_correct(true)
          .correction_steps(correction->correction_steps)
          .correction_threshold(correction->correction_threshold);
      self_correcting_ = true;
    }
    planned_graph_ = PlannedGraph(graph_->stages, choice.plan, options).ptr();
  }
}

std::optional<CorrectionReport> Executor::correction_report() const {
  if (!self_correcting_) {
    return std::nullopt;
  }
  if (planned_graph_) {
    return report_of(
        *planned_graph_->graph(),
        planned_graph_->plan(),
        planned_graph_->corrections(),
        planned_graph_->measured_graph());
  }
  return report_of(
      *planned_->chain(),
      planned_->plan(),
      planned_->corrections(),
      planned_->measured_chain());
}

torch::Tensor Executor::forward(const torch::Tensor& input) {
  if (planned_graph_) {
    return planned_graph_->forward(input);
  }
  if (graph_) {
    return run_graph(graph_->stages, input);
  }
  if (planned_) {
    return planned_->forward(input);
  }
  if (strategy_.kind == planner::Strategy::Kind::kUniform) {
    const auto stages = static_cast<int64_t>(model_->size());
    torch::Tensor x = input;
    if (reentrant_needs_input_grad(strategy_, mode_, stages) &&
        !input.requires_grad()) {
      TORCH_CHECK(
          input.is_floating_point() || input.is_complex(),
          "remat: reentrant checkpoint_sequential needs an input that can "
          "require grad, got ",
          input.scalar_type(),
          " (check_trainable should have refused this)");
      x = input.detach().requires_grad_(true);
    }
    return checkpoint_sequential(
        model_,
        uniform_segments(strategy_, stages),
        x,
        CheckpointOptions().mode(mode_));
  }
  return model_->forward(input);
}

torch::Tensor Executor::predict(const torch::Tensor& input) {
  if (graph_) {
    std::vector<GraphStage> model(
        graph_->stages.begin(), graph_->stages.end() - 1);  // not the loss
    return run_graph(model, input);
  }
  torch::Tensor output = input;
  for (auto stage = model_->begin(); stage + 1 != model_->end(); ++stage) {
    output = stage->forward(output);  // not the loss
  }
  return output;
}

std::string Executor::description() const {
  if (planned_graph_) {
    return "remat::PlannedGraph";
  }
  if (graph_) {
    return "remat::run_graph (the stages run plainly)";
  }
  if (planned_) {
    return "remat::PlannedSequential";
  }
  if (strategy_.kind == planner::Strategy::Kind::kUniform) {
    const int64_t segments = std::min<int64_t>(
        strategy_.segments, static_cast<int64_t>(model_->size()));
    const bool input_grad = reentrant_needs_input_grad(
        strategy_, mode_, static_cast<int64_t>(model_->size()));
    return "remat::checkpoint_sequential (" + std::to_string(segments) +
           " segments, " +
           (mode_ == Mode::kReentrant ? "reentrant" : "nonreentrant") +
           (input_grad ? "; the input is made to require grad" : "") + ")";
  }
  return "plain torch::nn::Sequential";
}

Trainer::Trainer(
    torch::nn::Sequential model,
    const PlanChoice& choice,
    Mode mode,
    const OptimizerChoice& optimizer,
    std::optional<CompressOptions> compress,
    Precision precision,
    const std::optional<SelfCorrection>& correction
#if REMAT_WITH_DISTRIBUTED
    ,
    std::optional<distributed::ProcessGroup> group,
    bool shard
#endif
    )
    : module_(model.ptr()),
      set_targets_([model](const Batch& batch) { set_targets(model, batch); }),
      compress_(compress),
      precision_(precision)
#if REMAT_WITH_DISTRIBUTED
      ,
      group_(std::move(group))
#endif
{
#if REMAT_WITH_DISTRIBUTED
  TORCH_CHECK(!shard || group_, "remat: sharded training needs a group");
  if (shard) {
    sharded_ =
        std::make_unique<distributed::ShardedStages>(stages_of(model), *group_);
    executor_ = std::make_unique<Executor>(
        sharded_->sequential(), choice, mode, correction);
    optimizer_ = make_optimizer(optimizer, sharded_->shards());
    return;
  }
#endif
  executor_ = std::make_unique<Executor>(model, choice, mode, correction);
  optimizer_ = make_optimizer(optimizer, model->parameters());
#if REMAT_WITH_DISTRIBUTED
  if (group_) {
    sync_ = std::make_unique<distributed::GradientSync>(
        model->parameters(), *group_);
  }
#endif
}

Trainer::Trainer(
    TrainingGraph graph,
    const PlanChoice& choice,
    bool plain,
    const OptimizerChoice& optimizer,
    Precision precision,
    const std::optional<SelfCorrection>& correction)
    : module_(graph.unet.ptr()),
      set_targets_([graph](const Batch& batch) { set_targets(graph, batch); }),
      precision_(precision) {
  optimizer_ = make_optimizer(optimizer, module_->parameters());
  executor_ =
      std::make_unique<Executor>(std::move(graph), choice, plain, correction);
}

torch::Tensor Trainer::predict(const torch::Tensor& input) {
  torch::NoGradGuard no_grad;
  module_->eval();
  torch::Tensor output = executor_->predict(input);
  module_->train();
  return output;
}

void Trainer::with_full_parameters(const std::function<void()>& use) {
#if REMAT_WITH_DISTRIBUTED
  if (sharded_) {
    sharded_->with_full_parameters(use);
    return;
  }
#endif
  use();
}

int64_t held_bytes(const std::vector<torch::Tensor>& tensors) {
  std::vector<const void*> seen;
  int64_t bytes = 0;
  const auto count = [&](const torch::Tensor& tensor) {
    if (!tensor.defined() || !tensor.has_storage()) {
      return;
    }
    const void* storage = tensor.storage().unsafeGetStorageImpl();
    if (std::find(seen.begin(), seen.end(), storage) == seen.end()) {
      seen.push_back(storage);
      bytes += static_cast<int64_t>(tensor.storage().nbytes());
    }
  };
  for (const torch::Tensor& tensor : tensors) {
    count(tensor);
    count(tensor.grad());
  }
  return bytes;
}

StepResult Trainer::step(const Batch& batch, uint64_t seed, bool update) {
  module_->train();
  std::vector<torch::Tensor> held = module_->parameters();
#if REMAT_WITH_DISTRIBUTED
  if (sharded_) {
    measure::zero_gradients(sharded_->shards());
    const std::vector<torch::Tensor> shards = sharded_->shards();
    held.insert(held.end(), shards.begin(), shards.end());
  } else {
    measure::zero_gradients(held);
  }
#else
  measure::zero_gradients(held);
#endif
  torch::manual_seed(seed);
  StepResult result;
  const std::vector<torch::Tensor> buffers = module_->buffers();
  held.insert(held.end(), buffers.begin(), buffers.end());
  result.parameter_state_bytes = held_bytes(held);
  result.optimizer_state_bytes = optimizer_state_bytes_;
  // The model ends in the loss (workload.h). Its targets are set before
  // the meter starts: replacing them frees the previous batch's, which are
  // not the step's activations.
  set_targets_(batch);
  {
    AutocastGuard autocast(c10::kCPU, precision_);
    std::optional<DynamicRemat> scope;
    if (dynamic_) {
      scope.emplace(*dynamic_);
    }
    const measure::StepMeasurement measured = measure::measure_step(
        batch.inputs.device(),
        [&] {
          std::optional<CompressActivations> compressed;
          if (compress_) {
            compressed.emplace(*compress_);
          }
          return executor_->forward(batch.inputs);
        },
        [&] {
#if REMAT_WITH_DISTRIBUTED
          if (sync_) {
            sync_->finish();
          }
          if (sharded_) {
            sharded_->finish();
          }
#endif
        });
    result.forward_ms = measured.forward_ms;
    result.backward_ms = measured.backward_ms;
    result.activation_peak_bytes = measured.activation_peak_bytes();
    result.loss = measured.loss.item<double>();
    if (scope) {
      result.dynamic = scope->stats();
    }
  }
#if REMAT_WITH_DISTRIBUTED
  if (group_) {
    torch::Tensor losses = torch::tensor({result.loss}, torch::kDouble);
    group_->allreduce_sum(losses).wait();
    result.loss =
        losses.item<double>() / static_cast<double>(group_->world_size());
  }
#endif
  if (update) {
    const int64_t before = meter_.current_bytes();
    optimizer_->step();
    optimizer_state_bytes_ += meter_.current_bytes() - before;
  }
  result.optimizer_state_after_bytes = optimizer_state_bytes_;
  return result;
}

void Trainer::run_dynamic(DynamicRematOptions options) {
  TORCH_CHECK(
      precision_ == Precision::kFloat32 && !compress_,
      "remat::cli::Trainer::run_dynamic: expected fp32 and no compression "
      "(a DynamicRemat scope refuses autocast and other saved-tensor hooks)");
#if REMAT_WITH_DISTRIBUTED
  TORCH_CHECK(
      !group_, "remat::cli::Trainer::run_dynamic: expected no process group");
#endif
  dynamic_ = options;
}

planner::ModelState measure_model_state(
    const torch::nn::Sequential& model, const OptimizerChoice& optimizer) {
  MemoryMeter meter;
  planner::ModelState state;
  const int64_t start = meter.current_bytes();
  const torch::nn::Sequential copy = clone_sequential(model);
  state.parameter_bytes = meter.current_bytes() - start;
  std::vector<torch::Tensor> parameters = copy->parameters();
  measure::zero_gradients(parameters);
  state.gradient_bytes = meter.current_bytes() - start - state.parameter_bytes;
  const std::unique_ptr<torch::optim::Optimizer> updates =
      make_optimizer(optimizer, parameters);
  const int64_t before_update = meter.current_bytes();
  updates->step();
  state.optimizer_bytes = meter.current_bytes() - before_update;
  return state;
}

std::optional<CompressOptions> parse_compress(const std::string& text) {
  if (text == "none") {
    return std::nullopt;
  }
  if (text == "bf16") {
    return CompressOptions().type(CompressedType::kBFloat16);
  }
  if (text == "fp16") {
    return CompressOptions().type(CompressedType::kFloat16);
  }
  if (text == "int8") {
    return CompressOptions().type(CompressedType::kInt8);
  }
  throw UsageError(
      "--compress: expected none, bf16, fp16 or int8, got '" + text + "'");
}

}  // namespace remat::cli
