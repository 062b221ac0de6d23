// remat/measure/step.h — one measured training step: its activation peak in
// bytes and its forward and backward times, as remat measures every step (the
// tool's trainer, fit_batch/fit_size, the benchmarks' Runner).
//
// CONTRACT (stable):
//  - zero_gradients(parameters) allocates the gradient of every parameter
//    that requires grad (zeros) or zeroes it in place. Call it before a
//    measured step: gradients allocated during backward would otherwise
//    count as activations, and a training loop holds them anyway.
//  - measure_step(device, forward_loss) synchronizes `device`, starts a
//    MemoryMeter and a timer, calls forward_loss() (the forward and the loss:
//    anything the caller does not keep past it, such as the model's output,
//    is freed when it returns), synchronizes, calls backward() on the loss
//    it returned, then `after_backward` when given (a gradient
//    synchronization that belongs to the backward), synchronizes again.
//  - Activation peak = the meter's peak_delta_bytes() (peak live bytes of
//    forward + loss + backward, less what was live before) minus the loss
//    value and the gradient that seeds backward: both stay alive to the end
//    of backward, held by the caller and by autograd, past where remat's
//    memory model frees them, and no plan can change them. Add the input's
//    bytes to compare with planner::simulate(), which counts the input.
//  - On the CPU the meter counts through remat's tracking allocator, which
//    MemoryMeter installs if it is not yet (remat/memory_meter.h).
//  - Errors: forward_loss returning an undefined tensor, a tensor of more
//    than one element or one that does not require grad throws
//    std::invalid_argument naming what it got; nothing is measured.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <c10/core/Device.h>
#include <torch/torch.h>

namespace remat::measure {

/// Allocates (zeros) or zeroes in place the gradient of every parameter in
/// `parameters` that requires grad; the others are left as they are.
void zero_gradients(const std::vector<torch::Tensor>& parameters);

/// What one measured step saw (see the top).
struct StepMeasurement {
  torch::Tensor loss;            ///< the loss forward_loss returned
  double forward_ms = 0;         ///< forward + loss, wall time
  double backward_ms = 0;        ///< backward (+ after_backward), wall time
  double cpu_ms = 0;             ///< the process's CPU time over both
  int64_t peak_delta_bytes = 0;  ///< the meter's raw peak over the step
  /// forward_ms + backward_ms.
  double step_ms() const {
    return forward_ms + backward_ms;
  }
  /// peak_delta_bytes less the loss value and its seed gradient.
  int64_t activation_peak_bytes() const;
};

/// Measures one step (see the top). `after_backward` may be empty.
///
/// Example:
///   remat::measure::zero_gradients(net->parameters());
///   auto step = remat::measure::measure_step(x.device(), [&] {
///     return torch::nll_loss(net->forward(x), y);
///   });
///   optimizer.step();
///   // step.activation_peak_bytes() + x.nbytes() is what simulate() predicts
StepMeasurement measure_step(
    c10::Device device,
    const std::function<torch::Tensor()>& forward_loss,
    const std::function<void()>& after_backward = {});

}  // namespace remat::measure
