// remat/planned_sequential.h: run a torch::nn::Sequential according to a
// planner::Plan, and fit a model into a byte budget in one call.
//
// PlannedSequential wraps a Sequential (sharing its parameters) and a plan for
// it. In training (grad mode on, and the input or some parameter requiring
// grad) forward() executes the plan's forward phase and returns the output;
// backward executes the rest of the plan: recomputations and per-stage
// backwards, holding exactly the values the memory model holds (see
// docs/planner.md, "The memory model"), so the measured activation
// peak plus the input bytes is what planner::simulate() predicts for the
// chain profile_chain() measured. Gradients equal those of the plain
// Sequential (bitwise on CPU for deterministic ops): every recomputation
// replays the RNG state of the stage's first forward and leaves module
// buffers (BatchNorm running statistics) as the first forward left them.
// Under no-grad (evaluation) forward() is the plain Sequential forward.
//
// Input shape: a plan is shape-agnostic, but its memory prediction is not.
// With options.input_shape set (auto_checkpoint sets it to the sample's
// shape), an input of another shape is an error naming both shapes
// (ShapePolicy::kError, the default) or re-profiles and re-solves the budget
// for the new shape (ShapePolicy::kReplan; once per shape, plans are kept by
// shape). See docs/planned_execution.md.
//
// Limits: those of PlannedChain (remat/planned_chain.h), which runs it: no
// torch::autograd::grad, backward(inputs=...) or create_graph, one backward
// per forward; every child takes one Tensor and returns one Tensor (for
// other blocks, build a std::vector<Stage> and use PlannedChain).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <ostream>
#include <vector>

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include "remat/planned_chain.h"

namespace remat {

/// The options of a PlannedSequential are those of a PlannedChain.
using PlannedSequentialOptions = PlannedChainOptions;

/// A Sequential executed according to a plan (see the top of this header).
/// Shares the parameters and buffers of the wrapped Sequential;
/// clone() deep-copies it.
///
/// Example:
// clang-format off
///   auto chain = remat::profile_chain(model, sample);
///   auto plan = remat::planner::solve_optimal(chain, 512LL << 20);
///   remat::PlannedSequential net(model, *plan);
///   net->forward(x).sum().backward();     // gradients land in model's params
// clang-format on
///
/// Throws c10::Error (constructor) if `sequential` is null or empty, or the
/// plan is not valid for a chain of sequential->size() stages (the message
/// carries planner::simulate()'s error).
class PlannedSequentialImpl
    : public torch::nn::Cloneable<PlannedSequentialImpl> {
 public:
  PlannedSequentialImpl(
      torch::nn::Sequential sequential,
      planner::Plan plan,
      PlannedSequentialOptions options = {});

  /// Runs the plan (training) or the plain Sequential (no grad needed: any
  /// shape, nothing re-planned, the module's plan state untouched).
  /// Throws c10::Error on a training input of a shape other than
  /// options.input_shape under ShapePolicy::kError, one that requires grad
  /// when options.input_requires_grad is false, or if the Sequential's size
  /// changed since construction or reset().
  torch::Tensor forward(const torch::Tensor& input);

  /// Binds the plan to the Sequential's children again (after a push_back)
  /// and re-validates it against them; throws c10::Error, leaving the module
  /// as it was, if it does not fit (parameters are those of the wrapped
  /// Sequential; there is nothing to re-initialise).
  void reset() override;
  /// Deep copy: the clone wraps sequential->clone(device) with the same plan.
  std::shared_ptr<torch::nn::Module> clone(
      const c10::optional<torch::Device>& device = c10::nullopt) const override;
  /// "remat::PlannedSequential(stages=4, plan=R0 R1 R2 R3 B3 B2 B1 B0)".
  void pretty_print(std::ostream& stream) const override;

  /// The chain plan() was solved on (as PlannedChain::chain()).
  const std::optional<planner::Chain>& chain() const {
    return options.chain();
  }
  /// The plan in force (replaced under ShapePolicy::kReplan and by
  /// self-correction: PlannedChainOptions::self_correct).
  const planner::Plan& plan() const;
  /// As PlannedChain::corrections().
  const std::vector<PlanCorrection>& corrections() const;
  /// As PlannedChain::measured_chain().
  const std::optional<planner::Chain>& measured_chain() const;
  /// Every plan made so far, keyed by the input shape it was made for: the
  /// constructor's plan under options.input_shape (when set), and one per
  /// shape re-planned under ShapePolicy::kReplan. An input of a shape seen
  /// before takes its plan from here, without profiling again (a smaller last
  /// batch per epoch costs one profile, not two per epoch).
  const std::map<std::vector<int64_t>, planner::Plan>& plans_by_shape() const;
  /// The wrapped Sequential.
  torch::nn::Sequential sequential{nullptr};
  /// The options given at construction. Values changed here are checked as
  /// at construction by the next training forward (c10::Error naming the
  /// option).
  PlannedSequentialOptions options;

 private:
  std::shared_ptr<detail::PlannedRun> run_;  // over sequential's children
};
TORCH_MODULE(PlannedSequential);

/// Profiles `model` on `sample`, then plan_within(chain, budget) and wraps
/// the model: the fastest schedule the planner knows within the budget.
/// The result expects inputs of sample's shape (see ShapePolicy), and
/// training inputs that require grad only if the sample does
/// (PlannedChainOptions::input_requires_grad): profile on a sample like the
/// real inputs.
///
/// Throws c10::Error if the budget is below planner::min_feasible_budget_bytes
/// of the profiled chain; the message states the minimum and the requested
/// budget in bytes. Other errors as profile_chain.
///
/// Example:
// clang-format off
///   auto net = remat::auto_checkpoint(model, sample, Budget::parse("50%"));
///   net->forward(x).sum().backward();
// clang-format on
PlannedSequential auto_checkpoint(
    torch::nn::Sequential model,
    const torch::Tensor& sample,
    Budget budget,
    const AutoCheckpointOptions& options = {});

}  // namespace remat
