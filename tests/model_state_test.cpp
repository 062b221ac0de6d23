// The model state of a training step (parameters, gradients, optimizer
// state) as profile_chain and model_state_of count it, and total budgets,
// which subtract it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include "remat/budget.h"
#include "remat/plan_choice.h"
#include "remat/planner.h"
#include "remat/profile.h"

namespace {

using remat::Budget;
using remat::planner::ModelState;

// Linear(4, 8): 32 weights + 8 biases = 160 bytes in fp32.
constexpr int64_t kLinearBytes = (4 * 8 + 8) * 4;

TEST(ModelStateOf, CountsParametersBuffersGradientsAndTheOptimizer) {
  torch::nn::Sequential model(
      torch::nn::Linear(4, 8), torch::nn::BatchNorm1d(8), torch::nn::ReLU());
  // BatchNorm1d(8): weight and bias (64 bytes, trainable), running mean and
  // variance (64 bytes) and num_batches_tracked (one int64).
  const int64_t batch_norm_parameters = 2 * 8 * 4;
  const int64_t batch_norm_buffers = 2 * 8 * 4 + 8;
  const ModelState state = remat::model_state_of(remat::stages_of(model));
  EXPECT_EQ(
      state.parameter_bytes,
      kLinearBytes + batch_norm_parameters + batch_norm_buffers);
  EXPECT_EQ(state.gradient_bytes, kLinearBytes + batch_norm_parameters);
  EXPECT_EQ(state.optimizer_bytes, 2 * state.gradient_bytes);  // the default
  EXPECT_EQ(
      remat::model_state_of(remat::stages_of(model), 0).optimizer_bytes, 0);
  EXPECT_EQ(
      remat::model_state_of(remat::stages_of(model), 1).optimizer_bytes,
      state.gradient_bytes);
}

TEST(ModelStateOf, CountsASharedModuleOnceAndFrozenParametersWithoutGradients) {
  torch::nn::Linear shared(4, 4);  // 80 bytes
  torch::nn::Linear frozen(4, 4);
  for (auto& parameter : frozen->parameters()) {
    parameter.requires_grad_(false);
  }
  const auto forward = [](torch::nn::Linear layer) {
    return [layer](const torch::Tensor& x) mutable { return layer(x); };
  };
  const std::vector<remat::Stage> stages = {
      {forward(shared), shared.ptr()},
      {forward(shared), shared.ptr()},
      {forward(frozen), frozen.ptr()},
      {[](const torch::Tensor& x) { return x.relu(); }, nullptr}};
  const ModelState state = remat::model_state_of(stages);
  EXPECT_EQ(state.parameter_bytes, 2 * 80);
  EXPECT_EQ(state.gradient_bytes, 80);
  EXPECT_EQ(state.optimizer_bytes, 160);
}

TEST(ModelStateOf, RefusesABadRatioBeforeProfiling) {
  torch::nn::Sequential model(torch::nn::Linear(4, 8));
  for (const double ratio : {-1.0, 65.0, std::nan("")}) {
    EXPECT_THROW(
        remat::model_state_of(remat::stages_of(model), ratio), c10::Error)
        << ratio;
    EXPECT_THROW(
        remat::profile_chain(
            model,
            torch::randn({2, 4}),
            remat::ProfileOptions().optimizer_state_ratio(ratio)),
        c10::Error)
        << ratio;
  }
}

TEST(ProfileChain, CarriesTheModelStateOfItsOptimizer) {
  torch::nn::Sequential model(torch::nn::Linear(4, 8), torch::nn::ReLU());
  const torch::Tensor sample = torch::randn({2, 4});
  const auto adam = remat::profile_chain(model, sample);
  EXPECT_EQ(
      adam.model_state(),
      (ModelState{kLinearBytes, kLinearBytes, 2 * kLinearBytes}));
  const auto sgd = remat::profile_chain(
      model, sample, remat::ProfileOptions().optimizer_state_ratio(0));
  EXPECT_EQ(sgd.model_state(), (ModelState{kLinearBytes, kLinearBytes, 0}));
}

TEST(TotalBudget, ParsesOnlyBytesAfterItsPrefix) {
  EXPECT_EQ(Budget::parse("total:16GiB"), Budget::total(16LL << 30));
  EXPECT_EQ(Budget::parse(" TOTAL: 512MiB ").budget_bytes(), 512LL << 20);
  EXPECT_TRUE(Budget::parse("total:1000000B").is_total());
  EXPECT_EQ(Budget::parse("total:1GiB").kind(), Budget::Kind::kTotal);
  for (const std::string text :
       {"total:",
        "total:50%",
        "total:none",
        "total:-1GiB",
        "total:1XB",
        "total:0B"}) {
    try {
      Budget::parse(text);
      FAIL() << "accepted '" << text << "'";
    } catch (const c10::Error& error) {
      EXPECT_NE(
          std::string(error.what_without_backtrace()).find("'" + text + "'"),
          std::string::npos)
          << error.what_without_backtrace();
    }
  }
  EXPECT_THROW(Budget::total(0), c10::Error);
  EXPECT_NE(
      Budget::total(16LL << 30).to_string().find("with the model state"),
      std::string::npos);
}

TEST(TotalBudget, LeavesTheActivationsWhatTheModelStateDoesNot) {
  remat::planner::StageCost stage;
  stage.forward_ms = 1;
  stage.backward_ms = 1;
  stage.output_bytes = 100;
  stage.saved_bytes = 100;
  const remat::planner::Chain chain(
      {stage, stage, stage}, 100, 0, ModelState{1000, 1000, 2000});
  EXPECT_EQ(Budget::total(4500).resolve_bytes(chain), 500);
  EXPECT_EQ(Budget::total(4001).resolve_bytes(chain), 1);
  for (const int64_t total : {int64_t{4000}, int64_t{10}}) {
    try {
      Budget::total(total).resolve_bytes(chain);
      FAIL() << "resolved a total of " << total;
    } catch (const c10::Error& error) {
      const std::string what = error.what_without_backtrace();
      EXPECT_NE(what.find("leaves nothing for activations"), std::string::npos)
          << what;
      EXPECT_NE(what.find("optimizer state"), std::string::npos) << what;
    }
  }
  // A plan within the total keeps the activations within what is left.
  const int64_t left = Budget::total(4550).resolve_bytes(chain);
  const auto plan = remat::plan_within(chain, Budget::total(4550));
  EXPECT_LE(remat::planner::simulate(chain, plan).peak_bytes, left);
}

}  // namespace
