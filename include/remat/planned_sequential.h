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
// Limits: parameters receive their gradients by accumulation inside the
// backward, so torch::autograd::grad and backward(inputs=...) are refused;
// backward may run once per forward (no retain_graph re-use); every child
// takes one Tensor and returns one Tensor.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include "remat/budget.h"
#include "remat/planner/chain.h"
#include "remat/planner/explain.h"
#include "remat/planner/plan.h"
#include "remat/planner/solvers.h"
#include "remat/profile.h"

namespace remat {

/// What PlannedSequential does when the input shape differs from
/// PlannedSequentialOptions::input_shape.
enum class ShapePolicy {
  kError,   ///< throw c10::Error naming both shapes (default)
  kReplan,  ///< profile the new shape and solve the budget again
};

/// Options of PlannedSequential.
struct PlannedSequentialOptions {
  /// The input shape the plan was made for; empty: any shape is accepted.
  /// Default: empty.
  TORCH_ARG(std::vector<int64_t>, input_shape) = {};
  /// What to do on another input shape (only when input_shape is set).
  /// Default: ShapePolicy::kError.
  TORCH_ARG(ShapePolicy, on_shape_change) = ShapePolicy::kError;
  /// The budget re-solved under ShapePolicy::kReplan; required for kReplan.
  /// Default: none.
  TORCH_ARG(std::optional<Budget>, budget) = std::nullopt;
  /// Profiling options used by ShapePolicy::kReplan. Default: {}.
  TORCH_ARG(ProfileOptions, profile) = {};
  /// Solver options used by ShapePolicy::kReplan. Default: {}.
  TORCH_ARG(planner::SolverOptions, solver) = {};
};

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

  /// Runs the plan (training) or the plain Sequential (no grad needed).
  /// Throws c10::Error on an input shape other than options.input_shape
  /// under ShapePolicy::kError.
  torch::Tensor forward(const torch::Tensor& input);

  /// Re-validates the plan against the Sequential (parameters are those of
  /// the wrapped Sequential; there is nothing to re-initialise).
  void reset() override;
  /// Deep copy: the clone wraps sequential->clone(device) with the same plan.
  std::shared_ptr<torch::nn::Module> clone(
      const c10::optional<torch::Device>& device = c10::nullopt) const override;
  /// "remat::PlannedSequential(stages=4, plan=R0 R1 R2 R3 B3 B2 B1 B0)".
  void pretty_print(std::ostream& stream) const override;

  /// The plan executed (replaced under ShapePolicy::kReplan).
  const planner::Plan& plan() const {
    return plan_;
  }
  /// Every plan made so far, keyed by the input shape it was made for: the
  /// constructor's plan under options.input_shape (when set), and one per
  /// shape re-planned under ShapePolicy::kReplan. An input of a shape seen
  /// before takes its plan from here, without profiling again (a smaller last
  /// batch per epoch costs one profile, not two per epoch).
  const std::map<std::vector<int64_t>, planner::Plan>& plans_by_shape() const {
    return plans_by_shape_;
  }
  /// The wrapped Sequential.
  torch::nn::Sequential sequential{nullptr};
  /// The options given at construction.
  PlannedSequentialOptions options;

 private:
  planner::Plan plan_;
  std::map<std::vector<int64_t>, planner::Plan> plans_by_shape_;
};
TORCH_MODULE(PlannedSequential);

/// Options of auto_checkpoint().
struct AutoCheckpointOptions {
  /// Profiling options. Default: {}.
  TORCH_ARG(ProfileOptions, profile) = {};
  /// Options of planner::solve_optimal. Default: {}.
  TORCH_ARG(planner::SolverOptions, solver) = {};
  /// What the result does on another input shape. Default: kError.
  TORCH_ARG(ShapePolicy, on_shape_change) = ShapePolicy::kError;
};

/// The optimal plan for `chain` within `budget`: planner::solve_optimal at
/// budget.resolve_bytes(chain) bytes with `solver`'s options.
///
/// Throws c10::Error if that is below planner::min_feasible_budget_bytes of
/// `chain`; the message states the minimum and the requested budget in bytes.
///
/// Example:
// clang-format off
///   auto chain = remat::profile_chain(model, sample);
///   remat::PlannedSequential net(model, remat::plan_within(chain, Budget::parse("50%")));
// clang-format on
planner::Plan plan_within(
    const planner::Chain& chain,
    const Budget& budget,
    const planner::SolverOptions& solver = {});

/// Profiles `model` on `sample`, then plan_within(chain, budget) and wraps
/// the model: the fastest schedule the planner knows within the budget.
/// The result expects inputs of sample's shape (see ShapePolicy).
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

/// The plan report; defined in the torch-free planner (remat/planner/explain.h)
/// and usable as remat::explain(chain, plan).
using planner::explain;

}  // namespace remat
