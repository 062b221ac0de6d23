// planned_sequential.cpp: PlannedSequential, a Sequential run by a plan.
//
// The module validates its plan against the Sequential once (simulate() on a
// unit-cost chain of the right length) and delegates execution to
// detail::run_plan (NOTE: [Plan execution] in plan_executor.cpp). Input-shape
// policy: see remat/planned_sequential.h and docs/planned_execution.md.
#include "remat/planned_sequential.h"

#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include "plan_executor.h"
#include "remat/planner/simulate.h"

namespace remat {
namespace {

std::string shape_string(c10::IntArrayRef shape) {
  std::ostringstream out;
  out << shape;
  return out.str();
}

}  // namespace

// ---- PlannedSequential -----------------------------------------------------

PlannedSequentialImpl::PlannedSequentialImpl(
    torch::nn::Sequential sequential_,
    planner::Plan plan,
    PlannedSequentialOptions options_)
    : sequential(std::move(sequential_)),
      options(std::move(options_)),
      plan_(std::move(plan)) {
  TORCH_CHECK(
      !sequential.is_empty() && sequential->size() > 0,
      "remat::PlannedSequential: expected a non-empty Sequential, got ",
      sequential.is_empty() ? "a null one" : "one with no children");
  register_module("sequential", sequential);
  reset();
  if (!options.input_shape().empty()) {
    plans_by_shape_.emplace(options.input_shape(), plan_);
  }
}

void PlannedSequentialImpl::reset() {
  const int64_t stages = static_cast<int64_t>(sequential->size());
  const planner::Simulation simulation =
      planner::simulate(detail::unit_chain(stages), plan_);
  TORCH_CHECK(
      simulation.valid,
      "remat::PlannedSequential: expected a valid plan for the Sequential's ",
      stages,
      " stages, got \"",
      plan_.to_string(),
      "\": ",
      simulation.error);
  TORCH_CHECK(
      options.on_shape_change() != ShapePolicy::kReplan ||
          options.budget().has_value(),
      "remat::PlannedSequential: expected options.budget to be set for "
      "ShapePolicy::kReplan, got none");
}

std::shared_ptr<torch::nn::Module> PlannedSequentialImpl::clone(
    const c10::optional<torch::Device>& device) const {
  auto copy = torch::nn::Sequential(
      std::dynamic_pointer_cast<torch::nn::SequentialImpl>(
          sequential->clone(device)));
  auto result = std::make_shared<PlannedSequentialImpl>(copy, plan_, options);
  result->plans_by_shape_ = plans_by_shape_;
  result->train(is_training());
  return result;
}

void PlannedSequentialImpl::pretty_print(std::ostream& stream) const {
  std::string text = plan_.to_string();
  constexpr size_t kMaxChars = 60;
  if (text.size() > kMaxChars) {
    text = text.substr(0, kMaxChars) + " ...";
  }
  stream << "remat::PlannedSequential(stages=" << sequential->size()
         << ", ops=" << plan_.ops.size() << ", plan=" << text << ")";
}

torch::Tensor PlannedSequentialImpl::forward(const torch::Tensor& input) {
  TORCH_CHECK(
      input.defined(),
      "remat::PlannedSequential::forward: expected a defined input tensor");
  if (!options.input_shape().empty() &&
      input.sizes() != c10::IntArrayRef(options.input_shape())) {
    TORCH_CHECK(
        options.on_shape_change() == ShapePolicy::kReplan,
        "remat::PlannedSequential::forward: expected an input of shape ",
        shape_string(options.input_shape()),
        " (the shape the plan was made for), got ",
        shape_string(input.sizes()),
        "; re-plan with auto_checkpoint or profile_chain on the new shape, "
        "or use ShapePolicy::kReplan");
    std::vector<int64_t> shape = input.sizes().vec();
    auto known = plans_by_shape_.find(shape);
    if (known == plans_by_shape_.end()) {
      planner::Chain chain =
          profile_chain(sequential, input, options.profile());
      known = plans_by_shape_
                  .emplace(
                      shape,
                      plan_within(chain, *options.budget(), options.solver()))
                  .first;
    }
    plan_ = known->second;
    options.input_shape(std::move(shape));
  }
  bool needs_grad = input.requires_grad();
  for (const auto& parameter : sequential->parameters()) {
    needs_grad |= parameter.requires_grad();
  }
  if (!c10::GradMode::is_enabled() || !needs_grad) {
    return sequential->forward(input);
  }
  return detail::run_plan(sequential, plan_, input);
}

}  // namespace remat
