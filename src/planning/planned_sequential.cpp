// planned_sequential.cpp: PlannedSequential, a Sequential run by a plan: a
// planned chain (planned_run.h) over the Sequential's children.
#include "remat/planned_sequential.h"

#include <ostream>
#include <utility>

#include <c10/util/Exception.h>

#include "planned_run.h"

namespace remat {
namespace {
constexpr const char* kSequential = "remat::PlannedSequential";
}  // namespace

PlannedSequentialImpl::PlannedSequentialImpl(
    torch::nn::Sequential sequential_,
    planner::Plan plan,
    PlannedSequentialOptions options_)
    : sequential(std::move(sequential_)), options(std::move(options_)) {
  TORCH_CHECK(
      !sequential.is_empty() && sequential->size() > 0,
      kSequential,
      ": expected a non-empty Sequential, got ",
      sequential.is_empty() ? "a null one" : "one with no children");
  register_module("sequential", sequential);
  run_ = std::make_shared<detail::PlannedRun>();
  run_->stages =
      std::make_shared<const std::vector<Stage>>(stages_of(sequential));
  run_->plan = std::move(plan);
  detail::check_planned_run(kSequential, *run_, options);
}

void PlannedSequentialImpl::reset() {
  // The Sequential may have changed since (push_back): bind its children
  // again, so that the check is against them and forward() runs them. A
  // plan that does not fit them throws and leaves the module as it was.
  detail::PlannedRun bound;
  bound.stages =
      std::make_shared<const std::vector<Stage>>(stages_of(sequential));
  bound.plan = run_->plan;
  detail::check_planned_run(kSequential, bound, options);
  run_->stages = std::move(bound.stages);
  run_->program.reset();
}

std::shared_ptr<torch::nn::Module> PlannedSequentialImpl::clone(
    const c10::optional<torch::Device>& device) const {
  auto copy = torch::nn::Sequential(
      std::dynamic_pointer_cast<torch::nn::SequentialImpl>(
          sequential->clone(device)));
  auto result =
      std::make_shared<PlannedSequentialImpl>(copy, run_->plan, options);
  result->run_->plans_by_shape = run_->plans_by_shape;
  result->run_->chains_by_shape = run_->chains_by_shape;
  result->train(is_training());
  return result;
}

void PlannedSequentialImpl::pretty_print(std::ostream& stream) const {
  stream << "remat::PlannedSequential(stages=" << sequential->size() << ", "
         << detail::plan_summary(run_->plan) << ")";
}

torch::Tensor PlannedSequentialImpl::forward(const torch::Tensor& input) {
  TORCH_CHECK(
      sequential->size() == run_->stages->size(),
      kSequential,
      ": the Sequential has ",
      sequential->size(),
      " children, but the plan was bound to its ",
      run_->stages->size(),
      " children at construction; call reset() after changing it (which "
      "checks the plan against the new children)");
  return detail::planned_forward(kSequential, *run_, options, *this, input);
}

const planner::Plan& PlannedSequentialImpl::plan() const {
  return run_->plan;
}

const std::vector<PlanCorrection>& PlannedSequentialImpl::corrections() const {
  return detail::corrections_of(*run_);
}

const std::optional<planner::Chain>& PlannedSequentialImpl::measured_chain()
    const {
  return detail::measured_chain_of(*run_);
}

const std::map<std::vector<int64_t>, planner::Plan>&
PlannedSequentialImpl::plans_by_shape() const {
  return run_->plans_by_shape;
}

}  // namespace remat
