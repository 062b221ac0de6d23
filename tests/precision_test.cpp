// Tests of remat/precision.h: parsing, AutocastGuard's state handling (kept
// and restored, on exceptions too; the cast cache cleared when the outermost
// guard ends), and checkpointing under bf16 autocast against the plain
// bf16-autocast run, bitwise, in both modes.
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <remat/checkpoint.h>
#include <remat/memory_meter.h>
#include <remat/precision.h>
#include <torch/torch.h>

#include "compat/compat.h"
#include "test_util.h"

namespace {

using remat::AutocastGuard;
using remat::AutocastOptions;
using remat::CheckpointOptions;
using remat::Mode;
using remat::Precision;
using remat::testing::bitwise_equal;
using remat::testing::both_modes;
using remat::testing::expect_all_bitwise_equal;
using remat::testing::mode_test_name;

bool same_state(
    const remat::compat::AutocastState& a,
    const remat::compat::AutocastState& b) {
  return a.cpu_enabled == b.cpu_enabled && a.cuda_enabled == b.cuda_enabled &&
         a.cpu_dtype == b.cpu_dtype && a.cuda_dtype == b.cuda_dtype &&
         a.cache_enabled == b.cache_enabled;
}

// The autocast nesting depth, read without changing it.
int nesting_depth() {
  const int depth = at::autocast::increment_nesting() - 1;
  at::autocast::decrement_nesting();
  return depth;
}

std::string error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const c10::Error& error) {
    return error.what_without_backtrace();
  }
  return "";
}

TEST(ParsePrecision, AcceptsTheThreeNamesAndRoundTrips) {
  EXPECT_EQ(remat::parse_precision("fp32"), Precision::kFloat32);
  EXPECT_EQ(remat::parse_precision("bf16"), Precision::kBFloat16);
  EXPECT_EQ(remat::parse_precision("fp16"), Precision::kFloat16);
  for (Precision precision :
       {Precision::kFloat32, Precision::kBFloat16, Precision::kFloat16}) {
    EXPECT_EQ(
        remat::parse_precision(remat::precision_name(precision)), precision);
  }
}

TEST(ParsePrecision, RejectsOtherTextNamingIt) {
  for (const std::string text : {"fp8", "BF16", "", "float32"}) {
    const std::string message = error_of([&] { remat::parse_precision(text); });
    EXPECT_NE(message.find("got '" + text + "'"), std::string::npos) << message;
    EXPECT_NE(message.find("fp32, bf16 or fp16"), std::string::npos) << message;
  }
}

TEST(AutocastGuard, RunsMatmulsInBf16AndRestoresTheStateItFound) {
  const auto before = remat::compat::AutocastState::capture();
  ASSERT_FALSE(before.cpu_enabled);
  const auto a = torch::randn({4, 4});
  {
    AutocastGuard bf16(c10::kCPU, Precision::kBFloat16);
    const auto inside = remat::compat::AutocastState::capture();
    EXPECT_TRUE(inside.cpu_enabled);
    EXPECT_EQ(inside.cpu_dtype, torch::kBFloat16);
    EXPECT_EQ(inside.cuda_enabled, before.cuda_enabled) << "CUDA untouched";
    EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kBFloat16);
    {
      AutocastGuard fp32(c10::kCPU, Precision::kFloat32);
      EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kFloat) << "nested off";
      EXPECT_EQ(nesting_depth(), 2);
    }
    EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kBFloat16)
        << "the outer guard's state is back";
  }
  EXPECT_TRUE(same_state(before, remat::compat::AutocastState::capture()));
  EXPECT_EQ(nesting_depth(), 0);
  EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kFloat);
}

TEST(AutocastGuard, RestoresTheStateWhenTheBodyThrows) {
  const auto before = remat::compat::AutocastState::capture();
  EXPECT_THROW(
      {
        AutocastGuard bf16(
            c10::kCPU,
            Precision::kBFloat16,
            AutocastOptions().cache_enabled(!before.cache_enabled));
        EXPECT_NE(
            at::autocast::is_autocast_cache_enabled(), before.cache_enabled);
        throw std::runtime_error("body failed");
      },
      std::runtime_error);
  EXPECT_TRUE(same_state(before, remat::compat::AutocastState::capture()));
  EXPECT_EQ(nesting_depth(), 0);
}

TEST(AutocastGuard, RefusesFp16OnCpuAndOtherDeviceTypesChangingNothing) {
  const auto before = remat::compat::AutocastState::capture();
  std::string message =
      error_of([] { AutocastGuard guard(c10::kCPU, Precision::kFloat16); });
  EXPECT_NE(message.find("got fp16"), std::string::npos) << message;
  EXPECT_NE(message.find("CUDA only"), std::string::npos) << message;
  message = error_of(
      [] { AutocastGuard guard(c10::DeviceType::Meta, Precision::kBFloat16); });
  EXPECT_NE(message.find("got meta"), std::string::npos) << message;
  EXPECT_TRUE(same_state(before, remat::compat::AutocastState::capture()));
  EXPECT_EQ(nesting_depth(), 0);
}

TEST(AutocastGuard, CachedCastsLiveUntilTheOutermostGuardEndsAndNoneByDefault) {
  // A 256x256 fp32 parameter: its bf16 cast is 128 KiB.
  const auto weight = torch::randn({256, 256}, torch::requires_grad());
  const auto x = torch::randn({1, 256});
  const int64_t cast_bytes = 256 * 256 * 2;
  remat::MemoryMeter meter;
  const int64_t idle = meter.current_bytes();
  {
    const auto cached = AutocastOptions().cache_enabled(true);
    AutocastGuard bf16(c10::kCPU, Precision::kBFloat16, cached);
    {
      AutocastGuard inner(c10::kCPU, Precision::kBFloat16, cached);
      torch::NoGradGuard no_grad;
      torch::mm(x, weight);  // result dropped; the cast stays cached
    }
    EXPECT_GE(meter.current_bytes() - idle, cast_bytes)
        << "an inner guard does not clear the cache";
  }
  EXPECT_EQ(meter.current_bytes(), idle) << "the outermost guard clears it";
  {
    AutocastGuard bf16(c10::kCPU, Precision::kBFloat16);
    torch::NoGradGuard no_grad;
    torch::mm(x, weight);
    EXPECT_EQ(meter.current_bytes(), idle) << "nothing cached by default";
  }
}

// Checkpointed gradients under bf16 autocast equal the plain bf16 run's, with
// backward inside the guard (as remat train runs it) or after it (the
// recomputation then depends on the replayed autocast state alone), with the
// cast cache on and off.
class MixedPrecision : public ::testing::TestWithParam<Mode> {};

TEST_P(MixedPrecision, CheckpointedGradientsEqualThePlainBf16Run) {
  torch::manual_seed(11);
  torch::nn::Sequential block(
      torch::nn::Linear(16, 64),
      torch::nn::GELU(),
      torch::nn::Dropout(0.2),
      torch::nn::Linear(64, 16));
  torch::nn::Linear head(16, 4);
  const auto x = torch::randn({8, 16}, torch::requires_grad());
  for (bool backward_inside : {true, false}) {
    for (bool cache : {true, false}) {
      auto run = [&](bool use_checkpoint) {
        block->zero_grad();
        head->zero_grad();
        x.mutable_grad() = torch::Tensor();
        torch::manual_seed(12);
        torch::Tensor loss;
        {
          AutocastGuard bf16(
              c10::kCPU,
              Precision::kBFloat16,
              AutocastOptions().cache_enabled(cache));
          const auto hidden = use_checkpoint
                                  ? remat::checkpoint(
                                        [&](const torch::Tensor& in) {
                                          return block->forward(in);
                                        },
                                        x,
                                        CheckpointOptions().mode(GetParam()))
                                  : block->forward(x);
          EXPECT_EQ(hidden.scalar_type(), torch::kBFloat16);
          loss = head(hidden).to(torch::kFloat).pow(2).mean();
          if (backward_inside) {
            loss.backward();
          }
        }
        if (!backward_inside) {
          loss.backward();
        }
        auto grads = remat::testing::grads_of(*block);
        grads.push_back(x.grad().clone());
        return grads;
      };
      const auto plain = run(false);
      const auto checkpointed = run(true);
      const std::string what = std::string("backward ") +
                               (backward_inside ? "inside" : "after") +
                               " the guard, cache " + (cache ? "on" : "off");
      expect_all_bitwise_equal(plain, checkpointed, what);
      EXPECT_EQ(plain.front().scalar_type(), torch::kFloat)
          << "parameter gradients stay fp32";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    BothModes, MixedPrecision, both_modes(), mode_test_name);

// A recomputation run after the AutocastGuard ended (backward after the
// guard) must leave no cast in autocast's cache: the next step's forward
// would reuse bf16 copies of the parameters from before optimizer.step().
class AutocastCacheAfterBackward : public ::testing::TestWithParam<Mode> {};

// Three SGD steps, backward after the guard with the cast cache on: losses
// and gradients equal the plain bf16 run's at every step.
TEST_P(
    AutocastCacheAfterBackward, StepsAfterAnOptimizerUpdateEqualThePlainRun) {
  auto train = [](bool use_checkpoint, Mode mode) {
    torch::manual_seed(0);
    torch::nn::Linear lin(16, 16);
    torch::nn::Linear head(16, 1);
    std::vector<torch::Tensor> params = lin->parameters();
    for (const auto& p : head->parameters()) {
      params.push_back(p);
    }
    torch::optim::SGD sgd(params, 0.5);
    const auto x = torch::randn({8, 16}, torch::requires_grad());
    std::vector<torch::Tensor> seen;
    for (int step = 0; step < 3; ++step) {
      sgd.zero_grad();
      torch::Tensor loss;
      {
        AutocastGuard bf16(
            c10::kCPU,
            Precision::kBFloat16,
            AutocastOptions().cache_enabled(true));
        auto body = [&](const torch::Tensor& in) {
          return torch::tanh(lin(in));
        };
        const auto h =
            use_checkpoint
                ? remat::checkpoint(body, x, CheckpointOptions().mode(mode))
                : body(x);
        loss = head(h).to(torch::kFloat).pow(2).mean();
      }
      loss.backward();  // after the guard: the recomputation runs here
      seen.push_back(loss.detach().clone());
      seen.push_back(lin->weight.grad().clone());
      sgd.step();
    }
    return seen;
  };
  const auto plain = train(false, GetParam());
  const auto checkpointed = train(true, GetParam());
  ASSERT_EQ(plain.size(), checkpointed.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_TRUE(torch::equal(plain[i], checkpointed[i]))
        << "step " << i / 2 << (i % 2 ? " weight gradient" : " loss");
  }
}

// Nothing stays cached once backward after the guard has finished.
TEST_P(AutocastCacheAfterBackward, LeavesNoCastCachedAfterBackward) {
  torch::manual_seed(1);
  // A 256x256 fp32 parameter used directly by mm: its bf16 cast (128 KiB) is
  // what autocast caches.
  const auto weight = torch::randn({256, 256}, torch::requires_grad());
  const auto x = torch::randn({4, 256}, torch::requires_grad());
  remat::MemoryMeter meter;
  torch::Tensor loss;
  {
    AutocastGuard bf16(
        c10::kCPU, Precision::kBFloat16, AutocastOptions().cache_enabled(true));
    loss = remat::checkpoint(
               [&](const torch::Tensor& in) {
                 return torch::tanh(torch::mm(in, weight));
               },
               x,
               CheckpointOptions().mode(GetParam()))
               .to(torch::kFloat)
               .sum();
  }
  const int64_t before_backward = meter.current_bytes();
  loss.backward();
  loss = torch::Tensor();
  const int64_t grads = weight.grad().nbytes() + x.grad().nbytes();
  EXPECT_LE(meter.current_bytes() - before_backward, grads)
      << "a cast made by the recomputation is still cached";
}

INSTANTIATE_TEST_SUITE_P(
    BothModes, AutocastCacheAfterBackward, both_modes(), mode_test_name);

}  // namespace
