// chain_plans.cpp — see chain_plans.h.
#include "chain_plans.h"

#include <algorithm>
#include <vector>

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
  return planner::Chain(std::move(stages), chain.input_bytes());
}

int64_t stage_forwards(const planner::Plan& plan) {
  return std::count_if(
      plan.ops.begin(), plan.ops.end(), [](const planner::Op& op) {
        return op.kind != planner::OpKind::kBackward;
      });
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

}  // namespace remat::bench
