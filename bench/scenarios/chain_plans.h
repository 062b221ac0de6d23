// chain_plans.h — what the planned-execution scenarios (E1, E2, E2-variants,
// E7, E8) share: how a chain is profiled for them, counts read off plans, the
// E2 models' batch sizes, and the pieces of a round loop built on
// Runner::step (steps appended, gradients compared with the baseline's).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include "harness/scenario.h"

#include "remat/planner.h"
#include "remat/remat.h"

namespace remat::bench {

/// profile_chain with 3 warm-up and 11 timed runs (more than its default):
/// single stage times of a few ms vary by tens of percent on a shared
/// machine, and plans follow the times.
planner::Chain profile_for_planning(
    torch::nn::Sequential model, const torch::Tensor& input);

/// `chain` with every stage's forward and backward time replaced by the
/// median over its stages: for chains of identical stages, where what
/// differs between their measured times is noise the plan should not follow.
planner::Chain with_equal_stage_times(const planner::Chain& chain);

/// Stage forwards a plan executes (every op but the backwards).
int64_t stage_forwards(const planner::Plan& plan);

/// Detached copies of the gradients of `model`'s parameters.
std::vector<torch::Tensor> gradients(torch::nn::Module& model);

/// Appends the times of one step (Runner::step) to `into` and raises its
/// peak to the step's.
void append(Measurement& into, const Measurement& step);

/// Compares `grads` with the baseline's `reference` of the same round:
/// bitwise when `bitwise` (CPU), else within 1e-5. Raises
/// into.max_grad_diff; throws GradientMismatch naming `scenario`, the
/// configuration `name` and the parameter on a difference.
void check_gradients(
    const std::string& scenario,
    const std::string& name,
    const std::vector<torch::Tensor>& grads,
    const std::vector<torch::Tensor>& reference,
    bool bitwise,
    Measurement& into);

/// simulate()'s time ratio of a plan against no checkpointing, and the
/// measured one (Measurement::step_ratio).
struct PredictedRatio {
  double predicted = 0;
  RatioInterval measured;
};

/// How predicted time ratios compare with the measured ones, as one
/// paragraph ("**Prediction:** ..."): the range of predicted / measured
/// median over `ratios`, and how many measured intervals lie within ±5 % of
/// the prediction (every value in the interval), wholly outside it, or across
/// its edge. `over` names the configurations ("the 37 configurations of both
/// chains").
std::string prediction_summary(
    const std::vector<PredictedRatio>& ratios, const std::string& over);

/// One of E2's two chains: a model, its input and a description.
struct E2Chain {
  std::string id;           // "resnet" or "mlp": table names
  std::string description;  // its sizes, as the tables' captions say
  torch::nn::Sequential model;
  torch::Tensor input;
};

/// The batch sizes of E2's two models, shared by E2, E2-executor,
/// E2-variants and E8, and the two chains themselves.
struct E2Sizes {
  int64_t resnet_batch = 32;  // ResNet images per batch (--quick: at most 4)
  int64_t mlp_batch = 256;    // MLP rows (--quick: at most 64)

  /// Adds --resnet-batch and --mlp-batch, bound to this object.
  void add_flags(CLI::App& command);
  /// The batches a run uses: the flags', capped under --quick.
  int64_t resnet(const Context& context) const;
  int64_t mlp(const Context& context) const;
  /// The ResNet-style chain (channels 16-32-64-128, 2 blocks per stage,
  /// 32×32 images; weights and images drawn after manual_seed(11)).
  E2Chain resnet_chain(const Context& context) const;
  /// The MLP of varying widths (256 … 2048, 16 stages; manual_seed(12)).
  E2Chain mlp_chain(const Context& context) const;
};

}  // namespace remat::bench
