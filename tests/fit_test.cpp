// fit_test.cpp: fit_batch on a chain of residual MLP blocks: every answer was
// measured under the cap, checkpointing fits more than no checkpointing and
// the optimal plan at least as much as checkpoint_sequential, and each
// answer is near the largest that fits (20 % more does not fit).
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/fit.h"
#include "remat/remat.h"

namespace {

struct ResidualImpl : torch::nn::Module {
  ResidualImpl()
      : fc1(register_module("fc1", torch::nn::Linear(64, 256))),
        fc2(register_module("fc2", torch::nn::Linear(256, 64))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return x + fc2(torch::relu(fc1(x)));
  }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Residual);

std::vector<remat::Stage> residual_stages(int64_t blocks) {
  torch::manual_seed(2);
  torch::nn::Sequential model;
  for (int64_t i = 0; i < blocks; ++i) {
    model->push_back(Residual());
  }
  return remat::stages_of(model);
}

torch::Tensor rows(int64_t batch) {
  return torch::randn({batch, 64});
}

TEST(
    FitBatch,
    CheckpointingFitsLargerBatchesAndEveryAnswerWasMeasuredUnderTheCap) {
  const auto stages = residual_stages(16);
  constexpr int64_t kCap = 8 << 20;
  const auto answers = remat::fit_batch(rows, stages, kCap);
  ASSERT_EQ(answers.size(), 3u);
  EXPECT_EQ(answers[0].strategy, "none");
  EXPECT_EQ(answers[1].strategy, "checkpoint_sequential");
  EXPECT_EQ(answers[2].strategy, "optimal");
  for (const auto& answer : answers) {
    SCOPED_TRACE(answer.strategy);
    std::cout << "[ fit      ] " << answer.strategy << ": batch "
              << answer.batch << ", measured " << answer.measured_peak_bytes
              << " of " << kCap << " bytes, " << answer.ms_per_sample()
              << " ms per sample\n";
    ASSERT_GT(answer.batch, 0);
    EXPECT_LE(answer.measured_peak_bytes, kCap);
    EXPECT_LE(answer.predicted_peak_bytes, kCap);
    EXPECT_GT(answer.measured_step_ms, 0);
    EXPECT_GT(answer.ms_per_sample(), 0);
    // Near the largest: 20 % more does not fit the strategy's prediction.
    const int64_t more =
        static_cast<int64_t>(std::ceil(answer.batch * 1.2)) + 1;
    const auto chain = remat::profile_chain(stages, rows(more));
    const int64_t store_all =
        remat::planner::simulate(chain, remat::planner::solve_store_all(chain))
            .peak_bytes;
    if (answer.strategy == "none") {
      EXPECT_GT(store_all, kCap) << "batch " << more << " fits too";
    } else if (answer.strategy == "optimal") {
      EXPECT_GT(remat::planner::min_feasible_budget_bytes(chain), kCap)
          << "batch " << more << " fits too";
    }
  }
  EXPECT_GT(answers[1].batch, answers[0].batch);
  EXPECT_GE(answers[2].batch, answers[1].batch);
  EXPECT_GT(answers[1].segments, 0);
}

TEST(FitBatch, RefusesBadArguments) {
  const auto stages = residual_stages(2);
  EXPECT_THROW(remat::fit_batch(rows, stages, 0), c10::Error);
  EXPECT_THROW(
      remat::fit_batch(
          rows, stages, 1 << 20, remat::FitOptions().probe_batch(0)),
      c10::Error);
  try {
    remat::fit_batch(
        [](int64_t) {
          return torch::randn({3, 64});
        },
        stages,
        1 << 20);
    ADD_FAILURE() << "expected an error for an input of the wrong batch";
  } catch (const c10::Error& error) {
    EXPECT_NE(
        std::string(error.what()).find("first dimension is 4, got [3, 64]"),
        std::string::npos)
        << error.what();
  }
}

}  // namespace
