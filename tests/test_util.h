// test_util.h: helpers shared by the LibTorch test suites: comparing gradients
// against a reference with the maximum difference reported on failure.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/planner/chain.h"

namespace remat::testing {

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
  // On the host, so that device tensors compare the same way.
  auto a = expected.detach().cpu().contiguous();
  auto b = actual.detach().cpu().contiguous();
  if (std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0) {
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
