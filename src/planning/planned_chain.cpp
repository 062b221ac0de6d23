// planned_chain.cpp: PlannedChain, a chain of stages run by a plan, and what
// it shares with PlannedSequential (planned_run.h).
//
// A planned chain validates its plan once (simulate() on a unit-cost chain of
// the right length), binds it to its stages once (detail::chain_program, made
// again only when the plan in force changes) and delegates execution to
// detail::run_program (NOTE: [Plan execution] in plan_executor.cpp).
// Input-shape policy: see
// remat/planned_chain.h and docs/planned_execution.md.
#include "remat/planned_chain.h"

#include <ostream>
#include <sstream>
#include <string>
#include <utility>

#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include "plan_executor.h"
#include "planned_run.h"
#include "remat/planner/simulate.h"

namespace remat {
namespace detail {
namespace {

std::string shape_string(c10::IntArrayRef shape) {
  std::ostringstream out;
  out << shape;
  return out.str();
}

/// Whether self-correction has options.chain for `input` (the chain of its
/// shape) or must profile it.
bool given_chain_fits(
    const PlannedRun& run,
    const PlannedChainOptions& options,
    const torch::Tensor& input) {
  return options.chain() &&
         (options.input_shape().empty()
              ? !run.correction.has_value()
              : c10::IntArrayRef(options.input_shape()) == input.sizes());
}

/// The chain self-correction measures against for `input`: options.chain
/// when it fits, else a profile of it made inside this training step, whose
/// cold writes are measured later, within the budget (self_correct).
planner::Chain correction_chain(
    const PlannedRun& run,
    const PlannedChainOptions& options,
    const torch::Tensor& input) {
  planner::Chain chain = [&] {
    if (given_chain_fits(run, options, input)) {
      return *options.chain();
    }
    ProfileOptions profile = options.profile();
    profile.selective_policy(options.selective_policy());
    profile.cold_write_max_bytes(0);
    return profile_chain(*run.stages, input, profile);
  }();
  return options.selective_policy() ? chain : without_selective_costs(chain);
}

/// Self-correction before a training forward (remat/planned_chain.h; the
/// decision: correct_before_step); returns where this step's times go.
std::shared_ptr<StageTimes> self_correct(
    PlannedRun& run, PlannedChainOptions& options, const torch::Tensor& input) {
  std::vector<int64_t> shape = input.sizes().vec();
  if (!run.correction || run.correction->shape != shape) {
    const bool profiled = !given_chain_fits(run, options, input);
    planner::Chain chain = correction_chain(run, options, input);
    const int64_t budget_bytes =
        options.budget() ? options.budget()->resolve_bytes(chain)
                         : planner::simulate(chain, run.plan).peak_bytes;
    if (profiled) {
      chain = detail::with_cold_writes_within(
          std::move(chain),
          budget_bytes,
          options.profile().cold_write_max_bytes(),
          input.device());
    }
    std::vector<PlanCorrection> log;
    if (run.correction) {
      log = std::move(run.correction->log);
    }
    run.correction = start_correction(
        std::move(shape), std::move(chain), budget_bytes, std::move(log));
  }
  const bool switched = correct_before_step(
      *run.correction,
      run.plan,
      CorrectionRule{
          options.correction_steps(),
          options.correction_threshold(),
          options.solver()});
  if (switched && !options.input_shape().empty()) {
    run.plans_by_shape[options.input_shape()] = run.plan;
  }
  return run.correction->times;
}

}  // namespace

const std::vector<PlanCorrection>& corrections_of(const PlannedRun& run) {
  static const std::vector<PlanCorrection> kNone;
  return run.correction ? run.correction->log : kNone;
}

const std::optional<planner::Chain>& measured_chain_of(const PlannedRun& run) {
  static const std::optional<planner::Chain> kNone;
  return run.correction ? run.correction->measured : kNone;
}

std::string plan_summary(const planner::Plan& plan) {
  std::string text = plan.to_string();
  constexpr size_t kMaxChars = 60;
  if (text.size() > kMaxChars) {
    text = text.substr(0, kMaxChars) + " ...";
  }
  return "ops=" + std::to_string(plan.ops.size()) + ", plan=" + text;
}

void check_planned_run(
    const char* who, PlannedRun& run, const PlannedChainOptions& options) {
  const int64_t stages = static_cast<int64_t>(run.stages->size());
  const planner::Simulation simulation =
      planner::simulate(unit_chain(stages), run.plan);
  TORCH_CHECK(
      simulation.valid,
      who,
      ": expected a valid plan for the ",
      stages,
      " stages, got \"",
      run.plan.to_string(),
      "\": ",
      simulation.error);
  for (const planner::Op& op : run.plan.ops) {
    TORCH_CHECK(
        op.kind != planner::OpKind::kForwardSelective ||
            static_cast<bool>(options.selective_policy()),
        who,
        ": the plan runs stage ",
        op.stage,
        " selectively (S",
        op.stage,
        ") but options.selective_policy is empty; pass the policy the "
        "chain was profiled with");
  }
  check_correction_options(
      who, options.correction_steps(), options.correction_threshold());
  TORCH_CHECK(
      options.on_shape_change() != ShapePolicy::kReplan ||
          options.budget().has_value(),
      who,
      ": expected options.budget to be set for ShapePolicy::kReplan, "
      "got none");
  if (options.chain()) {
    TORCH_CHECK(
        options.chain()->size() == stages,
        who,
        ": expected options.chain to have one stage per stage (",
        stages,
        "), got ",
        options.chain()->size());
  }
  if (!options.input_shape().empty()) {
    run.plans_by_shape.emplace(options.input_shape(), run.plan);
    if (options.chain()) {
      run.chains_by_shape.emplace(options.input_shape(), *options.chain());
    }
  }
}

torch::Tensor planned_forward(
    const char* who,
    PlannedRun& run,
    PlannedChainOptions& options,
    const torch::nn::Module& owner,
    const torch::Tensor& input) {
  TORCH_CHECK(
      input.defined(), who, "::forward: expected a defined input tensor");
  // A forward that needs no gradient runs the stages plainly, whatever the
  // shape: it needs no plan, so it neither re-plans nor touches the module's
  // plan state. An evaluation (model->eval() under torch::NoGradGuard, a
  // last batch of another size) must not profile the model, which writes the
  // parameters' .grad and the RNG state while it runs: under another thread's
  // training step those writes change its gradients.
  const bool needs_grad =
      input.requires_grad() || any_parameter_requires_grad(owner);
  if (!c10::GradMode::is_enabled() || !needs_grad) {
    return run_stages(*run.stages, input);
  }
  check_input_gradient_profiled(who, input, options.input_requires_grad());
  if (!options.input_shape().empty() &&
      input.sizes() != c10::IntArrayRef(options.input_shape())) {
    TORCH_CHECK(
        options.on_shape_change() == ShapePolicy::kReplan,
        who,
        "::forward: expected an input of shape ",
        shape_string(options.input_shape()),
        " (the shape the plan was made for), got ",
        shape_string(input.sizes()),
        "; re-plan with auto_checkpoint or profile_chain on the new shape, "
        "or use ShapePolicy::kReplan");
    // options is a public member: checked here as at construction.
    TORCH_CHECK(
        options.budget().has_value(),
        who,
        "::forward: expected options.budget to be set for "
        "ShapePolicy::kReplan, got none");
    std::vector<int64_t> shape = input.sizes().vec();
    auto known = run.plans_by_shape.find(shape);
    if (known == run.plans_by_shape.end()) {
      ProfileOptions profile = options.profile();
      profile.selective_policy(options.selective_policy());
      // Profiled as the first sample was: with an input gradient if it
      // had one (a later input of this shape may need it).
      const bool input_grad =
          options.input_requires_grad().value_or(input.requires_grad());
      planner::Chain chain = profile_chain(
          *run.stages,
          input_grad == input.requires_grad()
              ? input
              : input.detach().requires_grad_(input_grad),
          profile);
      known = run.plans_by_shape
                  .emplace(
                      shape,
                      plan_within(chain, *options.budget(), options.solver()))
                  .first;
      run.chains_by_shape.emplace(shape, std::move(chain));
    }
    run.plan = known->second;
    const auto chain = run.chains_by_shape.find(shape);
    options.chain(
        chain == run.chains_by_shape.end()
            ? std::nullopt
            : std::optional<planner::Chain>(chain->second));
    options.input_shape(std::move(shape));
  }
  std::shared_ptr<StageTimes> times;
  if (options.self_correct()) {
    // As at construction: options is a public member, set at any time.
    check_correction_options(
        who, options.correction_steps(), options.correction_threshold());
    times = self_correct(run, options, input);
  }
  if (!run.program || !(run.program->plan == run.plan)) {
    run.program = chain_program(*run.stages, run.plan);
  }
  return run_program(
      run.program, input, who, options.selective_policy(), std::move(times));
}

}  // namespace detail

// ---- PlannedChain ----------------------------------------------------------

namespace {
constexpr const char* kChain = "remat::PlannedChain";
}  // namespace

PlannedChainImpl::PlannedChainImpl(
    std::vector<Stage> stages, planner::Plan plan, PlannedChainOptions options_)
    : options(std::move(options_)) {
  detail::check_stages(kChain, stages);
  for (size_t i = 0; i < stages.size(); ++i) {
    const auto& module = stages[i].module;
    bool seen = false;
    for (size_t j = 0; j < i; ++j) {
      seen |= stages[j].module == module;
    }
    if (module && !seen) {
      register_module("stage" + std::to_string(i), module);
    }
  }
  run_ = std::make_shared<detail::PlannedRun>();
  run_->stages = std::make_shared<const std::vector<Stage>>(std::move(stages));
  run_->plan = std::move(plan);
  detail::check_planned_run(kChain, *run_, options);
}

torch::Tensor PlannedChainImpl::forward(const torch::Tensor& input) {
  return detail::planned_forward(kChain, *run_, options, *this, input);
}

void PlannedChainImpl::pretty_print(std::ostream& stream) const {
  stream << "remat::PlannedChain(stages=" << run_->stages->size() << ", "
         << detail::plan_summary(run_->plan) << ")";
}

const planner::Plan& PlannedChainImpl::plan() const {
  return run_->plan;
}

const std::vector<PlanCorrection>& PlannedChainImpl::corrections() const {
  return detail::corrections_of(*run_);
}

const std::optional<planner::Chain>& PlannedChainImpl::measured_chain() const {
  return detail::measured_chain_of(*run_);
}

const std::map<std::vector<int64_t>, planner::Plan>&
PlannedChainImpl::plans_by_shape() const {
  return run_->plans_by_shape;
}

const std::vector<Stage>& PlannedChainImpl::stages() const {
  return *run_->stages;
}

}  // namespace remat
