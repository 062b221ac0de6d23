// remat/planned_chain.h: run any chain of blocks (a std::vector<Stage>)
// according to a planner::Plan, and fit it into a byte budget in one call.
//
// PlannedChain runs stages (remat/stage.h) under a plan, with the guarantees
// of PlannedSequential, which is a PlannedChain over a Sequential's children:
// in training (grad mode on, and the input or some parameter requiring grad)
// forward() executes the plan's forward phase and backward the rest
// (recomputations and per-stage backwards), holding exactly the values the
// memory model holds (docs/planner.md, "The memory model"), so the measured
// activation peak plus the input bytes is what planner::simulate() predicts
// for the chain profile_chain() measured. Gradients equal those of running
// the stages plainly (bitwise on CPU for deterministic ops): every
// recomputation replays the RNG and autocast state of the stage's first
// forward and leaves the buffers of the stage's module as the first forward
// left them (to rounding only when several stages use one module and its
// parameters' gradients already hold terms when a stage's backward adds its
// own: a step after another without zero_grad, or one backward through two
// forwards of the net: docs/planned_execution.md).
// Under no-grad (evaluation) forward() runs the stages plainly, at any input
// shape, and changes nothing in the executor: evaluations may run on other
// threads while one thread trains. Training forwards change the executor's
// state (a re-plan, self-correction's timings): one thread at a time.
//
// Input shape: with options.input_shape set (auto_checkpoint sets it to the
// sample's shape), a training input of another shape is an error naming
// both shapes (ShapePolicy::kError, the default) or re-profiles and
// re-solves the budget for the new shape (ShapePolicy::kReplan; plans are
// kept by shape). See docs/planned_execution.md.
//
// Self-correction (options.self_correct): while training, the executor times
// every stage's forwards and backwards (on CUDA it synchronizes the device at
// each op boundary to do so). After each options.correction_steps training
// steps it builds the chain with those times (each stage's median forward and
// backward; the bytes stay the profile's: options.chain, or, without one, a
// profile_chain on the first training input) and re-solves the same budget
// (options.budget resolved on that chain, or else the predicted peak of the
// plan given at construction). When the new plan is predicted faster than the
// plan in force by more than options.correction_threshold, it replaces it
// before the next step; the measured window starts again either way. A
// switch never raises the predicted peak above that budget, and gradients
// are those of the plain run under any plan. corrections() lists the
// switches. A profile_chain made for want of options.chain runs inside the
// first training step: that step's peak is then the profile's (one stage
// measured at a time, its cold-write buffers within the budget), within the
// budget on typical models but not guaranteed; pass options.chain when every
// step must stay within it. See docs/planned_execution.md.
//
// Limits: parameters receive their gradients by accumulation inside the
// backward, so torch::autograd::grad and backward(inputs=...) are refused;
// backward may run once per forward (no retain_graph re-use) and builds no
// graph of the gradients (backward(create_graph=true) is refused). A stage
// recomputed in the backward runs in the train()/eval() mode of its forward
// (the caller's mode is back after it), and it is refused if a parameter of
// its module was modified in place since that forward (update parameters
// after backward).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <vector>

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include "remat/budget.h"
#include "remat/plan_choice.h"
#include "remat/planner/chain.h"
#include "remat/planner/explain.h"
#include "remat/planner/plan.h"
#include "remat/planner/solvers.h"
#include "remat/policy.h"
#include "remat/profile.h"
#include "remat/stage.h"

namespace remat {
namespace detail {
struct PlannedRun;
}  // namespace detail

/// What a planned chain does when the input shape differs from
/// PlannedChainOptions::input_shape.
enum class ShapePolicy {
  kError,   ///< throw c10::Error naming both shapes (default)
  kReplan,  ///< profile the new shape and solve the budget again
};

/// Options of PlannedChain (and PlannedSequential).
struct PlannedChainOptions {
  /// The input shape the plan was made for; empty: any shape is accepted.
  /// Default: empty.
  TORCH_ARG(std::vector<int64_t>, input_shape) = {};
  /// Whether the sample the plan was profiled on required grad (only then
  /// does the profile measure the input's gradient). When false, a training
  /// input that requires grad is an error (its gradient would raise the peak
  /// above the plan's); when true, ShapePolicy::kReplan profiles new shapes
  /// with an input that requires grad. auto_checkpoint sets it to the
  /// sample's. Default: none (any input; kReplan profiles the input as it
  /// comes).
  TORCH_ARG(std::optional<bool>, input_requires_grad) = std::nullopt;
  /// What to do on another input shape (only when input_shape is set).
  /// Default: ShapePolicy::kError.
  TORCH_ARG(ShapePolicy, on_shape_change) = ShapePolicy::kError;
  /// The budget re-solved under ShapePolicy::kReplan; required for kReplan.
  /// Default: none.
  TORCH_ARG(std::optional<Budget>, budget) = std::nullopt;
  /// The per-op policy (remat/policy.h) under which the plan's
  /// kForwardSelective ops run: the one the chain was profiled with
  /// (ProfileOptions::selective_policy). Required when the plan has such
  /// ops; under ShapePolicy::kReplan it is also what the new shape is
  /// profiled with. Default: empty.
  TORCH_ARG(Policy, selective_policy) = {};
  /// Profiling options used by ShapePolicy::kReplan (its selective_policy
  /// is replaced by the one above). Default: {}.
  TORCH_ARG(ProfileOptions, profile) = {};
  /// Solver options used by ShapePolicy::kReplan. Default: {}.
  TORCH_ARG(planner::SolverOptions, solver) = {};
  /// The chain the plan was solved on (profile_chain's), kept so that a
  /// report (planner::explain, planner::simulate) needs no second profile.
  /// auto_checkpoint sets it; under ShapePolicy::kReplan it follows the
  /// input shape. Must have one stage per stage. Default: none.
  TORCH_ARG(std::optional<planner::Chain>, chain) = std::nullopt;
  /// Self-correcting plan (see "Self-correction" at the top). Default: false
  /// (the plan never changes but for ShapePolicy::kReplan: reproducible
  /// schedules).
  TORCH_ARG(bool, self_correct) = false;
  /// Training steps whose stage times are measured before each comparison
  /// with the plan's times (>= 1). Default: 3.
  TORCH_ARG(int64_t, correction_steps) = 3;
  /// The switch happens only when another plan is predicted faster than the
  /// plan in force, on the measured times, by more than this fraction of
  /// the plan's time (>= 0). Default: 0.05.
  TORCH_ARG(double, correction_threshold) = 0.05;
};

/// One switch of a self-correcting plan: PlannedChainImpl::corrections()
/// (`Costs` = planner::Chain: PlanCorrection) and
/// PlannedGraphImpl::corrections() (planner::Graph: GraphPlanCorrection,
/// remat/graph.h).
template <class Costs>
struct BasicPlanCorrection {
  /// Training steps run under the plan in force before this switch.
  int64_t after_steps = 0;
  planner::Plan from;  ///< the plan replaced
  planner::Plan to;    ///< the plan now in force
  /// simulate()'s times of `from` and `to` on the measured costs.
  double from_ms = 0;
  double to_ms = 0;
  /// The costs with the measured stage times the switch was decided on
  /// (the bytes are the profile's).
  Costs measured;
};

/// A switch of a self-correcting chain (PlannedChainImpl::corrections()).
using PlanCorrection = BasicPlanCorrection<planner::Chain>;

/// A chain of stages executed according to a plan (see the top of this
/// header). Registers the stages' distinct modules as its children
/// ("stage0", "stage3", ...: the first stage that uses each), so parameters()
/// and to() reach them. Not cloneable (stages are closures).
///
/// Example:
// clang-format off
///   auto chain = remat::profile_chain(stages, sample);
///   remat::PlannedChain net(stages, remat::plan_within(chain, remat::Budget::parse("50%")));
///   net->forward(x).sum().backward();    // gradients land in the modules' params
// clang-format on
///
/// Throws c10::Error (constructor) if `stages` is empty or a stage has no
/// forward, or the plan is not valid for stages.size() stages (the message
/// carries planner::simulate()'s error), or has a kForwardSelective op
/// without options.selective_policy, or on_shape_change is kReplan without
/// a budget, or correction_steps < 1 or correction_threshold < 0 (or not
/// finite).
class PlannedChainImpl : public torch::nn::Module {
 public:
  PlannedChainImpl(
      std::vector<Stage> stages,
      planner::Plan plan,
      PlannedChainOptions options = {});

  /// Runs the plan (training) or the stages plainly (no grad needed: any
  /// shape, nothing re-planned, the module's plan state untouched).
  /// Throws c10::Error on a training input of a shape other than
  /// options.input_shape under ShapePolicy::kError, or one that requires
  /// grad when options.input_requires_grad is false.
  torch::Tensor forward(const torch::Tensor& input);

  /// "remat::PlannedChain(stages=4, ops=8, plan=R0 R1 R2 R3 B3 B2 B1 B0)".
  void pretty_print(std::ostream& stream) const override;

  /// The plan in force (replaced under ShapePolicy::kReplan and by
  /// self-correction).
  const planner::Plan& plan() const;
  /// The switches self-correction made, oldest first (empty without
  /// options.self_correct).
  const std::vector<PlanCorrection>& corrections() const;
  /// The chain with the stage times of the last measured window (nullopt
  /// before the first one, and without options.self_correct): what the
  /// plan in force is compared on.
  const std::optional<planner::Chain>& measured_chain() const;
  /// Every plan made so far, keyed by input shape (as PlannedSequential's).
  const std::map<std::vector<int64_t>, planner::Plan>& plans_by_shape() const;
  /// The stages, in order.
  const std::vector<Stage>& stages() const;
  /// The chain plan() was solved on: options.chain (set by auto_checkpoint;
  /// std::nullopt when the plan was given without one).
  const std::optional<planner::Chain>& chain() const {
    return options.chain();
  }
  /// The options given at construction (input_shape and chain follow
  /// re-plans). Values changed here are checked as at construction by the
  /// next training forward (c10::Error naming the option).
  PlannedChainOptions options;

 private:
  std::shared_ptr<detail::PlannedRun> run_;
};
TORCH_MODULE(PlannedChain);

/// Options of auto_checkpoint().
struct AutoCheckpointOptions {
  /// Profiling options. Default: {}.
  TORCH_ARG(ProfileOptions, profile) = {};
  /// Options of planner::solve_optimal. Default: {}.
  TORCH_ARG(planner::SolverOptions, solver) = {};
  /// What the result does on another input shape. Default: kError.
  TORCH_ARG(ShapePolicy, on_shape_change) = ShapePolicy::kError;
  /// A per-op policy (remat/policy.h, e.g. policies::save_compute_intensive())
  /// that gives every stage a third way to run: keep only what the policy
  /// saves and recompute the rest in the backward. Each stage is profiled
  /// under it too (ProfileOptions::selective_policy), and the plan picks per
  /// stage among keeping everything, keeping its input only, and this.
  /// Default: empty (two ways, as rotor).
  TORCH_ARG(Policy, selective_policy) = {};
};

// plan_within (the optimal plan within a budget) and choose_plan (any
// strategy) are declared in remat/plan_choice.h.

/// Profiles `stages` on `sample`, then plan_within(chain, budget), and runs
/// the stages under that plan: the fastest schedule the planner knows within
/// the budget. The result expects inputs of sample's shape (see ShapePolicy).
///
/// Throws c10::Error if the budget is below planner::min_feasible_budget_bytes
/// of the profiled chain (naming the minimum and the requested bytes), and as
/// profile_chain and PlannedChain.
///
/// Example:
// clang-format off
///   auto net = remat::auto_checkpoint(stages, tokens, remat::Budget::parse("50%"));
///   remat::models::gpt_loss(net->forward(tokens), targets).backward();
// clang-format on
PlannedChain auto_checkpoint(
    std::vector<Stage> stages,
    const torch::Tensor& sample,
    Budget budget,
    const AutoCheckpointOptions& options = {});

/// The plan report; defined in the torch-free planner (remat/planner/explain.h)
/// and usable as remat::explain(chain, plan).
using planner::explain;

}  // namespace remat
