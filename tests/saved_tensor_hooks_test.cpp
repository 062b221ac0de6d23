// saved_tensor_hooks_test.cpp: the C++ saved-tensor hooks guard.
#include <thread>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/remat.h"
#include "test_util.h"

namespace {

using remat::SavedTensorHooks;
using remat::testing::bitwise_equal;

SavedTensorHooks::UnpackHook unpack_tensor() {
  return [](const std::any& packed) {
    return std::any_cast<torch::Tensor>(packed);
  };
}

TEST(SavedTensorHooks, PackAndUnpackSeeEverySavedTensor) {
  auto x = torch::randn({4, 3}, torch::requires_grad());
  auto w = torch::randn({3, 2}, torch::requires_grad());
  auto plain = torch::autograd::grad({x.mm(w).exp().sum()}, {x, w});

  int packed = 0;
  int unpacked = 0;
  torch::Tensor loss;
  {
    SavedTensorHooks hooks(
        [&](const torch::Tensor& t) -> std::any {
          ++packed;
          return t;
        },
        [&](const std::any& p) {
          ++unpacked;
          return std::any_cast<torch::Tensor>(p);
        });
    loss = x.mm(w).exp().sum();  // mm saves x and w, exp saves its result
  }
  EXPECT_EQ(packed, 3);
  EXPECT_EQ(unpacked, 0);
  auto grads = torch::autograd::grad({loss}, {x, w});
  EXPECT_EQ(unpacked, 3);
  EXPECT_TRUE(bitwise_equal(plain[0], grads[0]));
  EXPECT_TRUE(bitwise_equal(plain[1], grads[1]));
}

TEST(SavedTensorHooks, CopyingPackHookFreesNothingButKeepsGradientsExact) {
  // A pack hook that stores a copy (as a CPU-offload hook would for a GPU
  // tensor) and an unpack hook that returns it: gradients are unchanged.
  torch::manual_seed(0);
  torch::nn::Sequential model(
      torch::nn::Linear(8, 16), torch::nn::GELU(), torch::nn::Linear(16, 4));
  auto x = torch::randn({5, 8});
  model->forward(x).pow(2).sum().backward();
  auto expected = remat::testing::grads_of(*model);
  model->zero_grad();
  torch::Tensor loss;
  {
    SavedTensorHooks offload(
        [](const torch::Tensor& t) -> std::any { return t.clone(); },
        unpack_tensor());
    loss = model->forward(x).pow(2).sum();
  }
  loss.backward();
  remat::testing::expect_all_bitwise_equal(
      expected, remat::testing::grads_of(*model), "grad");
}

TEST(SavedTensorHooks, InnermostGuardWins) {
  std::vector<std::string> log;
  auto tagging = [&](std::string tag) {
    return [&log, tag](const torch::Tensor& t) -> std::any {
      log.push_back(tag);
      return t;
    };
  };
  auto x = torch::randn({3}, torch::requires_grad());
  SavedTensorHooks outer(tagging("outer"), unpack_tensor());
  auto a = x.exp();
  {
    SavedTensorHooks inner(tagging("inner"), unpack_tensor());
    auto b = x.exp();
  }
  auto c = x.exp();
  EXPECT_EQ(log, (std::vector<std::string>{"outer", "inner", "outer"}));
}

TEST(SavedTensorHooks, AreThreadLocal) {
  int packed_here = 0;
  SavedTensorHooks hooks(
      [&](const torch::Tensor& t) -> std::any {
        ++packed_here;
        return t;
      },
      unpack_tensor());
  std::thread other([] {
    auto x = torch::randn({3}, torch::requires_grad());
    x.exp().sum().backward();
  });
  other.join();
  EXPECT_EQ(packed_here, 0);
}

TEST(SavedTensorHooks, UnpackRunsAgainOnSecondBackward) {
  int unpacked = 0;
  auto x = torch::randn({3}, torch::requires_grad());
  torch::Tensor loss;
  {
    SavedTensorHooks hooks(
        [](const torch::Tensor& t) -> std::any { return t; },
        [&](const std::any& p) {
          ++unpacked;
          return std::any_cast<torch::Tensor>(p);
        });
    loss = x.exp().sum();
  }
  loss.backward({}, /*retain_graph=*/true);
  loss.backward();
  EXPECT_EQ(unpacked, 2);
  EXPECT_TRUE(bitwise_equal(x.exp() * 2, x.grad()));
}

TEST(SavedTensorHooks, EmptyHooksAreRejected) {
  EXPECT_THROW(SavedTensorHooks(nullptr, unpack_tensor()), c10::Error);
  EXPECT_THROW(
      SavedTensorHooks(
          [](const torch::Tensor& t) -> std::any { return t; }, nullptr),
      c10::Error);
}

TEST(SavedTensorHooks, EngineIsInstalledOnFirstUse) {
  SavedTensorHooks hooks(
      [](const torch::Tensor& t) -> std::any { return t; }, unpack_tensor());
  EXPECT_TRUE(remat::engine_installed());
}

}  // namespace
