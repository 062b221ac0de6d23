// plan_executor.h (private): executes a planner::Plan over a chain of stages
// with LibTorch autograd. See NOTE: [Plan execution] in plan_executor.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <torch/types.h>

#include "remat/planner/chain.h"
#include "remat/planner/graph.h"
#include "remat/planner/plan.h"
#include "remat/policy.h"
#include "remat/stage.h"

namespace remat::detail {

class StageTimes;  // self_correct.h

/// A chain of `stages` stages with unit costs: simulate() on it checks a
/// plan's structure (stage range, order, completeness) for that many stages.
planner::Chain unit_chain(int64_t stages);

/// The cost of every stage of unit_chain() and of the structures the
/// executors check plans on: 1 ms, 1 byte, with a selective way.
planner::StageCost unit_cost();

/// The backward of one recorded stage, as the executor runs it (and as
/// profile_chain measures it): `output` (x_{i+1}, carrying the stage's graph)
/// receives `grad_output` (g_{i+1}); leaves accumulate their gradients in
/// .grad. Both arguments are consumed: when the caller holds no other
/// reference to them, autograd frees each as soon as the node that uses it
/// has run, as in a plain backward, not when the stage's backward ends.
/// `carried` are gradients that later stages' backwards already produced for
/// some of the stage's leaves (leaf, gradient; consumed too): each reaches
/// its leaf before the stage's own contributions, so the leaf's .grad is the
/// whole sum added in the order a plain backward adds it (the later readers'
/// part first, then the stage's uses one by one).
/// REQUIRES: output.requires_grad(); grad_output defined, of output's shape;
/// each carried leaf requires grad and its gradient has its shape.
void run_stage_backward(
    torch::Tensor output,
    torch::Tensor grad_output,
    std::vector<std::pair<torch::Tensor, torch::Tensor>> carried = {});

/// A stage of any number of inputs, as the executors and the profiler call
/// it: a chain Stage (one input) or a GraphStage (its distinct input values,
/// mapped to its arguments).
struct StageCall {
  std::function<torch::Tensor(const std::vector<torch::Tensor>&)> forward;
  std::shared_ptr<torch::nn::Module> module;
};

/// `stage` as a StageCall of one input.
StageCall call_of(const Stage& stage);

/// The forward of stage `index` on `inputs`, its distinct input values
/// (x_v for v in `values`: x_0 the model's input, x_{v} the output of stage
/// v - 1), under the caller's grad mode, as the executors run it and the
/// profiler measures it; returns stage_output() of the result. Throws
/// c10::Error naming the stage and the value if the forward modified one of
/// its inputs in place (NOTE: [A stage leaves its inputs unchanged]); an
/// error the forward throws as c10::Error gets the stage's index as context.
torch::Tensor forward_of_stage(
    const StageCall& call,
    int64_t index,
    const std::vector<torch::Tensor>& inputs,
    const std::vector<int64_t>& values);

/// A recorded forward of `call` on `leaves` (grad mode on), as the executors
/// run it and the profiler measures it, checked as forward_of_stage(). With
/// an empty `policy` (kForwardRecord) autograd records everything the
/// backward needs; else (kForwardSelective) the stage runs as a
/// non-reentrant checkpoint region under `policy` that preserves the stage
/// module's buffers, so only what the policy keeps is recorded and the
/// backward recomputes the rest.
torch::Tensor record_stage(
    const StageCall& call,
    int64_t index,
    const std::vector<torch::Tensor>& leaves,
    const std::vector<int64_t>& values,
    const Policy& policy);

/// What the executor and profile_chain take as the output of stage `index`:
/// `output` itself, or a compact copy of it if it is a view that keeps a
/// larger storage alive (NOTE: [A stage output that is a view]). Throws
/// c10::Error, naming the stage, if `output` is undefined.
torch::Tensor stage_output(torch::Tensor output, int64_t index);

/// A plan bound to the stages it runs: what every execution of it shares.
struct PlanProgram {
  std::vector<StageCall> calls;  ///< the stages
  planner::Graph structure;      ///< what they read (unit costs)
  planner::Plan plan;            ///< valid for `structure`
  /// planner::released_values(structure, plan): what each op lets go.
  std::vector<std::vector<int64_t>> released;
  /// Per stage: whether the plan runs its forward more than once (only then
  /// is its first forward's RNG and autocast state kept for a replay).
  std::vector<bool> replayed;
  /// linked_values(structure, plan).
  std::vector<int64_t> linked_value;
};

/// Per op of `plan`: for a kForwardRecord op of stage r, the input value
/// x_{p+1} it may take with its producer p's graph (NOTE: [Linked stages] in
/// plan_executor.cpp), or -1. A value is linked when r is p's only reader,
/// both stages' latest forwards are records (p's first), and p's backward
/// directly follows r's in the plan.
/// REQUIRES: `plan` valid for `structure`.
std::vector<int64_t> linked_values(
    const planner::Graph& structure, const planner::Plan& plan);

/// A program of `calls` under `plan`. Throws std::invalid_argument (from
/// planner::released_values) unless the plan is valid for `structure`.
/// REQUIRES: one call per stage of `structure`.
std::shared_ptr<const PlanProgram> make_program(
    std::vector<StageCall> calls, planner::Graph structure, planner::Plan plan);

/// The program of a chain of `stages` under `plan`.
/// REQUIRES: `plan` valid for stages.size() stages.
std::shared_ptr<const PlanProgram> chain_program(
    const std::vector<Stage>& stages, const planner::Plan& plan);

/// Runs the forward phase of `program` (every op before the first
/// backward) on `input` (the graph input x_0) and returns the last stage's
/// output, whose grad_fn (named `who` + "Backward", with `input`'s edges)
/// runs the rest of the plan in one step (NOTE: [Plan execution]).
/// kForwardSelective ops run under `selective_policy`. With `times`, every
/// op is timed into it (the device synchronized around each) and
/// step_done() is called when the backward phase ends.
/// REQUIRES: grad mode on; `selective_policy` non-empty if the plan has
/// kForwardSelective ops (checked by the caller). Throws c10::Error, naming
/// `who`, unless the output is floating point or complex.
torch::Tensor run_program(
    std::shared_ptr<const PlanProgram> program,
    const torch::Tensor& input,
    const char* who,
    const Policy& selective_policy,
    std::shared_ptr<StageTimes> times = nullptr);

/// The structure of a chain of `stages` stages, as a graph with unit costs.
planner::Graph chain_structure(int64_t stages);

/// Throws c10::Error, naming `who`, if `stages` is empty or a stage has no
/// forward.
void check_stages(const char* who, const std::vector<Stage>& stages);

/// The distinct non-null modules of `stages`, in first-use order.
std::vector<std::shared_ptr<torch::nn::Module>> modules_of(
    const std::vector<Stage>& stages);

/// Whether a parameter of `module` or of a module below it requires grad;
/// stops at the first (builds no names, unlike Module::parameters()).
bool any_parameter_requires_grad(const torch::nn::Module& module);

/// Throws c10::Error, naming `who`, if `input` requires grad while
/// `profiled_input_grad` is false: the profile behind the plan was taken on a
/// sample that did not, so it measured no input gradient (nor the first
/// stages' working set for it) and the peak could exceed the plan's.
void check_input_gradient_profiled(
    const char* who,
    const torch::Tensor& input,
    const std::optional<bool>& profiled_input_grad);

/// Runs `stages` one after the other on `input` (the plain chain forward).
torch::Tensor run_stages(
    const std::vector<Stage>& stages, const torch::Tensor& input);

}  // namespace remat::detail
