// profile_test.cpp: profile_chain() measures the memory model's fields
// exactly (checked on stages whose sizes are known in closed form) and leaves
// no trace (buffers, parameter gradients, RNG state).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <models/models.h>
#include <torch/torch.h>

#include "remat/planner.h"
#include "remat/remat.h"
#include "test_util.h"

namespace {

constexpr int64_t kFloatBytes = 4;

TEST(ProfileChain, MeasuresBytesInTheSenseOfTheMemoryModel) {
  torch::manual_seed(0);
  torch::nn::Sequential model(
      torch::nn::Linear(32, 64),  // saves its input (x_0) and weight: 0 new
      torch::nn::ReLU(),          // saves its output
      torch::nn::Dropout(0.5),    // saves its (float) mask and output
      torch::nn::Linear(64, 16));
  const auto sample = torch::randn({8, 32});
  const auto chain = remat::profile_chain(model, sample);
  ASSERT_EQ(chain.size(), 4);
  EXPECT_EQ(chain.input_bytes(), 8 * 32 * kFloatBytes);
  const int64_t hidden = 8 * 64 * kFloatBytes;
  EXPECT_EQ(chain.stage(0).output_bytes, hidden);
  EXPECT_EQ(chain.stage(0).saved_bytes, hidden);  // output only
  EXPECT_EQ(chain.stage(1).output_bytes, hidden);
  EXPECT_EQ(chain.stage(1).saved_bytes, hidden);  // output (= saved result)
  EXPECT_EQ(chain.stage(2).output_bytes, hidden);
  EXPECT_EQ(chain.stage(2).saved_bytes, 2 * hidden);  // mask + output
  EXPECT_EQ(chain.stage(3).output_bytes, 8 * 16 * kFloatBytes);
  // Transients per forward kind. Dropout under no-grad allocates its mask,
  // multiplies into the output and frees the mask: one hidden-sized
  // transient. Recorded, the mask is saved (in saved_bytes): no transient.
  EXPECT_EQ(chain.stage(2).forward_tmp_bytes, hidden);
  ASSERT_TRUE(chain.stage(2).record_tmp_bytes.has_value());
  EXPECT_EQ(*chain.stage(2).record_tmp_bytes, 0);
  // Linear and ReLU allocate only their output either way.
  for (int64_t i : {0, 1, 3}) {
    EXPECT_EQ(chain.stage(i).forward_tmp_bytes, 0) << i;
    ASSERT_TRUE(chain.stage(i).record_tmp_bytes.has_value()) << i;
    EXPECT_EQ(*chain.stage(i).record_tmp_bytes, 0) << i;
  }
  for (int64_t i = 0; i < chain.size(); ++i) {
    EXPECT_GE(chain.stage(i).forward_ms, 0) << i;
    EXPECT_GE(chain.stage(i).backward_ms, 0) << i;
    EXPECT_GE(chain.stage(i).forward_tmp_bytes, 0) << i;
    EXPECT_GE(chain.stage(i).backward_tmp_bytes, -chain.value_bytes(i)) << i;
  }
}

// The cold-write cost (planner::Chain::cold_write_ms_per_mib) is measured on
// buffers that cover the chain's working set, not more: a small chain's
// profile stays small. Its value is a time, checked only for its range.
TEST(ProfileChain, MeasuresColdWritesOnBuffersTheSizeOfTheWorkingSet) {
  torch::manual_seed(0);
  torch::nn::Sequential model(
      torch::nn::Linear(32, 64), torch::nn::ReLU(), torch::nn::Linear(64, 16));
  const auto sample = torch::randn({8, 32});
  remat::MemoryMeter meter;
  const auto chain = remat::profile_chain(model, sample);
  EXPECT_LT(meter.peak_delta_bytes(), int64_t{1} << 20);
  EXPECT_EQ(meter.current_bytes(), meter.baseline_bytes());
  EXPECT_TRUE(std::isfinite(chain.cold_write_ms_per_mib()));
  EXPECT_GE(chain.cold_write_ms_per_mib(), 0);
  // The graph profile measures it too, and a planner file keeps it.
  torch::nn::Linear first(32, 64);
  torch::nn::Linear second(64, 16);
  const std::vector<remat::GraphStage> stages{
      {[first](const std::vector<torch::Tensor>& in) mutable {
         return torch::relu(first(in[0]));
       },
       first.ptr(),
       {remat::kGraphInput}},
      {[second](const std::vector<torch::Tensor>& in) mutable {
         return second(in[0]);
       },
       second.ptr(),
       {0}}};
  const auto graph = remat::profile_graph(stages, sample);
  EXPECT_TRUE(std::isfinite(graph.cold_write_ms_per_mib()));
  EXPECT_GE(graph.cold_write_ms_per_mib(), 0);
  EXPECT_EQ(
      remat::planner::graph_from_json(remat::planner::to_json(graph)), graph);
}

TEST(ProfileChain, LeavesBuffersGradientsAndRngUntouched) {
  torch::manual_seed(5);
  auto model = remat::models::resnet_chain(remat::models::ResNetChainOptions()
                                               .stage_channels({4, 8})
                                               .blocks_per_stage(1));
  const auto sample = torch::randn({2, 3, 8, 8});
  std::vector<torch::Tensor> buffers_before;
  for (const auto& buffer : model->buffers()) {
    buffers_before.push_back(buffer.clone());
  }
  auto parameters = model->parameters();
  parameters[0].mutable_grad() = torch::full_like(parameters[0], 3.0);
  const auto grad_before = parameters[0].grad().clone();
  torch::manual_seed(42);
  const auto expected_draw = torch::rand({4});
  torch::manual_seed(42);
  remat::profile_chain(model, sample);
  const auto actual_draw = torch::rand({4});

  EXPECT_TRUE(remat::testing::bitwise_equal(expected_draw, actual_draw));
  const auto buffers_after = model->buffers();
  ASSERT_EQ(buffers_before.size(), buffers_after.size());
  for (size_t i = 0; i < buffers_after.size(); ++i) {
    EXPECT_TRUE(
        remat::testing::bitwise_equal(buffers_before[i], buffers_after[i]))
        << "buffer " << i;
  }
  EXPECT_TRUE(remat::testing::bitwise_equal(grad_before, parameters[0].grad()));
  for (size_t i = 1; i < parameters.size(); ++i) {
    EXPECT_FALSE(parameters[i].grad().defined()) << "parameter " << i;
  }
}

// Stages whose modules nest (one stage's module is the parent of another's)
// reach a parameter twice: its gradient is still restored as it was.
TEST(ProfileChain, RestoresGradientsOfParametersThatNestedModulesShare) {
  torch::nn::Sequential model(
      torch::nn::Linear(8, 8), torch::nn::Tanh(), torch::nn::Linear(8, 8));
  torch::nn::Linear first(model->ptr<torch::nn::LinearImpl>(0));
  torch::nn::Linear last(model->ptr<torch::nn::LinearImpl>(2));
  std::vector<remat::Stage> stages{
      {[=](const torch::Tensor& x) mutable { return first(x); }, model.ptr()},
      {[](const torch::Tensor& x) { return torch::tanh(x); }, nullptr},
      {[=](const torch::Tensor& x) mutable { return last(x); }, last.ptr()}};
  for (torch::Tensor& parameter : model->parameters()) {
    parameter.mutable_grad() = torch::full_like(parameter, 7.0);
  }
  remat::profile_chain(stages, torch::randn({4, 8}));
  for (const auto& item : model->named_parameters()) {
    ASSERT_TRUE(item.value().grad().defined()) << item.key();
    EXPECT_TRUE(torch::all(item.value().grad() == 7.0).item<bool>())
        << item.key();
  }
}

/// A stage that records, per call of its forward, whether autograd
/// recorded it.
struct GradModeRecorderImpl : torch::nn::Module {
  torch::Tensor forward(const torch::Tensor& x) {
    recorded.push_back(torch::GradMode::is_enabled());
    return x * 2;
  }
  std::vector<bool> recorded;
};
TORCH_MODULE(GradModeRecorder);

// A round is one no-grad forward (the timed one: forward_ms is
// planner::median over the timed rounds, checked in bench_harness_test's
// Summarize tests) and one recorded forward; warm-up rounds come first and
// run the same way; x_1 is computed last, under no-grad. Measured times are
// not asserted on: they vary with the machine's load.
TEST(ProfileChain, RunsWarmUpAndTimedRoundsOfANoGradAndARecordedForward) {
  for (const int64_t warmup : {0, 1, 2}) {
    SCOPED_TRACE("warmup " + std::to_string(warmup));
    GradModeRecorder stage;
    remat::profile_chain(
        torch::nn::Sequential(stage),
        torch::randn({4, 4}),
        remat::ProfileOptions().warmup(warmup).repeats(3));
    std::vector<bool> expected;
    for (int64_t round = 0; round < warmup + 3; ++round) {
      expected.push_back(false);  // no-grad
      expected.push_back(true);   // recorded
    }
    expected.push_back(false);  // x_1
    EXPECT_EQ(stage->recorded, expected);
  }
}

TEST(ProfileChain, RejectsBadArguments) {
  auto model = remat::models::uniform_mlp_chain(2, 8);
  EXPECT_THROW(
      remat::profile_chain(torch::nn::Sequential(), torch::randn({2, 8})),
      c10::Error);
  EXPECT_THROW(remat::profile_chain(model, torch::Tensor()), c10::Error);
  EXPECT_THROW(
      remat::profile_chain(
          model, torch::randn({2, 8}), remat::ProfileOptions().repeats(0)),
      c10::Error);
}

}  // namespace
