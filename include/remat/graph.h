// remat/graph.h: plan and train any graph of blocks (a DAG of stages: U-Nets'
// skip connections, residual and encoder-decoder stacks) under a byte budget.
//
// A GraphStage is a chain Stage (remat/stage.h) that reads the outputs of one
// or more earlier stages, or the graph's input. profile_graph() measures it
// into a torch-free planner::Graph; plan_within() chooses the fastest plan the
// graph solver finds within a Budget; PlannedGraph runs the stages under that
// plan with the guarantees of PlannedChain: gradients equal to the plain run
// (bitwise on CPU for deterministic ops), RNG and autocast replayed on every
// recomputation, module buffers (BatchNorm statistics) updated once per step,
// and the measured activation peak what planner::simulate(graph, plan)
// predicts. auto_checkpoint() does all three in one call. How graphs are
// planned and executed: docs/graphs.md.
//
// Self-correction (PlannedGraphOptions::self_correct; off by default): as a
// PlannedChain's (remat/planned_chain.h, "Self-correction"), on the graph:
// while training, the executor times every stage's forwards and backwards;
// after each options.correction_steps training steps the graph with those
// times (each stage's median; the bytes and inputs stay the profile's) is
// solved again (planner::solve_optimal on the graph) within the same budget
// (options.budget resolved on that graph, or else the predicted peak of the
// plan given at construction), and the solver's plan replaces the plan in
// force before the next step when it is predicted faster by more than
// options.correction_threshold. A switch never raises the predicted peak
// above that budget, and gradients are those of the plain run under any
// plan. corrections() lists the switches. The profile is options.graph or,
// without one, a profile_graph on the first training input, run inside that
// first step: that step's peak is then the profile's (one stage measured at
// a time with the values later stages read, its cold-write buffers within
// the budget), within the budget on typical models but not guaranteed; pass
// options.graph when every step must stay within it. See
// docs/planned_execution.md.
//
// Limits (as PlannedChain's): backward runs once per forward, and
// torch::autograd::grad / backward(inputs=...) / backward(create_graph=true)
// are refused.
#pragma once

#include <functional>
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
#include "remat/planned_chain.h"
#include "remat/planner/graph.h"
#include "remat/planner/plan.h"
#include "remat/planner/simulate.h"
#include "remat/planner/solvers.h"
#include "remat/policy.h"
#include "remat/profile.h"

namespace remat {
namespace detail {
struct PlanProgram;
class StageTimes;
template <class Costs>
struct Correction;
}  // namespace detail

/// The index that names the graph's input in GraphStage::inputs.
inline constexpr int kGraphInput = static_cast<int>(planner::kGraphInput);

/// One stage of a graph: `forward` maps the values named by `inputs`, in that
/// order, to the stage's output; `module` owns the parameters and buffers
/// `forward` uses (may be null; several stages may share one module).
/// `inputs` lists earlier stage indices, or kGraphInput for the graph's
/// input; the last stage's output is the graph's output.
///
/// Contract: as Stage's (remat/stage.h): one defined tensor returned, no
/// tensor read besides the arguments except constants, the arguments left
/// unchanged (no in-place operation on them; checked, c10::Error naming the
/// stage and the value), randomness from LibTorch's default generators, no
/// backward of its own (torch::autograd::grad inside the stage).
///
/// Example (stage 2 joins the input of the graph and stage 1's output):
// clang-format off
///   remat::GraphStage join{[](const std::vector<torch::Tensor>& in) {
///                            return torch::cat({in[0], in[1]}, 1); },
///                          nullptr, {remat::kGraphInput, 1}};
// clang-format on
struct GraphStage {
  std::function<torch::Tensor(const std::vector<torch::Tensor>&)> forward;
  std::shared_ptr<torch::nn::Module> module;
  std::vector<int> inputs;
};

/// Runs `stages` plainly (no plan) on `input`: what PlannedGraph computes.
/// Throws as profile_graph's checks of the stages.
torch::Tensor run_graph(
    const std::vector<GraphStage>& stages, const torch::Tensor& input);

/// Measures every stage of `stages` on `sample` (the graph input) and returns
/// the graph the planner solves: per stage the costs of a chain stage
/// (remat/profile.h), measured with all the stage's inputs in place; a
/// backward's transient is measured above the gradients of all its distinct
/// inputs. Leaves no trace (buffers, gradients, RNG restored). The model
/// state is model_state_of(the stages' modules, optimizer_state_ratio); the
/// cold-write cost is measured as profile_chain's (remat/profile.h).
///
/// Throws c10::Error, naming the stage, if `stages` is empty, a stage has no
/// forward, reads nothing, reads a stage that is not an earlier one (this
/// refuses cycles), or (other than the last) has an output no stage reads;
/// if `sample` is undefined; or warmup < 0 or repeats < 1.
planner::Graph profile_graph(
    const std::vector<GraphStage>& stages,
    const torch::Tensor& sample,
    const ProfileOptions& options = {});

// plan_within(graph, budget) and choose_plan on graphs (the optimal plan, or
// fixed stage modes, under a budget) are declared in remat/plan_choice.h.

/// Options of PlannedGraph.
struct PlannedGraphOptions {
  /// The per-op policy under which the plan's kForwardSelective ops run (as
  /// PlannedChainOptions::selective_policy). Default: empty.
  TORCH_ARG(Policy, selective_policy) = {};
  /// The graph the plan was solved on, kept for reports; auto_checkpoint
  /// sets it. Must have one stage per stage and the same inputs. Default:
  /// none.
  TORCH_ARG(std::optional<planner::Graph>, graph) = std::nullopt;
  /// The input shape the plan was made for; a training input of another
  /// shape is an error naming both (a forward that needs no gradient runs
  /// plainly at any shape). Empty: any shape. auto_checkpoint sets it to the
  /// sample's. Default: empty.
  TORCH_ARG(std::vector<int64_t>, input_shape) = {};
  /// Whether the sample the plan was profiled on required grad (only then
  /// does the profile measure the input's gradient). When false, a training
  /// input that requires grad is an error (its gradient would raise the
  /// peak above the plan's). auto_checkpoint sets it to the sample's.
  /// Default: none (any input).
  TORCH_ARG(std::optional<bool>, input_requires_grad) = std::nullopt;
  /// The budget self-correction re-solves, resolved on the graph it
  /// measures against. Default: none (the predicted peak of the plan given
  /// at construction).
  TORCH_ARG(std::optional<Budget>, budget) = std::nullopt;
  /// Profiling options of the profile self-correction takes when
  /// options.graph is not set (its selective_policy is replaced by the one
  /// above). Default: {}.
  TORCH_ARG(ProfileOptions, profile) = {};
  /// Solver options of self-correction's re-solves. Default: {}.
  TORCH_ARG(planner::SolverOptions, solver) = {};
  /// Self-correcting plan (see "Self-correction" at the top). Default: false
  /// (the plan never changes: reproducible schedules).
  TORCH_ARG(bool, self_correct) = false;
  /// Training steps whose stage times are measured before each comparison
  /// with the plan's times (>= 1). Default: 3.
  TORCH_ARG(int64_t, correction_steps) = 3;
  /// The switch happens only when another plan is predicted faster than the
  /// plan in force, on the measured times, by more than this fraction of
  /// the plan's time (>= 0). Default: 0.05.
  TORCH_ARG(double, correction_threshold) = 0.05;
};

/// A switch of a self-correcting graph (PlannedGraphImpl::corrections()).
using GraphPlanCorrection = BasicPlanCorrection<planner::Graph>;

/// A graph of stages executed according to a plan (see the top of this
/// header). Registers the stages' distinct modules as children ("stage0",
/// "stage3", ...: the first stage using each). Under no-grad (evaluation)
/// forward() runs the stages plainly.
///
/// Throws c10::Error (constructor) as profile_graph's checks of the stages,
/// if the plan is not valid for the graph's structure (naming
/// planner::simulate's error), has a kForwardSelective op without a policy,
/// options.graph does not match the stages, or correction_steps < 1 or
/// correction_threshold < 0 (or not finite).
///
/// Example:
// clang-format off
///   auto graph = remat::profile_graph(stages, sample);
///   remat::PlannedGraph net(stages, remat::plan_within(graph, remat::Budget::parse("50%")));
///   loss(net->forward(x)).backward();
///   // The same plan, re-solved on measured stage times while training:
///   remat::PlannedGraph tuned(stages, net->plan(), remat::PlannedGraphOptions()
///       .graph(graph).budget(remat::Budget::parse("50%")).self_correct(true));
// clang-format on
class PlannedGraphImpl : public torch::nn::Module {
 public:
  PlannedGraphImpl(
      std::vector<GraphStage> stages,
      planner::Plan plan,
      PlannedGraphOptions options = {});
  /// Runs the plan (training) or the stages plainly (no grad needed: any
  /// shape, the plan in force untouched). Throws c10::Error on a training
  /// input of a shape other than options.input_shape, or one that requires
  /// grad when options.input_requires_grad is false.
  torch::Tensor forward(const torch::Tensor& input);
  /// "remat::PlannedGraph(stages=9, ops=20, plan=R0 R1 ...)".
  void pretty_print(std::ostream& stream) const override;
  /// The plan in force (replaced by self-correction).
  const planner::Plan& plan() const {
    return plan_;
  }
  /// The switches self-correction made, oldest first (empty without
  /// options.self_correct).
  const std::vector<GraphPlanCorrection>& corrections() const;
  /// The graph with the stage times of the last measured window (nullopt
  /// before the first one, and without options.self_correct): what the
  /// plan in force is compared on.
  const std::optional<planner::Graph>& measured_graph() const;
  /// The stages, in order.
  const std::vector<GraphStage>& stages() const {
    return *stages_;
  }
  /// The graph plan() was solved on (options.graph).
  const std::optional<planner::Graph>& graph() const {
    return options_.graph();
  }

 private:
  /// Self-correction before a training forward on `input`; returns where
  /// the step's times go.
  std::shared_ptr<detail::StageTimes> self_correct(const torch::Tensor& input);

  std::shared_ptr<const std::vector<GraphStage>> stages_;
  planner::Plan plan_;
  PlannedGraphOptions options_;
  planner::Graph structure_;  // the stages' inputs with unit costs
  // Made on first use, and again for a plan that differs from its own.
  std::shared_ptr<const detail::PlanProgram> program_;
  // Self-correction's state, from the first training forward on.
  std::shared_ptr<detail::Correction<planner::Graph>> correction_;
};
TORCH_MODULE(PlannedGraph);

/// Profiles `stages` on `sample`, plans within `budget` (plan_within) and
/// returns the stages under that plan, expecting inputs of sample's shape
/// (PlannedGraphOptions: graph, input_shape, input_requires_grad and budget
/// set).
/// With options.selective_policy set, stages may also run selectively (as
/// for chains). Throws as profile_graph, plan_within and PlannedGraph.
///
/// Example:
// clang-format off
///   auto net = remat::auto_checkpoint(unet_stages, images, remat::Budget::parse("50%"));
// clang-format on
PlannedGraph auto_checkpoint(
    std::vector<GraphStage> stages,
    const torch::Tensor& sample,
    Budget budget,
    const AutoCheckpointOptions& options = {});

}  // namespace remat
