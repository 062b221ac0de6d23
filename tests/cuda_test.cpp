// cuda_test.cpp: remat on a CUDA device, against plain autograd and the
// caching allocator's own counts.
//
// Every test here is named *_CUDA. Without a CUDA GPU the binary lists the
// tests it skips and exits with code 77, which CTest reports as "Skipped" (the
// SKIP_RETURN_CODE of this test), so a CPU-only run says what it did not check.
//
// What is checked on the GPU:
//  - MemoryMeter(kCUDA) counts allocations to the byte, keeps independent
//    peaks for nested meters, and follows the caching allocator's statistics;
//  - checkpoint (both modes) with dropout gives gradients bitwise equal to a
//    plain run, and leaves the CUDA generator where the plain run leaves it;
//  - the RNG of each device a region touches is replayed;
//  - a planned Sequential under a byte budget stays within it, measured on
//    the device.
#include <cstdint>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/remat.h"
#include "test_util.h"

namespace {

using remat::testing::bitwise_equal;
using remat::testing::expect_same_step;
using remat::testing::TrainingStep;

torch::TensorOptions on_gpu() {
  return torch::dtype(torch::kFloat).device(torch::kCUDA);
}

/// A Sequential that can itself be a child of a Sequential.
struct BlockImpl : torch::nn::SequentialImpl {
  using SequentialImpl::SequentialImpl;
  torch::Tensor forward(torch::Tensor x) {
    return SequentialImpl::forward(x);
  }
};
TORCH_MODULE(Block);

/// `blocks` blocks of Linear(width, 4 width), ReLU, Dropout, Linear back.
torch::nn::Sequential dropout_mlp(int64_t width, int64_t blocks) {
  torch::manual_seed(7);
  torch::nn::Sequential model;
  for (int64_t i = 0; i < blocks; ++i) {
    model->push_back(Block(
        torch::nn::Linear(width, 4 * width),
        torch::nn::ReLU(),
        torch::nn::Dropout(0.2),
        torch::nn::Linear(4 * width, width)));
  }
  model->to(torch::kCUDA);
  return model;
}

// rng_after: the CUDA generator's state after the step.
TrainingStep run_step(
    torch::nn::Sequential& model,
    const torch::Tensor& input,
    const std::function<torch::Tensor(const torch::Tensor&)>& fn) {
  model->zero_grad();
  torch::manual_seed(1234);  // seeds every CUDA device too
  auto x = input.detach().requires_grad_(true);
  fn(x).pow(2).sum().backward();
  TrainingStep step;
  for (const auto& parameter : model->parameters()) {
    step.param_grads.push_back(parameter.grad().clone());
  }
  step.input_grad = x.grad().clone();
  at::Generator generator =
      at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, 0));
  step.rng_after = generator.get_state();
  return step;
}

// ------------------------------------------------------------ MemoryMeter

TEST(MemoryMeter, CountsCudaAllocationsExactly_CUDA) {
  remat::MemoryMeter meter(c10::Device(c10::kCUDA));
  EXPECT_TRUE(meter.device().is_cuda());
  EXPECT_TRUE(meter.device().has_index());
  const int64_t baseline = meter.current_bytes();
  {
    // 4096 bytes: a multiple of the caching allocator's 512-byte rounding.
    auto tensor = torch::empty({1024}, on_gpu());
    EXPECT_EQ(meter.current_bytes(), baseline + 4096);
  }
  EXPECT_EQ(meter.current_bytes(), baseline);
  EXPECT_EQ(meter.peak_delta_bytes(), 4096);
  meter.reset();
  EXPECT_EQ(meter.peak_delta_bytes(), 0);
}

TEST(MemoryMeter, NestedCudaMetersHaveIndependentPeaks_CUDA) {
  remat::MemoryMeter outer(c10::Device(c10::kCUDA));
  { auto spike = torch::empty({1 << 20}, on_gpu()); }
  remat::MemoryMeter inner(c10::Device(c10::kCUDA));  // resets the device peak
  { auto small = torch::empty({1024}, on_gpu()); }
  EXPECT_EQ(inner.peak_delta_bytes(), 4096);
  EXPECT_EQ(outer.peak_delta_bytes(), 4 << 20);
  inner.reset();
  EXPECT_EQ(outer.peak_delta_bytes(), 4 << 20);
}

TEST(MemoryMeter, PeakOfOverlappingTensorsIsTheirSum_CUDA) {
  remat::MemoryMeter meter(c10::Device(c10::kCUDA));
  {
    auto a = torch::empty({1 << 20}, on_gpu());  // 4 MiB
    auto b = torch::empty({1 << 19}, on_gpu());  // 2 MiB, alive with a
  }
  { auto c = torch::empty({1 << 20}, on_gpu()); }  // 4 MiB, alone
  EXPECT_EQ(meter.peak_delta_bytes(), 6 << 20);
  EXPECT_EQ(meter.current_bytes(), meter.baseline_bytes());
}

// ------------------------------------------------------------- checkpoint

class CheckpointOnCuda : public ::testing::TestWithParam<remat::Mode> {};

TEST_P(CheckpointOnCuda, GradientsAndRngEqualPlainWithDropout_CUDA) {
  auto model = dropout_mlp(/*width=*/256, /*blocks=*/3);
  const auto input = torch::randn({64, 256}, on_gpu());
  const TrainingStep plain = run_step(
      model, input, [&](const torch::Tensor& x) { return model->forward(x); });
  const auto options = remat::CheckpointOptions().mode(GetParam());
  const TrainingStep checkpointed =
      run_step(model, input, [&](const torch::Tensor& x) {
        torch::Tensor h = x;
        for (size_t i = 0; i < model->size(); ++i) {
          auto block = model[i]->as<BlockImpl>();
          h = remat::checkpoint(
              [block](const torch::Tensor& in) { return block->forward(in); },
              h,
              options);
        }
        return h;
      });
  expect_same_step(plain, checkpointed);
  const TrainingStep sequential =
      run_step(model, input, [&](const torch::Tensor& x) {
        return remat::checkpoint_sequential(model, 3, x, options);
      });
  expect_same_step(plain, sequential);
}

INSTANTIATE_TEST_SUITE_P(
    BothModes,
    CheckpointOnCuda,
    ::testing::Values(remat::Mode::kNonReentrant, remat::Mode::kReentrant));

TEST(Checkpoint, ReplaysTheGeneratorOfEachDeviceTheRegionTouches_CUDA) {
  // The region draws from the CPU generator and from the GPU's; both draws
  // must repeat during recomputation, so the gradient (which depends on the
  // draws) equals the plain one.
  const auto region = [](const torch::Tensor& x) {
    const auto cpu_noise = torch::rand({x.size(0), x.size(1)}).to(x.device());
    const auto gpu_noise = torch::rand_like(x);
    return (x * cpu_noise + gpu_noise * x).tanh();
  };
  const auto input = torch::randn({128, 128}, on_gpu());
  const auto gradient_of = [&](bool checkpointed) {
    torch::manual_seed(99);
    auto x = input.detach().requires_grad_(true);
    auto y = checkpointed ? remat::checkpoint(region, x) : region(x);
    y.sum().backward();
    return x.grad().clone();
  };
  EXPECT_TRUE(bitwise_equal(gradient_of(false), gradient_of(true)));
}

// -------------------------------------------------------- planned execution

TEST(AutoCheckpoint, MeasuredCudaPeakStaysWithinTheBudget_CUDA) {
  torch::manual_seed(3);
  torch::nn::Sequential model;
  for (int i = 0; i < 16; ++i) {
    model->push_back(Block(torch::nn::Linear(1024, 1024), torch::nn::ReLU()));
  }
  model->to(torch::kCUDA);
  const auto input = torch::randn({4096, 1024}, on_gpu());
  const remat::planner::Chain chain = remat::profile_chain(model, input);
  for (double fraction : {0.3, 0.5, 0.8}) {
    const int64_t budget =
        remat::Budget::fraction(fraction).resolve_bytes(chain);
    auto net =
        remat::auto_checkpoint(model, input, remat::Budget::fraction(fraction));
    for (auto& parameter : model->parameters()) {
      parameter.mutable_grad() = torch::zeros_like(parameter);
    }
    torch::cuda::synchronize();
    int64_t peak = 0;
    {
      remat::MemoryMeter meter(c10::Device(c10::kCUDA));
      auto loss = net->forward(input).sum();
      loss.backward();
      torch::cuda::synchronize();
      // The scalar loss and its seed gradient are outside the chain; the
      // budget counts the chain input.
      peak = meter.peak_delta_bytes() + chain.input_bytes() -
             2 * static_cast<int64_t>(512);
    }
    std::cout << "[ cuda     ] budget " << fraction << " = " << budget
              << " bytes, measured " << peak << " bytes\n";
    EXPECT_LE(peak, budget) << "fraction " << fraction;
  }
}

}  // namespace

// ---------------------------------------------------------------- offload

TEST(SaveOnCpu, MovesActivationsToHostAndBackBitForBit_CUDA) {
  auto model = dropout_mlp(256, 8);
  const auto input = torch::randn({512, 256}, on_gpu());
  const TrainingStep plain = run_step(
      model, input, [&](const torch::Tensor& x) { return model->forward(x); });
  remat::MemoryMeter plain_meter(c10::Device(c10::kCUDA));
  run_step(
      model, input, [&](const torch::Tensor& x) { return model->forward(x); });
  const int64_t plain_peak = plain_meter.peak_delta_bytes();

  // The guard lives through backward here, so that its stats include the
  // fetches.
  std::optional<remat::SaveOnCpu> offload;
  remat::MemoryMeter offload_meter(c10::Device(c10::kCUDA));
  const TrainingStep offloaded =
      run_step(model, input, [&](const torch::Tensor& x) {
        offload.emplace();
        return model->forward(x);
      });
  const int64_t offload_peak = offload_meter.peak_delta_bytes();
  const remat::OffloadStats stats = offload->stats();
  offload.reset();
  expect_same_step(plain, offloaded);
  // Moved: the activations of 8 blocks. Left: the weights (parameters).
  EXPECT_GE(stats.tensors_moved, 8 * 3);
  EXPECT_GE(stats.tensors_left, 8 * 2);
  EXPECT_EQ(stats.fetches, stats.tensors_moved);
  EXPECT_GT(stats.prefetch_hits, 0);
  EXPECT_LT(offload_peak, plain_peak)
      << "plain " << plain_peak << " bytes, offloaded " << offload_peak;
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (!torch::cuda::is_available()) {
    const auto* unit = ::testing::UnitTest::GetInstance();
    int skipped = 0;
    for (int s = 0; s < unit->total_test_suite_count(); ++s) {
      const auto* suite = unit->GetTestSuite(s);
      for (int t = 0; t < suite->total_test_count(); ++t) {
        std::cout << "skipped (no CUDA GPU): " << suite->name() << "."
                  << suite->GetTestInfo(t)->name() << "\n";
        ++skipped;
      }
    }
    std::cout << "cuda_test: no CUDA GPU is visible; " << skipped
              << " tests skipped\n";
    return 77;
  }
  torch::set_num_threads(2);
  return RUN_ALL_TESTS();
}
