// step.cpp — one measured training step (remat/measure/step.h).
#include "remat/measure/step.h"

#include <sstream>
#include <stdexcept>

#include "remat/measure/timer.h"
#include "remat/memory_meter.h"

namespace remat::measure {
namespace {

// A loss that backward() can start from, or std::invalid_argument naming
// what forward_loss returned instead.
void check_loss(const torch::Tensor& loss) {
  std::ostringstream problem;
  if (!loss.defined()) {
    problem << "an undefined tensor";
  } else if (loss.numel() != 1) {
    problem << "a tensor of shape " << loss.sizes() << " (" << loss.numel()
            << " elements)";
  } else if (!loss.requires_grad()) {
    problem << "a scalar that does not require grad (nothing it was "
               "computed from requires grad, or it ran under NoGradGuard)";
  } else {
    return;
  }
  throw std::invalid_argument(
      "remat::measure::measure_step: forward_loss must return a scalar loss "
      "that requires grad; it returned " +
      problem.str());
}

}  // namespace

void zero_gradients(const std::vector<torch::Tensor>& parameters) {
  torch::NoGradGuard no_grad;
  for (torch::Tensor parameter : parameters) {
    if (!parameter.requires_grad()) {
      continue;
    }
    if (parameter.grad().defined()) {
      parameter.mutable_grad().detach_();
      parameter.mutable_grad().zero_();
    } else {
      parameter.mutable_grad() = torch::zeros_like(parameter);
    }
  }
}

int64_t StepMeasurement::activation_peak_bytes() const {
  return peak_delta_bytes - 2 * static_cast<int64_t>(loss.nbytes());
}

StepMeasurement measure_step(
    c10::Device device,
    const std::function<torch::Tensor()>& forward_loss,
    const std::function<void()>& after_backward) {
  StepMeasurement step;
  synchronize(device);
  MemoryMeter meter(device);
  const double cpu_start_ms = process_cpu_ms();
  Timer timer;
  step.loss = forward_loss();
  check_loss(step.loss);
  synchronize(device);
  step.forward_ms = timer.elapsed_ms();
  timer.restart();
  step.loss.backward();
  if (after_backward) {
    after_backward();
  }
  synchronize(device);
  step.backward_ms = timer.elapsed_ms();
  step.cpu_ms = process_cpu_ms() - cpu_start_ms;
  step.peak_delta_bytes = meter.peak_delta_bytes();
  return step;
}

}  // namespace remat::measure
