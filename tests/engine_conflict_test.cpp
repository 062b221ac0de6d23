// engine_conflict_test.cpp: when another autograd engine already replaced the
// default one (as PyTorch's Python bindings do), remat refuses to install its
// own with a clear error, and the reentrant checkpoint still works.
// A separate binary: the engine swap is process-wide.
#include <gtest/gtest.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/torch.h>

#include "remat/remat.h"
#include "test_util.h"

namespace {

/// Stands in for another library's engine (PyTorch's PythonEngine).
struct ForeignEngine final : torch::autograd::Engine {
  ~ForeignEngine() override {
    stop();
  }
};

torch::autograd::Engine& foreign_engine() {
  static ForeignEngine engine;
  return engine;
}

class EngineConflict : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    torch::autograd::set_default_engine_stub(&foreign_engine);
  }
};

TEST_F(EngineConflict, NonReentrantCheckpointIsRefusedClearly) {
  auto x = torch::randn({3}, torch::requires_grad());
  try {
    remat::checkpoint([](const torch::Tensor& in) { return in.exp(); }, x);
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(
        std::string(e.what()).find(
            "another autograd engine is already installed"),
        std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(remat::engine_installed());
  EXPECT_THROW(
      remat::SavedTensorHooks(
          [](const torch::Tensor& t) -> std::any { return t; },
          [](const std::any& p) { return std::any_cast<torch::Tensor>(p); }),
      c10::Error);
}

TEST_F(EngineConflict, ReentrantCheckpointStillWorks) {
  auto x = torch::randn({3}, torch::requires_grad());
  auto y = remat::checkpoint(
      [](const torch::Tensor& in) { return in.exp(); },
      x,
      remat::CheckpointOptions().mode(remat::Mode::kReentrant));
  y.sum().backward();
  EXPECT_TRUE(remat::testing::bitwise_equal(x.exp(), x.grad()));
}

}  // namespace
