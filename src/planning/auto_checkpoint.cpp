// auto_checkpoint.cpp: from a model to a planned model in one call
// (auto_checkpoint); the plan comes from plan_within (plan_choice.cpp).
#include <optional>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>

#include "remat/planned_sequential.h"
#include "remat/planner/solvers.h"

namespace remat {

namespace {

/// The options of the planned chain auto_checkpoint makes.
PlannedChainOptions planned_options(
    const torch::Tensor& sample,
    const Budget& budget,
    const planner::Chain& chain,
    const AutoCheckpointOptions& options) {
  return PlannedChainOptions()
      .chain(chain)
      .input_shape(sample.sizes().vec())
      .input_requires_grad(sample.requires_grad())
      .on_shape_change(options.on_shape_change())
      .budget(budget)
      .selective_policy(options.selective_policy())
      .profile(options.profile())
      .solver(options.solver());
}

/// The profiling options auto_checkpoint profiles with.
ProfileOptions profile_options(const AutoCheckpointOptions& options) {
  ProfileOptions profile = options.profile();
  profile.selective_policy(options.selective_policy());
  return profile;
}

}  // namespace

PlannedSequential auto_checkpoint(
    torch::nn::Sequential model,
    const torch::Tensor& sample,
    Budget budget,
    const AutoCheckpointOptions& options) {
  planner::Chain chain = profile_chain(model, sample, profile_options(options));
  planner::Plan plan = plan_within(chain, budget, options.solver());
  return PlannedSequential(
      std::move(model),
      std::move(plan),
      planned_options(sample, budget, chain, options));
}

PlannedChain auto_checkpoint(
    std::vector<Stage> stages,
    const torch::Tensor& sample,
    Budget budget,
    const AutoCheckpointOptions& options) {
  planner::Chain chain =
      profile_chain(stages, sample, profile_options(options));
  planner::Plan plan = plan_within(chain, budget, options.solver());
  return PlannedChain(
      std::move(stages),
      std::move(plan),
      planned_options(sample, budget, chain, options));
}

}  // namespace remat
