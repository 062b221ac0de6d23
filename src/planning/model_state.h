// model_state.h (private): running a model to measure it without leaving a
// trace (profile_chain, fit_batch).
#pragma once

#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <ATen/Context.h>
#include <c10/core/GradMode.h>
#include <torch/nn/module.h>
#include <torch/types.h>

namespace remat::detail {

/// Runs a model without leaving a trace: saves the buffers and parameter
/// gradients of `modules` and the RNG state of the CPU (and of `device` if it
/// is CUDA), sets every gradient of a parameter that requires grad to zeros
/// (allocated, as after a first training step), and restores all of it on
/// destruction.
class ModelStateGuard {
 public:
  ModelStateGuard(
      const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
      c10::Device device) {
    c10::NoGradGuard no_grad;
    for (const auto& module : modules) {
      for (auto& buffer : module->buffers(/*recurse=*/true)) {
        buffers_.emplace_back(buffer, buffer.clone());
      }
      for (auto& parameter : module->parameters(/*recurse=*/true)) {
        grads_.emplace_back(parameter, parameter.grad());
      }
    }
    // Allocated before any gradient is replaced: a constructor that throws
    // (out of memory) runs no destructor, and must leave the caller's
    // gradients as they were.
    std::vector<torch::Tensor> zeros;
    zeros.reserve(grads_.size());
    for (const auto& [parameter, grad] : grads_) {
      zeros.push_back(
          parameter.requires_grad() ? torch::zeros_like(parameter)
                                    : torch::Tensor());
    }
    std::vector<c10::Device> devices{c10::Device(c10::kCPU)};
    if (device.is_cuda()) {
      devices.push_back(device);
    }
    for (const auto& each : devices) {
      at::Generator generator = at::globalContext().defaultGenerator(each);
      std::lock_guard<std::mutex> lock(generator.mutex());
      rng_.emplace_back(generator, generator.get_state());
    }
    for (size_t i = 0; i < grads_.size(); ++i) {
      if (zeros[i].defined()) {
        grads_[i].first.mutable_grad() = std::move(zeros[i]);
      }
    }
  }
  ~ModelStateGuard() {
    c10::NoGradGuard no_grad;
    // In reverse: a tensor reached twice (a module and its parent, both in
    // `modules`) was saved first as it was, then as this guard set it; the
    // first save must be restored last.
    for (auto it = buffers_.rbegin(); it != buffers_.rend(); ++it) {
      it->first.variable_data().copy_(it->second);
    }
    for (auto it = grads_.rbegin(); it != grads_.rend(); ++it) {
      it->first.mutable_grad() = it->second;
    }
    for (auto& [generator, state] : rng_) {
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(state);
    }
  }
  ModelStateGuard(const ModelStateGuard&) = delete;
  ModelStateGuard& operator=(const ModelStateGuard&) = delete;

 private:
  std::vector<std::pair<torch::Tensor, torch::Tensor>> buffers_;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> grads_;
  std::vector<std::pair<at::Generator, at::Tensor>> rng_;
};

}  // namespace remat::detail
