// test_util.h: helpers shared by the LibTorch test suites: comparing gradients
// against a reference with the maximum difference reported on failure.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/checkpoint.h"
#include "remat/memory_meter.h"
#include "remat/planner/chain.h"

namespace remat::testing {

/// The message of the c10::Error `body` throws, without its backtrace; "no
/// error" if it throws none (any other exception propagates).
inline std::string error_message_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const c10::Error& error) {
    return error.what_without_backtrace();
  }
  return "no error";
}

/// The two checkpoint modes, as the values of a test parameterized by Mode.
inline auto both_modes() {
  return ::testing::Values(Mode::kNonReentrant, Mode::kReentrant);
}

/// "NonReentrant" or "Reentrant": the name of a test run in a Mode.
inline std::string mode_test_name(const ::testing::TestParamInfo<Mode>& info) {
  return info.param == Mode::kNonReentrant ? "NonReentrant" : "Reentrant";
}

/// Bitwise equality of two tensors, with the max abs difference on failure.
/// Two undefined tensors are a failure: a check of gradients that none of
/// the runs produced compares nothing (bitwise_equal_or_both_undefined is
/// for where an undefined tensor is the expected result).
inline ::testing::AssertionResult bitwise_equal(
    const torch::Tensor& expected, const torch::Tensor& actual) {
  if (!expected.defined() || !actual.defined()) {
    if (!expected.defined() && !actual.defined()) {
      return ::testing::AssertionFailure()
             << "both tensors are undefined: nothing was compared";
    }
    return ::testing::AssertionFailure()
           << "one tensor is undefined (expected defined: "
           << expected.defined() << ", actual defined: " << actual.defined()
           << ")";
  }
  if (expected.sizes() != actual.sizes() ||
      expected.scalar_type() != actual.scalar_type()) {
    return ::testing::AssertionFailure()
           << "shape/dtype differ: " << expected.sizes() << " "
           << expected.scalar_type() << " vs " << actual.sizes() << " "
           << actual.scalar_type();
  }
  // On the host, so that device tensors compare the same way; a conjugate
  // or negative view by its values (its bytes are not), a complex tensor as
  // its real and imaginary parts.
  const auto host = [](const torch::Tensor& t) {
    auto values = t.detach().cpu().resolve_conj().resolve_neg().contiguous();
    return values.is_complex() ? torch::view_as_real(values) : values;
  };
  auto a = host(expected);
  auto b = host(actual);
  // An empty tensor may have no storage (a null data pointer, which memcmp
  // must not be given even for zero bytes).
  if (a.nbytes() == 0 ||
      std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "not bitwise equal; max abs difference "
         << (a.to(torch::kDouble) - b.to(torch::kDouble))
                .abs()
                .max()
                .item<double>();
}

/// bitwise_equal, where two undefined tensors also agree (a gradient that
/// neither run is expected to produce).
inline ::testing::AssertionResult bitwise_equal_or_both_undefined(
    const torch::Tensor& expected, const torch::Tensor& actual) {
  if (!expected.defined() && !actual.defined()) {
    return ::testing::AssertionSuccess();
  }
  return bitwise_equal(expected, actual);
}

/// Gradients of every parameter of `module` (undefined where none).
inline std::vector<torch::Tensor> grads_of(const torch::nn::Module& module) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : module.parameters()) {
    grads.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  }
  return grads;
}

/// Asserts that two gradient lists are bitwise equal, naming the index.
inline void expect_all_bitwise_equal(
    const std::vector<torch::Tensor>& expected,
    const std::vector<torch::Tensor>& actual,
    const std::string& what) {
  ASSERT_EQ(expected.size(), actual.size()) << what;
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(expected[i], actual[i])) << what << " #" << i;
  }
}

/// What one training step leaves behind, to compare a checkpointed step
/// with a plain one (expect_same_step).
struct TrainingStep {
  std::vector<torch::Tensor> param_grads;  // one per parameter
  torch::Tensor input_grad;
  std::vector<torch::Tensor> buffers;  // after the step; empty: none kept
  /// A witness of the random stream after the step (a generator state or a
  /// value drawn from it); undefined in both steps: not compared.
  torch::Tensor rng_after;
};

/// Asserts that `actual` left the same gradients, buffers and random stream
/// as `expected`, bitwise.
inline void expect_same_step(
    const TrainingStep& expected, const TrainingStep& actual) {
  expect_all_bitwise_equal(
      expected.param_grads, actual.param_grads, "parameter grad");
  EXPECT_TRUE(bitwise_equal(expected.input_grad, actual.input_grad))
      << "input grad";
  // The buffers moved once (as in one plain step), not once per recomputation.
  expect_all_bitwise_equal(expected.buffers, actual.buffers, "buffer");
  if (expected.rng_after.defined() || actual.rng_after.defined()) {
    EXPECT_TRUE(bitwise_equal(expected.rng_after, actual.rng_after))
        << "the random stream ends elsewhere than after the expected step";
  }
}

/// A TrainingStep with its measured activation peak.
struct MeasuredStep : TrainingStep {
  /// The MemoryMeter's peak over forward + loss + backward, less the scalar
  /// loss and its seed gradient (outside the planned model).
  int64_t activation_peak_bytes = 0;
};

/// One training step of `forward` (loss: the sum of its output) on a copy of
/// `input` that requires grad, from `initial_buffers` (the buffers of
/// `modules`, restored first), with zeroed parameter gradients allocated
/// beforehand and seed 99: the gradients, the buffers after the step and
/// the activation peak.
inline MeasuredStep measured_step(
    torch::nn::Module& modules,
    const std::vector<torch::Tensor>& initial_buffers,
    const torch::Tensor& input,
    const std::function<torch::Tensor(const torch::Tensor&)>& forward) {
  {
    torch::NoGradGuard no_grad;
    auto buffers = modules.buffers();
    for (size_t i = 0; i < buffers.size(); ++i) {
      buffers[i].copy_(initial_buffers[i]);
    }
    for (auto& parameter : modules.parameters()) {
      parameter.mutable_grad() = torch::zeros_like(parameter);
    }
  }
  torch::Tensor x = input.detach().requires_grad_(true);
  torch::manual_seed(99);
  MeasuredStep result;
  {
    remat::MemoryMeter meter;
    torch::Tensor loss = forward(x).sum();
    loss.backward();
    result.activation_peak_bytes =
        meter.peak_delta_bytes() - 2 * static_cast<int64_t>(loss.nbytes());
  }
  result.param_grads = grads_of(modules);
  result.input_grad = x.grad();
  for (const auto& buffer : modules.buffers()) {
    result.buffers.push_back(buffer.clone());
  }
  return result;
}

/// A small heterogeneous chain (6 stages, fixed costs) whose costs make
/// checkpointing worthwhile: for tests of plan choice and the tool.
inline remat::planner::Chain sample_chain() {
  std::vector<remat::planner::StageCost> stages;
  for (int index = 0; index < 6; ++index) {
    remat::planner::StageCost stage;
    stage.forward_ms = 1.0 + index % 3;
    stage.backward_ms = 2.0 * stage.forward_ms;
    stage.output_bytes = 1000 * (1 + index % 2);
    stage.saved_bytes = 3 * stage.output_bytes;
    stages.push_back(stage);
  }
  return remat::planner::Chain(stages, 1000);
}

}  // namespace remat::testing
