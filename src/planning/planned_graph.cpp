// planned_graph.cpp: PlannedGraph, the executor of plans on graphs of stages,
// plan_within and auto_checkpoint for graphs.
//
// NOTE: [Graph plan execution]
// As the chain executor (NOTE: [Plan execution] in plan_executor.cpp), with
// the lifetimes of the graph memory model (NOTE: [The memory model on
// graphs] in src/planner/graph_simulate.cpp): a value computed without
// recording is held from its op until planner::released_values says the
// model drops it; a record holds a leaf per distinct input value (aliasing
// the value) and the stage output until the stage's backward. A stage's
// backward gives each leaf its gradient; the gradient of a value read by
// several stages is accumulated in place, in the order of their backwards
// (the last reader first, as autograd orders them in a plain backward), so
// gradients stay bitwise equal to the plain run's.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include "checkpoint/recompute_context.h"
#include "compat/compat.h"
#include "graph_stages.h"
#include "plan_executor.h"
#include "remat/checkpoint.h"
#include "remat/graph.h"
#include "remat/planner/simulate.h"
#include "remat/planner/solvers.h"

namespace remat {
namespace {

using planner::OpKind;

/// What a recorded forward of one stage leaves alive for its backward.
struct GraphRecord {
  std::vector<torch::Tensor> leaves;  // one per distinct input value
  torch::Tensor output;               // x_{i+1}, carrying the stage's graph
};

}  // namespace

namespace detail {
/// What every execution of one PlannedGraph shares.
struct GraphProgram {
  std::vector<detail::StageCall> calls;
  planner::Graph structure;
  planner::Plan plan;
  std::vector<std::vector<int64_t>> released;  // by op
  Policy selective_policy;
};
}  // namespace detail

namespace {
using detail::GraphProgram;

/// One execution of a plan on a graph: one per forward() call.
class GraphExecution : public detail::BackwardPhase {
 public:
  GraphExecution(
      std::shared_ptr<const GraphProgram> program, const torch::Tensor& input)
      : program_(std::move(program)),
        input_requires_grad_(input.requires_grad()) {
    const int64_t n = program_->structure.size();
    values_.resize(n + 1);
    grads_.resize(n + 1);
    records_.resize(n);
    first_forward_.resize(n);
    values_[0] = input.detach();
  }
  GraphExecution(const GraphExecution&) = delete;
  GraphExecution& operator=(const GraphExecution&) = delete;

  /// Runs the ops before the first backward; returns the graph output.
  torch::Tensor run_forward_phase() {
    const auto& ops = program_->plan.ops;
    while (next_op_ < ops.size() && ops[next_op_].kind != OpKind::kBackward) {
      run_op(next_op_++);
    }
    return records_.back().output;
  }

  torch::Tensor run_backward_phase(torch::Tensor grad_output) override {
    grads_.back() = std::move(grad_output);
    while (next_op_ < program_->plan.ops.size()) {
      run_op(next_op_++);
    }
    return std::move(grads_[0]);
  }

 private:
  void run_op(size_t k) {
    const planner::Op& op = program_->plan.ops[k];
    const int64_t i = op.stage;
    if (op.kind == OpKind::kBackward) {
      run_backward(i);
    } else {
      std::vector<torch::Tensor> inputs;
      for (int64_t v : program_->structure.input_values(i)) {
        TORCH_INTERNAL_ASSERT(values_[v].defined(), "x_", v, " not held");
        inputs.push_back(values_[v]);
      }
      if (op.kind == OpKind::kForwardNoSave ||
          op.kind == OpKind::kForwardCheckpoint) {
        values_[i + 1] = forward_stage(i, inputs, op.kind);
      } else {
        GraphRecord record;
        for (size_t k = 0; k < inputs.size(); ++k) {
          const int64_t v = program_->structure.input_values(i)[k];
          torch::Tensor leaf = inputs[k].detach();
          if (leaf.is_floating_point() && (v > 0 || input_requires_grad_)) {
            leaf.requires_grad_(true);
          }
          record.leaves.push_back(std::move(leaf));
        }
        record.output = forward_stage(i, record.leaves, op.kind);
        values_[i + 1] = record.output.detach();
        records_[i] = std::move(record);
      }
    }
    for (int64_t v : program_->released[k]) {
      values_[v] = torch::Tensor();
    }
  }

  void run_backward(int64_t i) {
    GraphRecord record = std::move(records_[i]);
    records_[i] = GraphRecord{};
    // x_{i+1} lives in the record: let autograd free it.
    values_[i + 1] = torch::Tensor();
    torch::Tensor grad_output = std::move(grads_[i + 1]);
    if (grad_output.defined() && record.output.requires_grad()) {
      detail::run_stage_backward(
          std::move(record.output), std::move(grad_output));
    }
    record.output = torch::Tensor();
    const std::vector<int64_t>& values = program_->structure.input_values(i);
    for (size_t k = 0; k < values.size(); ++k) {
      torch::Tensor& leaf = record.leaves[k];
      if (!leaf.requires_grad() || !leaf.grad().defined()) {
        continue;
      }
      torch::Tensor grad = leaf.grad();
      leaf = torch::Tensor();
      torch::Tensor& total = grads_[values[k]];
      if (total.defined()) {
        total.add_(grad);
      } else {
        total = std::move(grad);
      }
    }
  }

  /// Runs stage i; replays its first forward's RNG state and restores its
  /// buffers if it ran before (NOTE: [Recompute and RNG]).
  torch::Tensor forward_stage(
      int64_t i, const std::vector<torch::Tensor>& inputs, OpKind kind) {
    const detail::StageCall& call = program_->calls[i];
    if (!first_forward_[i]) {
      first_forward_[i].emplace(
          torch::autograd::variable_list(inputs.begin(), inputs.end()),
          /*preserve_rng=*/true);
      const detail::BufferWrites writes({call.module});
      torch::Tensor output = call_stage(i, inputs, kind);
      first_forward_[i]->note_buffer_writes(writes);
      return output;
    }
    detail::RecomputeGuard guard(*first_forward_[i], {call.module});
    return call_stage(i, inputs, kind);
  }

  torch::Tensor call_stage(
      int64_t i, const std::vector<torch::Tensor>& inputs, OpKind kind) {
    const detail::StageCall& call = program_->calls[i];
    if (kind == OpKind::kForwardRecord) {
      return detail::record_stage(call, i, inputs, Policy{});
    }
    if (kind == OpKind::kForwardSelective) {
      return detail::record_stage(call, i, inputs, program_->selective_policy);
    }
    c10::NoGradGuard no_grad;
    detail::UncachedAutocast uncached;  // a cast cached here has no history
    return detail::stage_output(call.forward(inputs), i);
  }

  const std::shared_ptr<const GraphProgram> program_;
  const bool input_requires_grad_;
  size_t next_op_ = 0;
  std::vector<torch::Tensor> values_;  // x_v while held
  std::vector<torch::Tensor> grads_;   // g_v while held
  std::vector<GraphRecord> records_;   // R_i while recorded
  std::vector<std::optional<detail::RecomputeContext>> first_forward_;
};

bool has_selective_op(const planner::Plan& plan) {
  return std::any_of(
      plan.ops.begin(), plan.ops.end(), [](const planner::Op& op) {
        return op.kind == OpKind::kForwardSelective;
      });
}

}  // namespace

PlannedGraphImpl::PlannedGraphImpl(
    std::vector<GraphStage> stages,
    planner::Plan plan,
    PlannedGraphOptions options)
    : stages_(
          std::make_shared<const std::vector<GraphStage>>(std::move(stages))),
      plan_(std::move(plan)),
      options_(std::move(options)),
      structure_(detail::graph_structure("remat::PlannedGraph", *stages_)) {
  const planner::Simulation check = planner::simulate(structure_, plan_);
  TORCH_CHECK(
      check.valid,
      "remat::PlannedGraph: expected a valid plan for the ",
      structure_.size(),
      " stages, got '",
      plan_.to_string().substr(0, 80),
      "': ",
      check.error);
  TORCH_CHECK(
      !has_selective_op(plan_) ||
          static_cast<bool>(options_.selective_policy()),
      "remat::PlannedGraph: the plan runs stages selectively (S ops), so it "
      "needs options.selective_policy, the policy the graph was profiled "
      "with");
  if (options_.graph()) {
    const planner::Graph& graph = *options_.graph();
    bool same = graph.size() == structure_.size();
    for (int64_t i = 0; same && i < graph.size(); ++i) {
      same = graph.inputs(i) == structure_.inputs(i);
    }
    TORCH_CHECK(
        same,
        "remat::PlannedGraph: options.graph has ",
        graph.size(),
        " stages and must have the stages' inputs; the stages are ",
        structure_.size());
  }
  for (size_t i = 0; i < stages_->size(); ++i) {
    const auto& module = (*stages_)[i].module;
    if (module && std::find_if(
                      stages_->begin(),
                      stages_->begin() + static_cast<std::ptrdiff_t>(i),
                      [&](const GraphStage& s) {
                        return s.module == module;
                      }) == stages_->begin() + static_cast<std::ptrdiff_t>(i)) {
      register_module("stage" + std::to_string(i), module);
    }
  }
}

torch::Tensor PlannedGraphImpl::forward(const torch::Tensor& input) {
  if (!options_.input_shape().empty()) {
    TORCH_CHECK(
        input.sizes().vec() == options_.input_shape(),
        "remat::PlannedGraph: the plan was made for inputs of shape ",
        c10::IntArrayRef(options_.input_shape()),
        ", got ",
        input.sizes());
  }
  bool needs_grad = input.requires_grad();
  for (const torch::Tensor& parameter : parameters()) {
    needs_grad = needs_grad || parameter.requires_grad();
  }
  if (!c10::GradMode::is_enabled() || !needs_grad) {
    return run_graph(*stages_, input);
  }
  if (!program_) {
    auto program = std::make_shared<GraphProgram>(GraphProgram{
        {},
        structure_,
        plan_,
        planner::released_values(structure_, plan_),
        options_.selective_policy()});
    for (int64_t i = 0; i < structure_.size(); ++i) {
      program->calls.push_back(detail::call_of((*stages_)[i], structure_, i));
    }
    program_ = std::move(program);
  }
  auto execution = std::make_shared<GraphExecution>(program_, input);
  torch::Tensor inner_output = execution->run_forward_phase();
  return detail::attach_backward_phase(
      std::move(inner_output),
      input,
      std::move(execution),
      "remat::PlannedGraph");
}

void PlannedGraphImpl::pretty_print(std::ostream& stream) const {
  std::string text = plan_.to_string();
  if (text.size() > 60) {
    text = text.substr(0, 57) + "...";
  }
  stream << "remat::PlannedGraph(stages=" << stages_->size()
         << ", ops=" << plan_.ops.size() << ", plan=" << text << ")";
}

planner::Plan plan_within(
    const planner::Graph& graph,
    const Budget& budget,
    const planner::SolverOptions& options) {
  const int64_t budget_bytes = budget.resolve_bytes(graph);
  std::optional<planner::Plan> plan =
      planner::solve_optimal(graph, budget_bytes, options);
  if (!plan) {  // exactly below the minimum: name it
    TORCH_CHECK(
        false,
        "remat::plan_within: expected a budget of at least ",
        planner::min_feasible_budget_bytes(graph),
        " bytes (the minimum feasible for this graph and input), got ",
        budget_bytes,
        " bytes (",
        budget.to_string(),
        ")");
  }
  return *plan;
}

PlannedGraph auto_checkpoint(
    std::vector<GraphStage> stages,
    const torch::Tensor& sample,
    Budget budget,
    const AutoCheckpointOptions& options) {
  ProfileOptions profile = options.profile();
  profile.selective_policy(options.selective_policy());
  planner::Graph graph = profile_graph(stages, sample, profile);
  planner::Plan plan = plan_within(graph, budget, options.solver());
  return PlannedGraph(
      std::move(stages),
      std::move(plan),
      PlannedGraphOptions()
          .selective_policy(options.selective_policy())
          .graph(std::move(graph))
          .input_shape(sample.sizes().vec()));
}

}  // namespace remat
