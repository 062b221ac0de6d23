// profile.cpp: profile_chain(), the measured cost model of a Sequential.
//
// For each child i, on x_i (the sample run through children 0..i-1 under
// no-grad), `warmup + repeats` rounds of:
//   1. a forward under no-grad (timed): output_bytes is the output's size,
//      forward_tmp_bytes its transient peak above output_bytes (what
//      kForwardNoSave and kForwardCheckpoint cost);
//   2. a recorded forward on a leaf aliasing x_i (grad on): saved_bytes is
//      the live bytes after it minus before it (output referenced, input
//      already live), record_tmp_bytes its transient peak above saved_bytes
//      (what kForwardRecord costs). The two transients differ when recording
//      changes what a forward allocates: a dropout's no-grad forward frees
//      its mask before returning, a recorded one keeps it in saved_bytes;
//   3. a backward of that record with a gradient of the output's size
//      (timed), run by detail::run_stage_backward as the executor runs it
//      (output and gradient freed as soon as autograd is done with them):
//      backward_tmp_bytes is its peak above before + |g_i| (the gradient of
//      x_i, whose size the model takes as x_i's). It is negative when the
//      backward frees more than it allocates before g_i exists (a dropout
//      stage); never below -|g_i|, since the peak is never below before;
//   4. with a selective policy, 2. and 3. again with the stage run as the
//      executor runs kForwardSelective (detail::record_stage under the
//      policy): its backward recomputes what the policy did not keep.
// Byte fields are the maximum over the rounds (they are exact and normally
// equal in every round); times are medians of the timed rounds.
// Recorded forwards and backwards run exactly as the executor runs them (NOTE:
// [Plan execution] in plan_executor.cpp), so that simulate() predicts the
// executor's peak. The leaf of stage 0 requires grad only if the sample does,
// as in the executor. Parameter gradients are preallocated (zeros) during
// profiling, as in a training step after the first one, so their accumulation
// costs only the transient it really costs; the caller's gradients, module
// buffers and RNG state are restored at the end (RAII, also on error).
//
// On a CPU, the chain's (graph's) cold_write_ms_per_mib is measured last
// (cold_write_ms_per_mib() below): a step writes its whole working set into
// memory that the rest of the step has pushed out of the caches, while the
// no-grad forwards timed above write into buffers they just freed.
#include "remat/profile.h"

#include "remat/planner/statistics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_set>
#include <vector>

#include <ATen/Context.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/nn/modules/container/any.h>

#include "checkpoint/recompute_context.h"
#include "graph_stages.h"
#include "model_state.h"
#include "plan_executor.h"
#include "remat/graph.h"
#include "remat/measure/timer.h"
#include "remat/memory_meter.h"
#include "self_correct.h"

namespace remat {
namespace {

/// cold_write_ms_per_mib on the working set of `stages` (the input plus
/// every stage's saved_bytes), at most `max_bytes` of it.
double cold_write_of_stages(
    int64_t input_bytes,
    const std::vector<planner::StageCost>& stages,
    int64_t max_bytes,
    c10::Device device) {
  int64_t working_set_bytes = input_bytes;
  for (const planner::StageCost& stage : stages) {
    working_set_bytes += stage.saved_bytes;
  }
  return detail::cold_write_ms_per_mib(
      std::min(working_set_bytes, max_bytes), device);
}

}  // namespace

namespace detail {

// Buffers of up to 1 MiB, as many as cover the working set: each filled once
// just after its allocation and kept (fresh memory, as the records of a
// step), against one buffer filled again and again (memory in cache). A
// first pass, not timed, lets the allocator map the pages, as the steps
// before a step have; the median per buffer over three timed passes. At
// least 0.
double cold_write_ms_per_mib(int64_t working_set_bytes, c10::Device device) {
  if (!device.is_cpu() || working_set_bytes <= 0) {
    return 0;
  }
  constexpr int64_t kMiB = int64_t{1} << 20;
  const int64_t buffer_bytes = std::min(kMiB, working_set_bytes);
  const int64_t buffers = working_set_bytes / buffer_bytes;
  const auto options = torch::TensorOptions().dtype(torch::kFloat32);
  const int64_t elements = buffer_bytes / 4;
  if (elements == 0) {
    return 0;
  }
  std::vector<double> cold_ms;
  std::vector<double> warm_ms;
  torch::Tensor reused = torch::empty({elements}, options);
  reused.fill_(1);
  for (int pass = 0; pass < 4; ++pass) {
    std::vector<torch::Tensor> kept;
    for (int64_t k = 0; k < buffers; ++k) {
      measure::Timer cold;
      torch::Tensor fresh = torch::empty({elements}, options);
      fresh.fill_(1);
      const double fresh_ms = cold.elapsed_ms();
      kept.push_back(std::move(fresh));
      measure::Timer warm;
      reused.fill_(2);
      const double reused_ms = warm.elapsed_ms();
      if (pass > 0) {
        cold_ms.push_back(fresh_ms);
        warm_ms.push_back(reused_ms);
      }
    }
  }
  const double mib =
      static_cast<double>(buffer_bytes) / static_cast<double>(kMiB);
  return std::max(
      0.0, (planner::median(cold_ms) - planner::median(warm_ms)) / mib);
}

}  // namespace detail

namespace {

/// The bytes of `module`'s buffers (0 for none).
int64_t buffer_bytes(const std::shared_ptr<torch::nn::Module>& module) {
  int64_t bytes = 0;
  if (module) {
    for (const auto& buffer : module->buffers(/*recurse=*/true)) {
      bytes += static_cast<int64_t>(buffer.nbytes());
    }
  }
  return bytes;
}

/// One stage on its inputs, as measured in one round.
struct RecordRun {
  const detail::StageCall& call;
  int64_t index;
  const std::vector<torch::Tensor>& inputs;  // its distinct input values
  const std::vector<int64_t>& values;        // which values they are (x_v)
  const std::vector<bool>& leaf_requires_grad;
  int64_t gradient_bytes;  // the model's gradients of its inputs, summed
  bool timed;
};

/// What one way of recording a stage costs, over the rounds: the byte
/// fields' maximum and the backward's times.
struct RecordCost {
  int64_t saved_bytes = 0;
  int64_t forward_tmp_bytes = 0;
  int64_t backward_tmp_bytes = std::numeric_limits<int64_t>::min();
  std::vector<double> backward_times;

  // A recorded forward on a leaf aliasing x_i (under `policy`, or all of
  // it for an empty one), then its backward, as the executor runs them.
  void measure(
      const RecordRun& run,
      const Policy& policy,
      MemoryMeter& meter,
      const c10::Device& device) {
    std::vector<torch::Tensor> leaves;
    for (size_t k = 0; k < run.inputs.size(); ++k) {
      leaves.push_back(run.inputs[k].detach());
      leaves.back().requires_grad_(run.leaf_requires_grad[k]);
    }
    meter.reset();
    torch::Tensor output =
        detail::record_stage(run.call, run.index, leaves, run.values, policy);
    const int64_t saved = meter.current_bytes() - meter.baseline_bytes();
    saved_bytes = std::max(saved_bytes, saved);
    forward_tmp_bytes =
        std::max<int64_t>(forward_tmp_bytes, meter.peak_delta_bytes() - saved);

    torch::Tensor grad_output = torch::ones_like(output);
    measure::synchronize(device);
    meter.reset();
    const measure::Timer timer;
    if (output.requires_grad()) {
      // As the executor: output and gradient are handed to autograd.
      detail::run_stage_backward(std::move(output), std::move(grad_output));
    }
    measure::synchronize(device);
    if (run.timed) {
      backward_times.push_back(timer.elapsed_ms());
    }
    backward_tmp_bytes = std::max<int64_t>(
        backward_tmp_bytes, meter.peak_delta_bytes() - run.gradient_bytes);
  }
};

/// Throws c10::Error, naming `who`, unless `sample` is defined and the
/// options' rounds are valid.
void check_profile_arguments(
    const char* who,
    const torch::Tensor& sample,
    const ProfileOptions& options) {
  TORCH_CHECK(sample.defined(), who, ": expected a defined sample");
  TORCH_CHECK(
      options.warmup() >= 0,
      who,
      ": expected warmup >= 0, got ",
      options.warmup());
  TORCH_CHECK(
      options.repeats() >= 1,
      who,
      ": expected repeats >= 1, got ",
      options.repeats());
  TORCH_CHECK(
      options.cold_write_max_bytes() >= 0,
      who,
      ": expected cold_write_max_bytes >= 0, got ",
      options.cold_write_max_bytes());
}

/// Measures the costs of one stage, of a chain or a graph (see the top of
/// this file), on its distinct input values.
planner::StageCost measure_stage(
    const detail::StageCall& call,
    int64_t index,
    const std::vector<torch::Tensor>& inputs,
    const std::vector<int64_t>& values,
    const std::vector<bool>& leaf_requires_grad,
    int64_t gradient_bytes,
    const ProfileOptions& options,
    MemoryMeter& meter) {
  const c10::Device device = inputs.at(0).device();
  const int64_t rounds = options.warmup() + options.repeats();
  planner::StageCost cost;
  RecordCost full;
  RecordCost selective;
  std::vector<double> forward_times;
  // The buffers a re-run of the stage copies aside: those of the
  // submodules its forward writes (NOTE: [Recompute and module state]).
  int64_t backup_bytes = 0;
  for (int64_t round = 0; round < rounds; ++round) {
    const bool timed = round >= options.warmup();
    {  // 1. forward with nothing recorded
      measure::synchronize(device);
      const detail::BufferWrites writes({call.module});
      meter.reset();
      const measure::Timer timer;
      torch::Tensor output;
      {
        c10::NoGradGuard no_grad;
        output = detail::forward_of_stage(call, index, inputs, values);
      }
      backup_bytes =
          std::max(backup_bytes, detail::own_buffer_bytes(writes.written()));
      measure::synchronize(device);
      if (timed) {
        forward_times.push_back(timer.elapsed_ms());
      }
      cost.output_bytes = static_cast<int64_t>(output.nbytes());
      cost.forward_tmp_bytes = std::max<int64_t>(
          cost.forward_tmp_bytes, meter.peak_delta_bytes() - cost.output_bytes);
    }
    const RecordRun run{
        call, index, inputs, values, leaf_requires_grad, gradient_bytes, timed};
    full.measure(run, Policy{}, meter, device);  // 2. and 3.
    if (options.selective_policy()) {
      selective.measure(run, options.selective_policy(), meter, device);
    }
  }
  // A re-run of the stage backs up the buffers its forward writes while it
  // runs (NOTE: [Recompute and module state]); the first forward does not,
  // but the model has one forward cost per stage, so both carry the backup.
  // A selective stage's recomputation, inside its checkpoint region, backs
  // up every buffer of the stage module.
  cost.forward_tmp_bytes += backup_bytes;
  cost.forward_ms = planner::median(forward_times);
  cost.saved_bytes = full.saved_bytes;
  cost.record_tmp_bytes = full.forward_tmp_bytes + backup_bytes;
  cost.backward_tmp_bytes = full.backward_tmp_bytes;
  cost.backward_ms = planner::median(full.backward_times);
  if (options.selective_policy()) {
    // Its recomputation runs inside the backward; its time is what the
    // backward takes beyond a recorded one's (noise can make that
    // negative: the model's recomputation is never faster than none).
    cost.selective = planner::SelectiveCost{
        selective.saved_bytes,
        selective.forward_tmp_bytes + buffer_bytes(call.module),
        selective.backward_tmp_bytes,
        std::max(
            0.0, planner::median(selective.backward_times) - cost.backward_ms)};
  }
  return cost;
}

}  // namespace

planner::Chain profile_chain(
    torch::nn::Sequential model,
    const torch::Tensor& sample,
    const ProfileOptions& options) {
  TORCH_CHECK(
      !model.is_empty() && model->size() > 0,
      "remat::profile_chain: expected a non-empty Sequential, got ",
      model.is_empty() ? "a null one" : "one with no children");
  return profile_chain(stages_of(model), sample, options);
}

planner::Chain profile_chain(
    const std::vector<Stage>& model,
    const torch::Tensor& sample,
    const ProfileOptions& options) {
  detail::check_stages("remat::profile_chain", model);
  check_profile_arguments("remat::profile_chain", sample, options);
  // Before any work: it checks the optimizer ratio.
  const planner::ModelState model_state =
      model_state_of(model, options.optimizer_state_ratio());

  detail::ModelStateGuard state_guard(
      detail::modules_of(model), sample.device());
  MemoryMeter meter(sample.device());
  std::vector<planner::StageCost> stages;
  torch::Tensor input = sample.detach();
  const int64_t input_bytes = static_cast<int64_t>(input.nbytes());
  int64_t input_value_bytes = input_bytes;  // |x_i|, the model's |g_i|
  for (size_t i = 0; i < model.size(); ++i) {
    const auto index = static_cast<int64_t>(i);
    const detail::StageCall call = detail::call_of(model[i]);
    const std::vector<bool> leaf_requires_grad{
        (input.is_floating_point() || input.is_complex()) &&
        (i > 0 || sample.requires_grad())};
    stages.push_back(measure_stage(
        call,
        index,
        {input},
        {index},
        leaf_requires_grad,
        input_value_bytes,
        options,
        meter));
    {
      c10::NoGradGuard no_grad;
      input =
          detail::forward_of_stage(call, index, {input}, {index});  // x_{i+1}
    }
    input_value_bytes = stages.back().output_bytes;
  }
  const double cold_write = cold_write_of_stages(
      input_bytes, stages, options.cold_write_max_bytes(), sample.device());
  return planner::Chain(
             std::move(stages),
             input_bytes,
             /*resident_bytes=*/0,
             model_state)
      .with_cold_write_ms_per_mib(cold_write);
}

planner::Graph profile_graph(
    const std::vector<GraphStage>& stages,
    const torch::Tensor& sample,
    const ProfileOptions& options) {
  const planner::Graph structure =
      detail::graph_structure("remat::profile_graph", stages);
  check_profile_arguments("remat::profile_graph", sample, options);
  const std::vector<Stage> holders = detail::module_holders(stages);
  const planner::ModelState model_state =
      model_state_of(holders, options.optimizer_state_ratio());

  detail::ModelStateGuard state_guard(
      detail::modules_of(holders), sample.device());
  MemoryMeter meter(sample.device());
  std::vector<planner::StageCost> costs;
  // x_v, held until its last reader has been measured.
  std::vector<torch::Tensor> values(stages.size() + 1);
  values[0] = sample.detach();
  std::vector<int64_t> last_reader(stages.size() + 1, -1);
  for (int64_t i = 0; i < structure.size(); ++i) {
    for (int64_t v : structure.input_values(i)) {
      last_reader[v] = i;
    }
  }
  for (int64_t i = 0; i < structure.size(); ++i) {
    const detail::StageCall call = detail::call_of(stages[i], structure, i);
    std::vector<torch::Tensor> inputs;
    std::vector<bool> leaf_requires_grad;
    int64_t gradient_bytes = 0;
    for (int64_t v : structure.input_values(i)) {
      inputs.push_back(values[v]);
      leaf_requires_grad.push_back(
          (values[v].is_floating_point() || values[v].is_complex()) &&
          (v > 0 || sample.requires_grad()));
      gradient_bytes += static_cast<int64_t>(values[v].nbytes());
    }
    costs.push_back(measure_stage(
        call,
        i,
        inputs,
        structure.input_values(i),
        leaf_requires_grad,
        gradient_bytes,
        options,
        meter));
    {
      c10::NoGradGuard no_grad;
      values[i + 1] =
          detail::forward_of_stage(call, i, inputs, structure.input_values(i));
    }
    inputs.clear();
    for (int64_t v : structure.input_values(i)) {
      if (v > 0 && last_reader[v] == i) {
        values[v] = torch::Tensor();
      }
    }
  }
  std::vector<std::vector<int64_t>> inputs;
  for (int64_t i = 0; i < structure.size(); ++i) {
    inputs.push_back(structure.inputs(i));
  }
  const double cold_write = cold_write_of_stages(
      static_cast<int64_t>(sample.nbytes()),
      costs,
      options.cold_write_max_bytes(),
      sample.device());
  return planner::Graph(
             std::move(costs),
             std::move(inputs),
             static_cast<int64_t>(sample.nbytes()),
             model_state)
      .with_cold_write_ms_per_mib(cold_write);
}

planner::ModelState model_state_of(
    const std::vector<Stage>& stages, double optimizer_state_ratio) {
  TORCH_CHECK(
      std::isfinite(optimizer_state_ratio) && optimizer_state_ratio >= 0 &&
          optimizer_state_ratio <= 64,
      "remat::model_state_of: expected 0 <= optimizer_state_ratio <= 64, got ",
      optimizer_state_ratio);
  std::unordered_set<const void*> storages;
  std::unordered_set<const void*> trainable;
  planner::ModelState state;
  for (const Stage& stage : stages) {
    if (!stage.module) {
      continue;
    }
    std::vector<torch::Tensor> tensors = stage.module->parameters();
    const std::vector<torch::Tensor> buffers = stage.module->buffers();
    tensors.insert(tensors.end(), buffers.begin(), buffers.end());
    for (const torch::Tensor& tensor : tensors) {
      if (!tensor.defined()) {
        continue;
      }
      if (tensor.has_storage() &&
          storages.insert(tensor.storage().unsafeGetStorageImpl()).second) {
        state.parameter_bytes +=
            static_cast<int64_t>(tensor.storage().nbytes());
      }
      if (tensor.requires_grad() &&
          trainable.insert(tensor.unsafeGetTensorImpl()).second) {
        state.gradient_bytes += static_cast<int64_t>(tensor.nbytes());
      }
    }
  }
  state.optimizer_bytes = static_cast<int64_t>(
      optimizer_state_ratio * static_cast<double>(state.gradient_bytes));
  return state;
}

}  // namespace remat
