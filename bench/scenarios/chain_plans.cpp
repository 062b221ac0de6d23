// chain_plans.cpp — see chain_plans.h.
#include "chain_plans.h"

#include <algorithm>
#include <limits>
#include <sstream>
#include <vector>

#include "models/models.h"
#include "remat/measure/statistics.h"

namespace remat::bench {

planner::Chain profile_for_planning(
    torch::nn::Sequential model, const torch::Tensor& input) {
  return remat::profile_chain(
      std::move(model), input, remat::ProfileOptions().warmup(3).repeats(11));
}

planner::Chain with_equal_stage_times(const planner::Chain& chain) {
  std::vector<double> forward_ms;
  std::vector<double> backward_ms;
  for (const planner::StageCost& stage : chain.stages()) {
    forward_ms.push_back(stage.forward_ms);
    backward_ms.push_back(stage.backward_ms);
  }
  const double forward_median = summarize(forward_ms).median;
  const double backward_median = summarize(backward_ms).median;
  std::vector<planner::StageCost> stages = chain.stages();
  for (planner::StageCost& stage : stages) {
    stage.forward_ms = forward_median;
    stage.backward_ms = backward_median;
  }
  return planner::Chain(std::move(stages), chain.input_bytes())
      .with_cold_write_ms_per_mib(chain.cold_write_ms_per_mib());
}

int64_t stage_forwards(const planner::Plan& plan) {
  return std::count_if(
      plan.ops.begin(), plan.ops.end(), [](const planner::Op& op) {
        return op.kind != planner::OpKind::kBackward;
      });
}

std::vector<torch::Tensor> gradients(torch::nn::Module& model) {
  std::vector<torch::Tensor> grads;
  for (const auto& parameter : model.parameters()) {
    grads.push_back(parameter.grad().detach().clone());
  }
  return grads;
}

void append(Measurement& into, const Measurement& step) {
  into.forward_ms.insert(
      into.forward_ms.end(), step.forward_ms.begin(), step.forward_ms.end());
  into.backward_ms.insert(
      into.backward_ms.end(), step.backward_ms.begin(), step.backward_ms.end());
  into.step_ms.insert(
      into.step_ms.end(), step.step_ms.begin(), step.step_ms.end());
  into.cpu_ms.insert(into.cpu_ms.end(), step.cpu_ms.begin(), step.cpu_ms.end());
  into.peak_bytes = std::max(into.peak_bytes, step.peak_bytes);
}

void check_gradients(
    const std::string& scenario,
    const std::string& name,
    const std::vector<torch::Tensor>& grads,
    const std::vector<torch::Tensor>& reference,
    bool bitwise,
    Measurement& into) {
  for (size_t p = 0; p < grads.size(); ++p) {
    const double diff = (grads[p] - reference[p]).abs().max().item<double>();
    into.max_grad_diff = std::max(into.max_grad_diff, diff);
    const bool equal =
        bitwise ? torch::equal(grads[p], reference[p]) : diff <= 1e-5;
    if (!equal) {
      throw GradientMismatch(
          "remat_bench " + scenario + ": " + name +
          " computed other gradients than none (parameter " +
          std::to_string(p) + ", max |diff| " + std::to_string(diff) + ")");
    }
  }
}

void E2Sizes::add_flags(CLI::App& command) {
  command.add_option("--resnet-batch", resnet_batch, "ResNet images")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  command.add_option("--mlp-batch", mlp_batch, "MLP rows")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
}

int64_t E2Sizes::resnet(const Context& context) const {
  return context.quick ? std::min<int64_t>(4, resnet_batch) : resnet_batch;
}

int64_t E2Sizes::mlp(const Context& context) const {
  return context.quick ? std::min<int64_t>(64, mlp_batch) : mlp_batch;
}

E2Chain E2Sizes::resnet_chain(const Context& context) const {
  torch::manual_seed(11);
  const int64_t batch = resnet(context);
  E2Chain chain;
  chain.id = "resnet";
  chain.description =
      "ResNet-style chain (channels 16-32-64-128, 2 blocks per stage, 32×32 "
      "images, batch " +
      std::to_string(batch) + ")";
  chain.model = remat::models::resnet_chain(
      remat::models::ResNetChainOptions().stage_channels({16, 32, 64, 128}));
  chain.input = torch::randn({batch, 3, 32, 32});
  return chain;
}

E2Chain E2Sizes::mlp_chain(const Context& context) const {
  torch::manual_seed(12);
  const int64_t batch = mlp(context);
  const auto widths = remat::models::varying_mlp_widths(16);
  E2Chain chain;
  chain.id = "mlp";
  chain.description = "MLP of varying widths (256 … 2048, 16 stages, batch " +
                      std::to_string(batch) + ")";
  chain.model =
      remat::models::mlp_chain(remat::models::MlpChainOptions(widths));
  chain.input = torch::randn({batch, widths[0]});
  return chain;
}

std::string prediction_summary(
    const std::vector<PredictedRatio>& ratios, const std::string& over) {
  double lowest = std::numeric_limits<double>::infinity();
  double highest = 0;
  int64_t met = 0;
  int64_t missed = 0;
  int64_t without_interval = 0;
  for (const auto& [predicted, measured] : ratios) {
    const double error = predicted / measured.median;
    lowest = std::min(lowest, error);
    highest = std::max(highest, error);
    if (!measured.has_interval) {
      ++without_interval;
      continue;
    }
    // predicted / measured within [0.95, 1.05] for every measured value in
    // the interval (met), or for none of them (missed).
    if (predicted / measured.high >= 0.95 && predicted / measured.low <= 1.05) {
      ++met;
    } else if (
        predicted / measured.low < 0.95 || predicted / measured.high > 1.05) {
      ++missed;
    }
  }
  const auto count = static_cast<int64_t>(ratios.size());
  std::ostringstream summary;
  summary << "**Prediction:** simulate()'s time ratio against no "
             "checkpointing / the measured median, over "
          << over << ": " << Cell::ratio(lowest).markdown() << " to "
          << Cell::ratio(highest).markdown()
          << "; the measured interval within ±5 % of the prediction for " << met
          << ", wholly outside it for " << missed << ", across its edge for "
          << count - met - missed - without_interval;
  if (without_interval > 0) {
    summary << ", without an interval (too few rounds) for "
            << without_interval;
  }
  summary << " (target: every plan within ±5 %).";
  return summary.str();
}

}  // namespace remat::bench
