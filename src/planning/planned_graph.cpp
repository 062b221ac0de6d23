// planned_graph.cpp: PlannedGraph (a graph of stages run by the plan
// executor, NOTE: [Plan execution] in plan_executor.cpp) and auto_checkpoint
// for graphs (plan_within: plan_choice.cpp). Self-correction is the
// chain's (self_correct.h) on a planner::Graph.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include "graph_stages.h"
#include "plan_executor.h"
#include "remat/graph.h"
#include "remat/planner/simulate.h"
#include "remat/planner/solvers.h"
#include "self_correct.h"

namespace remat {
namespace {

using planner::OpKind;

constexpr const char* kGraph = "remat::PlannedGraph";

bool has_selective_op(const planner::Plan& plan) {
  return std::any_of(
      plan.ops.begin(), plan.ops.end(), [](const planner::Op& op) {
        return op.kind == OpKind::kForwardSelective;
      });
}

/// Whether self-correction has options.graph for the input: the graph of
/// its shape (with options.input_shape, the only shape accepted; without,
/// the first training input's).
bool given_graph_fits(const PlannedGraphOptions& options, bool first) {
  return options.graph() && (!options.input_shape().empty() || first);
}

/// The graph self-correction measures against for `input`: options.graph
/// when it fits, else a profile of it made inside this training step, whose
/// cold writes are measured later, within the budget (self_correct).
planner::Graph correction_graph(
    const std::vector<GraphStage>& stages,
    const PlannedGraphOptions& options,
    bool first,
    const torch::Tensor& input) {
  planner::Graph graph = [&] {
    if (given_graph_fits(options, first)) {
      return *options.graph();
    }
    ProfileOptions profile = options.profile();
    profile.selective_policy(options.selective_policy());
    profile.cold_write_max_bytes(0);
    return profile_graph(stages, input, profile);
  }();
  return options.selective_policy() ? graph
                                    : detail::without_selective_costs(graph);
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
      structure_(detail::graph_structure(kGraph, *stages_)) {
  detail::check_correction_options(
      kGraph, options_.correction_steps(), options_.correction_threshold());
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
  TORCH_CHECK(
      input.defined(),
      "remat::PlannedGraph::forward: expected a defined input tensor");
  // A forward that needs no gradient (an evaluation) needs no plan: it runs
  // the stages plainly at any shape, as PlannedChain's does.
  const bool needs_grad =
      input.requires_grad() || detail::any_parameter_requires_grad(*this);
  if (!c10::GradMode::is_enabled() || !needs_grad) {
    return run_graph(*stages_, input);
  }
  detail::check_input_gradient_profiled(
      "remat::PlannedGraph", input, options_.input_requires_grad());
  if (!options_.input_shape().empty()) {
    TORCH_CHECK(
        input.sizes().vec() == options_.input_shape(),
        "remat::PlannedGraph: the plan was made for inputs of shape ",
        c10::IntArrayRef(options_.input_shape()),
        ", got ",
        input.sizes());
  }
  std::shared_ptr<detail::StageTimes> times;
  if (options_.self_correct()) {
    times = self_correct(input);
  }
  // Made again whenever the plan in force is not the one it was made for
  // (self-correction may have switched plans), as PlannedRun does for chains.
  if (!program_ || !(program_->plan == plan_)) {
    std::vector<detail::StageCall> calls;
    for (int64_t i = 0; i < structure_.size(); ++i) {
      calls.push_back(detail::call_of((*stages_)[i], structure_, i));
    }
    program_ = detail::make_program(std::move(calls), structure_, plan_);
  }
  return detail::run_program(
      program_, input, kGraph, options_.selective_policy(), std::move(times));
}

std::shared_ptr<detail::StageTimes> PlannedGraphImpl::self_correct(
    const torch::Tensor& input) {
  std::vector<int64_t> shape = input.sizes().vec();
  if (!correction_ || correction_->shape != shape) {
    const bool profiled = !given_graph_fits(options_, !correction_);
    planner::Graph graph =
        correction_graph(*stages_, options_, !correction_, input);
    const int64_t budget_bytes =
        options_.budget() ? options_.budget()->resolve_bytes(graph)
                          : planner::simulate(graph, plan_).peak_bytes;
    if (profiled) {
      graph = detail::with_cold_writes_within(
          std::move(graph),
          budget_bytes,
          options_.profile().cold_write_max_bytes(),
          input.device());
    }
    std::vector<GraphPlanCorrection> log;
    if (correction_) {
      log = std::move(correction_->log);
    }
    correction_ = std::make_shared<detail::Correction<planner::Graph>>(
        detail::start_correction(
            std::move(shape), std::move(graph), budget_bytes, std::move(log)));
  }
  detail::correct_before_step(
      *correction_,
      plan_,
      detail::CorrectionRule{
          options_.correction_steps(),
          options_.correction_threshold(),
          options_.solver()});
  return correction_->times;
}

const std::vector<GraphPlanCorrection>& PlannedGraphImpl::corrections() const {
  static const std::vector<GraphPlanCorrection> kNone;
  return correction_ ? correction_->log : kNone;
}

const std::optional<planner::Graph>& PlannedGraphImpl::measured_graph() const {
  static const std::optional<planner::Graph> kNone;
  return correction_ ? correction_->measured : kNone;
}

void PlannedGraphImpl::pretty_print(std::ostream& stream) const {
  std::string text = plan_.to_string();
  if (text.size() > 60) {
    text = text.substr(0, 57) + "...";
  }
  stream << "remat::PlannedGraph(stages=" << stages_->size()
         << ", ops=" << plan_.ops.size() << ", plan=" << text << ")";
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
          .input_shape(sample.sizes().vec())
          .input_requires_grad(sample.requires_grad())
          .budget(budget)
          .profile(options.profile())
          .solver(options.solver()));
}

}  // namespace remat
