// auto_checkpoint.cpp: from a budget to a plan (plan_within), and from a
// model to a planned model in one call (auto_checkpoint).
#include <optional>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>

#include "remat/planned_sequential.h"
#include "remat/planner/solvers.h"

namespace remat {

planner::Plan plan_within(
    const planner::Chain& chain,
    const Budget& budget,
    const planner::SolverOptions& solver) {
  const int64_t budget_bytes = budget.resolve_bytes(chain);
  const int64_t minimum_bytes = planner::min_feasible_budget_bytes(chain);
  TORCH_CHECK(
      budget_bytes >= minimum_bytes,
      "remat::plan_within: expected a budget of at least ",
      minimum_bytes,
      " bytes (the minimum feasible for this model and input), got ",
      budget_bytes,
      " bytes (",
      budget.to_string(),
      ")");
  std::optional<planner::Plan> plan =
      planner::solve_optimal(chain, budget_bytes, solver);
  TORCH_INTERNAL_ASSERT(
      plan.has_value(),
      "solve_optimal found no plan at or above the minimum feasible budget");
  return std::move(*plan);
}

namespace {

/// The options of the planned chain auto_checkpoint makes.
PlannedChainOptions planned_options(
    const torch::Tensor& sample,
    const Budget& budget,
    const AutoCheckpointOptions& options) {
  return PlannedChainOptions()
      .input_shape(sample.sizes().vec())
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
      planned_options(sample, budget, options));
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
      planned_options(sample, budget, options));
}

}  // namespace remat
