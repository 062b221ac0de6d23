// hostile_test.cpp: the hostile-inputs suite. Each test is a way an
// adversarial user could break a promise of remat (exact gradients, peak <=
// budget, no crash, no orphaned process, clear errors on bad input), run
// against the library and the built tool:
//  - compression of inf, NaN, denormals and extremes, for every stored type;
//  - views as stage outputs; undefined stage outputs;
//  - guards that die before or after their graphs, on other threads;
//  - two forwards before one backward; a stage throwing in recomputation;
//  - policies that answer out of range;
//  - budgets at the limits of the integers;
//  - signals to the launcher of local workers;
//  - oversized and irregular chain files, bad flags;
//  - allocations that fail while a recomputation or a profile starts.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <models/mlp.h>
#include "planning/plan_executor.h"
#include "remat/remat.h"
#include "test_util.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using remat::CompressedType;
using remat::testing::bitwise_equal;
using remat::testing::grads_of;

// ---- compression --------------------------------------------------------

/// `saved` as backward sees it through CompressActivations of `type`: mul
/// saves it for the gradient of a leaf of ones, so that gradient is the
/// restored tensor itself.
torch::Tensor restored_through(
    const torch::Tensor& saved, CompressedType type) {
  auto leaf = torch::ones_like(saved).requires_grad_(true);
  torch::Tensor loss;
  {
    remat::CompressActivations guard(remat::CompressOptions().type(type));
    loss = (leaf * saved).sum();
  }
  loss.backward();
  return leaf.grad();
}

const char* name_of(CompressedType type) {
  switch (type) {
    case CompressedType::kBFloat16:
      return "bf16";
    case CompressedType::kFloat16:
      return "fp16";
    case CompressedType::kInt8:
      break;
  }
  return "int8";
}

/// Every non-finite element of `original` is restored exactly (same inf,
/// a NaN for a NaN), and every finite one stays finite.
void expect_specials_kept(
    const torch::Tensor& original, const torch::Tensor& restored) {
  ASSERT_EQ(original.sizes(), restored.sizes());
  const auto a = original.to(torch::kDouble).contiguous().view(-1);
  const auto b = restored.to(torch::kDouble).contiguous().view(-1);
  const auto* x = a.data_ptr<double>();
  const auto* y = b.data_ptr<double>();
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (std::isnan(x[i])) {
      EXPECT_TRUE(std::isnan(y[i]))
          << "element " << i << ": NaN became " << y[i];
    } else if (std::isinf(x[i])) {
      EXPECT_EQ(x[i], y[i]) << "element " << i;
    } else {
      EXPECT_TRUE(std::isfinite(y[i]))
          << "element " << i << ": finite " << x[i] << " became " << y[i];
    }
  }
}

/// The largest error rounding to `type` may make on the finite elements of
/// `original` (relative for the float types, half a scale step for int8).
void expect_rounded_within(
    const torch::Tensor& original,
    const torch::Tensor& restored,
    CompressedType type) {
  const auto finite = torch::isfinite(original);
  const auto a = original.to(torch::kDouble).masked_select(finite);
  const auto b = restored.to(torch::kDouble).masked_select(finite);
  if (a.numel() == 0) {
    return;
  }
  const double max_abs = a.abs().max().item<double>();
  torch::Tensor allowed;
  switch (type) {
    case CompressedType::kBFloat16:  // 8 significant bits; fp32 denormals too
      allowed = a.abs() * (1.0 / 256) + 1e-38;
      break;
    case CompressedType::kFloat16:  // 11 significant bits; below 2^-14:
                                    // absolute
      allowed = a.abs() * (1.0 / 2048) + 6.2e-5;
      break;
    case CompressedType::kInt8:
      allowed = torch::full_like(a, max_abs / 127.0 * 0.5001);
      break;
  }
  const auto excess = ((a - b).abs() - allowed).max().item<double>();
  EXPECT_LE(excess, 0) << name_of(type) << ": an element is off by more than "
                       << "its rounding allows";
}

class HostileCompression : public ::testing::TestWithParam<CompressedType> {};

TEST_P(HostileCompression, KeepsInfAndNanExactlyAndFiniteValuesFinite) {
  const CompressedType type = GetParam();
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float max = std::numeric_limits<float>::max();
  const float denormal = std::numeric_limits<float>::denorm_min() * 1000;
  torch::manual_seed(1);
  std::vector<torch::Tensor> cases = {
      // log(p) with one zero probability, as in a masked cross-entropy.
      [] {
        auto p = torch::softmax(torch::randn({4, 50}), 1);
        p[0][0] = 0;
        return p.log();
      }(),
      [&] {
        auto t = torch::randn({8, 64});
        t[1][2] = inf;
        t[3][4] = -inf;
        t[5][6] = nan;
        return t;
      }(),
      torch::full({64, 4}, denormal),  // all denormal
      [&] {                            // fp32's extremes
        auto t = torch::randn({16, 16});
        t[0][0] = max;
        t[0][1] = -max;
        return t;
      }(),
      torch::randn({32, 32}) * 1e5,                       // beyond fp16
      torch::randn({32, 32}).to(torch::kDouble) * 1e300,  // beyond fp32
      [&] {                                               // mostly non-finite
        auto t = torch::full({16, 16}, inf);
        t[0][0] = 1;
        return t;
      }(),
      torch::empty({0, 8}),
  };
  for (size_t k = 0; k < cases.size(); ++k) {
    SCOPED_TRACE("case " + std::to_string(k));
    const torch::Tensor restored = restored_through(cases[k], type);
    ASSERT_EQ(restored.scalar_type(), cases[k].scalar_type());
    expect_specials_kept(cases[k], restored);
    expect_rounded_within(cases[k], restored, type);
  }
}

INSTANTIATE_TEST_SUITE_P(
    EveryType,
    HostileCompression,
    ::testing::Values(
        CompressedType::kBFloat16,
        CompressedType::kFloat16,
        CompressedType::kInt8),
    [](const ::testing::TestParamInfo<CompressedType>& info) {
      return std::string(name_of(info.param));
    });

TEST(Hostile, Int8GradientsAreFiniteWhereThePlainRunsAre) {
  torch::manual_seed(3);
  auto p = torch::softmax(torch::randn({4, 50}), 1);
  p[0][0] = 0;
  const auto q0 = torch::softmax(torch::randn({4, 50}), 1);
  auto run = [&](bool compressed) {
    auto q = q0.clone().requires_grad_(true);
    torch::Tensor loss;
    {
      std::optional<remat::CompressActivations> guard;
      if (compressed) {
        guard.emplace(remat::CompressOptions().type(CompressedType::kInt8));
      }
      loss = (q * (p * 1).log()).sum();
    }
    loss.backward();
    return q.grad();
  };
  const torch::Tensor plain = run(false);
  const torch::Tensor int8 = run(true);
  EXPECT_TRUE(torch::equal(torch::isfinite(plain), torch::isfinite(int8)))
      << "finite in the plain run: "
      << torch::isfinite(plain).sum().item<int64_t>()
      << ", with int8: " << torch::isfinite(int8).sum().item<int64_t>();
}

// ---- views and undefined outputs as stage outputs -----------------------

/// The chain of a stage that returns a small view of a large activation.
std::vector<remat::Stage> view_chain() {
  std::vector<remat::Stage> stages;
  auto linear = [](int64_t in, int64_t out) {
    return std::make_shared<torch::nn::LinearImpl>(in, out);
  };
  auto first = linear(64, 64);
  stages.push_back(
      {[first](const torch::Tensor& x) { return first->forward(x); }, first});
  auto wide = linear(64, 1024);
  stages.push_back(
      {[wide](const torch::Tensor& x) { return torch::tanh(wide->forward(x)); },
       wide});
  stages.push_back(
      {[](const torch::Tensor& x) { return x.narrow(1, 0, 64); }, nullptr});
  for (int k = 0; k < 4; ++k) {
    auto block = std::make_shared<torch::nn::SequentialImpl>(
        torch::nn::Linear(64, 4096),
        torch::nn::Tanh(),
        torch::nn::Linear(4096, 64));
    stages.push_back(
        {[block](const torch::Tensor& x) { return block->forward(x); }, block});
  }
  auto last = linear(64, 64);
  stages.push_back(
      {[last](const torch::Tensor& x) { return last->forward(x); }, last});
  return stages;
}

/// Parameter and input gradients and the activation peak (input included,
/// as simulate() counts it) of one step of `forward`.
struct StepResult {
  std::vector<torch::Tensor> grads;
  int64_t peak_bytes = 0;
};
StepResult step(
    const std::vector<remat::Stage>& stages,
    const torch::Tensor& input,
    const std::function<torch::Tensor(const torch::Tensor&)>& forward) {
  for (const auto& stage : stages) {
    if (stage.module) {
      for (auto& parameter : stage.module->parameters()) {
        parameter.mutable_grad() = torch::zeros_like(parameter);
      }
    }
  }
  StepResult result;
  {
    remat::MemoryMeter meter;
    torch::Tensor loss = forward(input).sum();
    loss.backward();
    result.peak_bytes = meter.peak_delta_bytes() -
                        2 * static_cast<int64_t>(loss.nbytes()) +
                        static_cast<int64_t>(input.nbytes());
  }
  for (const auto& stage : stages) {
    if (stage.module) {
      for (const auto& parameter : stage.module->parameters()) {
        result.grads.push_back(parameter.grad().clone());
      }
    }
  }
  return result;
}

TEST(Hostile, AStageReturningAViewStaysWithinItsBudget) {
  torch::manual_seed(5);
  const std::vector<remat::Stage> stages = view_chain();
  const torch::Tensor input = torch::randn({32, 64});
  const remat::planner::Chain chain = remat::profile_chain(
      stages, input, remat::ProfileOptions().warmup(1).repeats(1));
  // The view's stage holds a compact copy: its output is its own 8 KiB.
  EXPECT_EQ(chain.stage(2).output_bytes, 32 * 64 * 4);
  const StepResult plain = step(stages, input, [&](const torch::Tensor& x) {
    return remat::detail::run_stages(stages, x);
  });
  const int64_t minimum = remat::planner::min_feasible_budget_bytes(chain);
  const int64_t store_all =
      remat::planner::simulate(chain, remat::planner::solve_store_all(chain))
          .peak_bytes;
  for (const remat::Budget& budget :
       {remat::Budget::bytes(minimum),
        remat::Budget::bytes(minimum + (store_all - minimum) / 2)}) {
    SCOPED_TRACE(budget.to_string());
    const remat::planner::Plan plan = remat::plan_within(chain, budget);
    remat::PlannedChain net(stages, plan);
    const StepResult planned = step(
        stages, input, [&](const torch::Tensor& x) { return net->forward(x); });
    remat::testing::expect_all_bitwise_equal(
        plain.grads, planned.grads, "view chain");
    const int64_t predicted = remat::planner::simulate(chain, plan).peak_bytes;
    EXPECT_LE(planned.peak_bytes, budget.resolve_bytes(chain))
        << "plan " << plan.to_string() << ", predicted " << predicted;
    EXPECT_LE(planned.peak_bytes, predicted);
  }
}

TEST(Hostile, AStageReturningAViewOfItsInputIsCountedAsItsOwn) {
  torch::manual_seed(6);
  auto wide = std::make_shared<torch::nn::LinearImpl>(64, 2048);
  auto narrow_head = std::make_shared<torch::nn::LinearImpl>(16, 16);
  std::vector<remat::Stage> stages = {
      {[wide](const torch::Tensor& x) { return wide->forward(x).relu(); },
       wide},
      {[](const torch::Tensor& x) {
         return x.select(1, 3).unsqueeze(1).expand({-1, 16});
       },
       nullptr},
      {[narrow_head](const torch::Tensor& x) {
         return narrow_head->forward(x);
       },
       narrow_head},
  };
  const torch::Tensor input = torch::randn({64, 64});
  const auto chain = remat::profile_chain(stages, input);
  const StepResult plain = step(stages, input, [&](const torch::Tensor& x) {
    return remat::detail::run_stages(stages, x);
  });
  const remat::planner::Plan plan = remat::plan_within(
      chain,
      remat::Budget::bytes(remat::planner::min_feasible_budget_bytes(chain)));
  remat::PlannedChain net(stages, plan);
  const StepResult planned = step(
      stages, input, [&](const torch::Tensor& x) { return net->forward(x); });
  remat::testing::expect_all_bitwise_equal(
      plain.grads, planned.grads, "input view");
  EXPECT_LE(
      planned.peak_bytes, remat::planner::simulate(chain, plan).peak_bytes);
}

TEST(Hostile, RandomStagesCostNoUncountedBytesToReplay) {
  // Each planned stage's first forward captures the RNG state and every
  // recomputation replays it; neither may allocate a tensor (a CPU
  // generator's state is 5 KiB, more than this chain's activations at some
  // ops), or the measured peak rises above the prediction.
  torch::manual_seed(8);
  auto model = remat::models::mlp_chain(
      remat::models::MlpChainOptions({32, 32, 32, 32, 10}).dropout(0.1));
  const std::vector<remat::Stage> stages = remat::stages_of(model);
  const torch::Tensor input = torch::randn({16, 32});
  const auto chain = remat::profile_chain(model, input);
  const int64_t store_all =
      remat::planner::simulate(chain, remat::planner::solve_store_all(chain))
          .peak_bytes;
  const int64_t minimum = remat::planner::min_feasible_budget_bytes(chain);
  torch::manual_seed(9);
  const StepResult plain = step(stages, input, [&](const torch::Tensor& x) {
    return remat::detail::run_stages(stages, x);
  });
  for (const int64_t budget : {store_all, minimum}) {
    SCOPED_TRACE("budget " + std::to_string(budget));
    const remat::planner::Plan plan =
        remat::plan_within(chain, remat::Budget::bytes(budget));
    remat::PlannedChain net(stages, plan);
    torch::manual_seed(9);
    const StepResult planned = step(
        stages, input, [&](const torch::Tensor& x) { return net->forward(x); });
    remat::testing::expect_all_bitwise_equal(
        plain.grads, planned.grads, "dropout chain");
    EXPECT_LE(
        planned.peak_bytes, remat::planner::simulate(chain, plan).peak_bytes)
        << plan.to_string();
  }
}

TEST(Hostile, ALossAsTheLastStageIsPredictedToTheByte) {
  // A cross-entropy after the chain is memory no plan counts (on this tiny
  // model, the step's peak); as the chain's last stage it is counted.
  torch::manual_seed(11);
  auto model = remat::models::mlp_chain(
      remat::models::MlpChainOptions({32, 32, 32, 10}).dropout(0.1));
  std::vector<remat::Stage> stages = remat::stages_of(model);
  torch::Tensor targets = torch::randint(10, {64}, torch::kLong);
  stages.push_back(
      {[&targets](const torch::Tensor& logits) {
         return torch::nn::functional::cross_entropy(logits, targets);
       },
       nullptr});
  const torch::Tensor input = torch::randn({64, 32});
  const auto chain = remat::profile_chain(stages, input);
  torch::manual_seed(12);
  const StepResult plain = step(stages, input, [&](const torch::Tensor& x) {
    return remat::detail::run_stages(stages, x);
  });
  const int64_t minimum = remat::planner::min_feasible_budget_bytes(chain);
  for (const remat::planner::Plan& plan :
       {remat::planner::solve_store_all(chain),
        remat::plan_within(chain, remat::Budget::bytes(minimum))}) {
    SCOPED_TRACE(plan.to_string());
    remat::PlannedChain net(stages, plan);
    torch::manual_seed(12);
    const StepResult planned = step(
        stages, input, [&](const torch::Tensor& x) { return net->forward(x); });
    remat::testing::expect_all_bitwise_equal(
        plain.grads, planned.grads, "loss stage");
    EXPECT_EQ(
        planned.peak_bytes, remat::planner::simulate(chain, plan).peak_bytes);
  }
}

/// A stage module with a large constant buffer (as a causal mask is), read
/// by its forward and never written.
struct MaskedLinearImpl : torch::nn::Module {
  MaskedLinearImpl() {
    linear = register_module("linear", torch::nn::Linear(64, 64));
    mask = register_buffer("mask", torch::ones({512, 512}, torch::kBool));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return linear->forward(x).tanh() * mask[0][0];
  }
  torch::nn::Linear linear{nullptr};
  torch::Tensor mask;
};
TORCH_MODULE(MaskedLinear);

TEST(Hostile, AConstantBufferIsNotCountedAsARecomputationBackup) {
  // A re-run copies aside the buffers a stage's forward writes (BatchNorm's
  // statistics), not constant ones: the prediction must not carry a 256 KiB
  // copy per stage that never happens.
  torch::manual_seed(10);
  std::vector<remat::Stage> stages;
  for (int k = 0; k < 3; ++k) {
    MaskedLinear module;
    stages.push_back(
        {[module](const torch::Tensor& x) mutable {
           return module->forward(x);
         },
         module.ptr()});
  }
  const torch::Tensor input = torch::randn({8, 64});
  const auto chain = remat::profile_chain(stages, input);
  for (int64_t i = 0; i < chain.size(); ++i) {
    EXPECT_LT(chain.stage(i).forward_tmp_bytes, 512 * 512) << "stage " << i;
  }
  const StepResult plain = step(stages, input, [&](const torch::Tensor& x) {
    return remat::detail::run_stages(stages, x);
  });
  const int64_t minimum = remat::planner::min_feasible_budget_bytes(chain);
  for (const remat::planner::Plan& plan :
       {remat::planner::solve_store_all(chain),
        remat::plan_within(chain, remat::Budget::bytes(minimum))}) {
    SCOPED_TRACE(plan.to_string());
    remat::PlannedChain net(stages, plan);
    const StepResult planned = step(
        stages, input, [&](const torch::Tensor& x) { return net->forward(x); });
    remat::testing::expect_all_bitwise_equal(
        plain.grads, planned.grads, "masked chain");
    const int64_t predicted = remat::planner::simulate(chain, plan).peak_bytes;
    EXPECT_LE(planned.peak_bytes, predicted);
    EXPECT_GE(planned.peak_bytes, static_cast<int64_t>(0.9 * predicted))
        << "measured " << planned.peak_bytes << ", predicted " << predicted;
  }
}

TEST(Hostile, AnUndefinedStageOutputIsAnErrorNamingTheStage) {
  auto linear = std::make_shared<torch::nn::LinearImpl>(8, 8);
  std::vector<remat::Stage> stages = {
      {[linear](const torch::Tensor& x) { return linear->forward(x); }, linear},
      {[](const torch::Tensor&) { return torch::Tensor(); }, nullptr},
  };
  const torch::Tensor input = torch::randn({4, 8});
  try {
    remat::profile_chain(stages, input);
    ADD_FAILURE() << "profile_chain accepted an undefined stage output";
  } catch (const c10::Error& error) {
    EXPECT_NE(std::string(error.what()).find("stage 1"), std::string::npos)
        << error.what();
    EXPECT_NE(std::string(error.what()).find("undefined"), std::string::npos)
        << error.what();
  }
  remat::PlannedChain net(
      stages, remat::planner::solve_store_all(remat::detail::unit_chain(2)));
  try {
    net->forward(input.requires_grad_(true));
    ADD_FAILURE() << "PlannedChain accepted an undefined stage output";
  } catch (const c10::Error& error) {
    EXPECT_NE(std::string(error.what()).find("stage 1"), std::string::npos)
        << error.what();
  }
}

// ---- guards and graphs that die in any order ------------------------------

TEST(Hostile, SaveToFileSurvivesGraphsThatDieBeforeTheGuard) {
  auto weight = torch::randn({256, 512}).requires_grad_(true);
  for (int i = 0; i < 20; ++i) {  // a loss never backpropagated
    remat::SaveToFile spill;
    auto loss = torch::relu(torch::randn({256, 256}).mm(weight)).tanh().sum();
  }
  for (int i = 0; i < 5; ++i) {  // an exception leaving the forward
    try {
      remat::SaveToFile spill;
      auto hidden = torch::relu(torch::randn({256, 256}).mm(weight)).tanh();
      throw std::runtime_error("out of data");
    } catch (const std::runtime_error&) {
    }
  }
  // A graph that outlives its guard and dies on another thread, unused.
  torch::Tensor loss;
  {
    remat::SaveToFile spill;
    loss = torch::relu(torch::randn({64, 256}).mm(weight)).tanh().sum();
  }
  std::thread([moved = std::move(loss)]() mutable {
    moved = torch::Tensor();
  }).join();
  // And a normal step still trains exactly.
  const auto x = torch::randn({64, 256});
  auto run = [&](bool spill) {
    weight.mutable_grad() = torch::Tensor();
    torch::Tensor l;
    {
      std::optional<remat::SaveToFile> guard;
      if (spill) {
        guard.emplace();
      }
      l = torch::relu(x.mm(weight)).tanh().sum();
    }
    l.backward();
    return weight.grad().clone();
  };
  EXPECT_TRUE(bitwise_equal(run(false), run(true)));
}

TEST(Hostile, SaveToFileBackwardOnAnotherThreadAfterTheGuard) {
  auto weight = torch::randn({128, 128}).requires_grad_(true);
  const auto x = torch::randn({32, 128});
  torch::Tensor loss;
  {
    remat::SaveToFile spill;
    loss = torch::relu(x.mm(weight)).tanh().sum();
  }
  std::thread([moved = std::move(loss)]() mutable { moved.backward(); }).join();
  const torch::Tensor spilled = weight.grad().clone();
  weight.mutable_grad() = torch::Tensor();
  torch::relu(x.mm(weight)).tanh().sum().backward();
  EXPECT_TRUE(bitwise_equal(weight.grad(), spilled));
}

// ---- steps that overlap or fail halfway -----------------------------------

// A chain with BatchNorm and dropout, as stages, and a graph of the same
// modules; `fail` makes the BatchNorm stage throw on its next forward.
struct OverlapNet {
  torch::nn::Linear first{8, 8};
  torch::nn::BatchNorm1d norm{8};
  torch::nn::Linear last{8, 8};
  torch::nn::ModuleList modules;
  std::shared_ptr<bool> fail = std::make_shared<bool>(false);
  std::vector<torch::Tensor> initial_buffers;

  OverlapNet() {
    torch::manual_seed(3);
    first = torch::nn::Linear(8, 8);
    norm = torch::nn::BatchNorm1d(8);
    last = torch::nn::Linear(8, 8);
    modules->push_back(first);
    modules->push_back(norm);
    modules->push_back(last);
    for (const auto& buffer : modules->buffers()) {
      initial_buffers.push_back(buffer.clone());
    }
  }

  std::vector<remat::Stage> chain() const {
    return {
        {[first = first](const torch::Tensor& x) mutable {
           return torch::tanh(first(x));
         },
         first.ptr()},
        {[norm = norm, fail = fail](const torch::Tensor& x) mutable {
           torch::Tensor y = norm(x);
           if (*fail) {
             *fail = false;
             throw std::runtime_error("a stage failed");
           }
           return torch::dropout(torch::relu(y), 0.3, true);
         },
         norm.ptr()},
        {[last = last](const torch::Tensor& x) mutable { return last(x); },
         last.ptr()},
    };
  }

  // The chain's stages with skips: 2 reads 1 and 0.
  std::vector<remat::GraphStage> graph() const {
    const std::vector<remat::Stage> s = chain();
    using In = const std::vector<torch::Tensor>&;
    return {
        {[f = s[0].forward](In in) { return f(in[0]); }, s[0].module, {-1}},
        {[f = s[1].forward](In in) { return f(in[0]); }, s[1].module, {0}},
        {[f = s[2].forward](In in) { return f(in[0]) * in[1]; },
         s[2].module,
         {1, 0}},
    };
  }

  void restart() {
    torch::NoGradGuard no_grad;
    auto buffers = modules->buffers();
    for (size_t i = 0; i < buffers.size(); ++i) {
      buffers[i].copy_(initial_buffers[i]);
    }
    for (auto& parameter : modules->parameters()) {
      parameter.mutable_grad() = torch::Tensor();
    }
  }

  std::vector<torch::Tensor> buffers() const {
    std::vector<torch::Tensor> copies;
    for (const auto& buffer : modules->buffers()) {
      copies.push_back(buffer.clone());
    }
    return copies;
  }

  // Two forwards (gradient accumulation), then one backward of both: the
  // parameter and input gradients and the buffers.
  std::vector<torch::Tensor> accumulated_step(
      const std::function<torch::Tensor(const torch::Tensor&)>& forward) {
    restart();
    torch::manual_seed(11);
    torch::Tensor a = torch::randn({5, 8}).requires_grad_();
    torch::Tensor b = torch::randn({5, 8}).requires_grad_();
    (forward(a).sum() + forward(b).pow(2).sum()).backward();
    std::vector<torch::Tensor> result = grads_of(*modules);
    result.push_back(a.grad());
    result.push_back(b.grad());
    for (const auto& buffer : modules->buffers()) {
      result.push_back(buffer.clone());
    }
    return result;
  }
};

torch::Tensor run_chain(
    const std::vector<remat::Stage>& stages, const torch::Tensor& input) {
  torch::Tensor x = input;
  for (const auto& stage : stages) {
    x = stage.forward(x);
  }
  return x;
}

using Layer = std::function<torch::Tensor(const torch::Tensor&)>;
// What one step leaves: gradients (parameters, then leaves) and buffers.
using Gradients = std::vector<torch::Tensor>;

// Runs `step` (a training step around one layer) with the layer run plainly,
// then planned by each chain plan in `chain_plans` and each graph schedule of
// `graph_modes` (profiled on a [5, 8] input), and checks every planned step
// bitwise against the plain one of its kind.
void expect_planned_layers_match(
    const OverlapNet& net,
    const std::vector<const char*>& chain_plans,
    const std::vector<std::vector<remat::planner::StageMode>>& graph_modes,
    const std::function<Gradients(const Layer&)>& step) {
  const std::vector<remat::Stage> chain = net.chain();
  const Gradients plain_chain =
      step([&](const torch::Tensor& x) { return run_chain(chain, x); });
  for (const char* text : chain_plans) {
    SCOPED_TRACE(text);
    remat::PlannedChain planned(chain, remat::planner::plan_from_string(text));
    remat::testing::expect_all_bitwise_equal(
        plain_chain,
        step([&](const torch::Tensor& x) { return planned->forward(x); }),
        "chain");
  }
  const std::vector<remat::GraphStage> graph = net.graph();
  const Gradients plain_graph =
      step([&](const torch::Tensor& x) { return remat::run_graph(graph, x); });
  const remat::planner::Graph structure = remat::profile_graph(
      graph,
      torch::randn({5, 8}),
      remat::ProfileOptions().warmup(0).repeats(1));
  for (const auto& modes : graph_modes) {
    const remat::planner::Plan plan =
        remat::planner::schedule_graph(structure, modes);
    SCOPED_TRACE(plan.to_string());
    remat::PlannedGraph planned(graph, plan);
    remat::testing::expect_all_bitwise_equal(
        plain_graph,
        step([&](const torch::Tensor& x) { return planned->forward(x); }),
        "graph");
  }
}

// Both forwards' records live at once and each backward finds its own.
TEST(Hostile, TwoForwardsBeforeOneBackwardMatchThePlainRun) {
  OverlapNet net;
  using remat::planner::StageMode;
  expect_planned_layers_match(
      net,
      {"C0 N1 R2 B2 R0 R1 B1 B0", "C0 C1 R2 B2 R1 B1 R0 B0"},
      {{StageMode::kRecompute, StageMode::kRecompute, StageMode::kRecord},
       {StageMode::kCheckpoint, StageMode::kRecompute, StageMode::kRecord}},
      [&](const Layer& layer) { return net.accumulated_step(layer); });
}

// A stage that throws while it is recomputed in backward leaves the buffers
// as the forward left them (updated once), and the next step is the plain
// one.
TEST(Hostile, AStageThrowingDuringRecomputationLeavesNothingHalfChanged) {
  OverlapNet net;
  const std::vector<remat::Stage> chain = net.chain();
  const torch::Tensor input = torch::randn({5, 8});
  const auto step =
      [&](const std::function<torch::Tensor(const torch::Tensor&)>& forward) {
        net.restart();
        torch::manual_seed(11);
        forward(input.clone().requires_grad_()).sum().backward();
        std::vector<torch::Tensor> result = grads_of(*net.modules);
        for (const auto& buffer : net.modules->buffers()) {
          result.push_back(buffer.clone());
        }
        return result;
      };
  const auto plain =
      step([&](const torch::Tensor& x) { return run_chain(chain, x); });
  const std::vector<torch::Tensor> plain_buffers(
      plain.end() - static_cast<int64_t>(net.initial_buffers.size()),
      plain.end());
  remat::PlannedChain planned(
      chain, remat::planner::plan_from_string("C0 N1 R2 B2 R0 R1 B1 B0"));
  net.restart();
  torch::manual_seed(11);
  torch::Tensor output = planned->forward(input.clone().requires_grad_());
  *net.fail = true;  // stage 1 throws when backward recomputes it
  EXPECT_THROW(output.sum().backward(), std::exception);
  EXPECT_FALSE(*net.fail) << "the stage was not recomputed";
  remat::testing::expect_all_bitwise_equal(
      plain_buffers, net.buffers(), "buffers after the failed backward");
  remat::testing::expect_all_bitwise_equal(
      plain,
      step([&](const torch::Tensor& x) { return planned->forward(x); }),
      "the next step");
}

// ---- planned nets inside larger programs ----------------------------------

// A planned chain or graph is one layer of a larger program: its input may
// be computed by autograd before it (not a leaf), be a view of a larger
// tensor, come from another planned net, and the whole may sit inside
// remat::checkpoint. Every composition matches the same program run plainly,
// the gradient of the program's leaf, of every parameter and the buffers.
TEST(Hostile, PlannedNetsComposedIntoLargerProgramsMatchThePlainRun) {
  OverlapNet net;
  const torch::Tensor data = torch::randn({7, 8});
  using Program =
      std::function<torch::Tensor(const Layer&, const torch::Tensor&)>;
  const std::vector<std::pair<std::string, Program>> programs = {
      {"a computed input",
       [](const Layer& layer, const torch::Tensor& x) {
         return layer(torch::sin(x.narrow(0, 0, 5)) * 3);
       }},
      {"a view input",
       [](const Layer& layer, const torch::Tensor& x) {
         return layer(x.narrow(0, 2, 5));
       }},
      {"the layer twice in a row",
       [](const Layer& layer, const torch::Tensor& x) {
         return layer(layer(x.narrow(0, 1, 5)));
       }},
      {"inside remat::checkpoint",
       [](const Layer& layer, const torch::Tensor& x) {
         return remat::checkpoint(
             [&layer](const torch::Tensor& y) { return layer(y) * 2; },
             x.narrow(0, 0, 5));
       }},
  };
  using remat::planner::StageMode;
  for (const auto& [name, program] : programs) {
    SCOPED_TRACE(name);
    expect_planned_layers_match(
        net,
        {"R0 R1 R2 B2 B1 B0",
         "C0 N1 R2 B2 R0 R1 B1 B0",
         "C0 C1 R2 B2 R1 B1 R0 B0"},
        {{StageMode::kRecord, StageMode::kRecord, StageMode::kRecord},
         {StageMode::kRecompute, StageMode::kRecompute, StageMode::kRecord},
         {StageMode::kCheckpoint, StageMode::kRecompute, StageMode::kRecord}},
        [&, &program = program](const Layer& layer) {
          net.restart();
          torch::manual_seed(11);
          torch::Tensor leaf = data.clone().requires_grad_();
          program(layer, leaf).pow(2).sum().backward();
          Gradients result = grads_of(*net.modules);
          result.push_back(leaf.grad());
          for (const auto& buffer : net.modules->buffers()) {
            result.push_back(buffer.clone());
          }
          return result;
        });
  }
}

// ---- policies -------------------------------------------------------------

TEST(Hostile, APolicyAnswerOutsideTheEnumIsRefused) {
  auto w = torch::randn({8, 8}).requires_grad_(true);
  remat::CheckpointOptions options;
  options.policy([](const remat::OpContext&) {
    return static_cast<remat::CheckpointPolicy>(7);
  });
  try {
    auto y = remat::checkpoint(
        [&](const torch::Tensor& x) { return x.mm(w).relu(); },
        torch::randn({4, 8}),
        options);
    y.sum().backward();
    ADD_FAILURE() << "an out-of-range policy answer was accepted";
  } catch (const c10::Error& error) {
    EXPECT_NE(
        std::string(error.what()).find("CheckpointPolicy value 7"),
        std::string::npos)
        << error.what();
  }
}

// ---- budgets --------------------------------------------------------------

TEST(Hostile, BudgetsAreParsedInExactIntegers) {
  EXPECT_EQ(
      remat::Budget::parse("9007199254740993").budget_bytes(),
      int64_t{9007199254740993});
  EXPECT_EQ(
      remat::Budget::parse("1152921504606846976").budget_bytes(),
      int64_t{1} << 60);
  EXPECT_THROW(remat::Budget::parse("1152921504606846977"), c10::Error);
  EXPECT_THROW(remat::Budget::parse("99999999999999999999999999"), c10::Error);
  EXPECT_EQ(remat::Budget::parse("1.5KiB").budget_bytes(), 1536);
  EXPECT_THROW(remat::Budget::parse("0.5000000000000000000000B"), c10::Error);
  EXPECT_THROW(remat::Budget::parse("1.0000000000000000000001GiB"), c10::Error);
  EXPECT_EQ(
      remat::Budget::parse("2.50000000000000000000000MiB").budget_bytes(),
      int64_t{5} << 19);
}

// ---- the tool: signals, oversized and irregular input, bad flags ---------

fs::path scratch() {
  const fs::path folder = fs::temp_directory_path() /
                          ("remat_hostile_" + std::to_string(::getpid()));
  fs::create_directories(folder);
  return folder;
}

/// Starts the built tool with `arguments` (argv[1..]), stdout and stderr to
/// files in the scratch folder; returns its pid.
pid_t spawn_remat(
    const std::vector<std::string>& arguments, const std::string& tag) {
  std::vector<std::string> argv_text = {REMAT_CLI_PATH};
  argv_text.insert(argv_text.end(), arguments.begin(), arguments.end());
  std::vector<char*> argv;
  for (std::string& text : argv_text) {
    argv.push_back(text.data());
  }
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  const std::string out = (scratch() / (tag + ".out")).string();
  const std::string err = (scratch() / (tag + ".err")).string();
  posix_spawn_file_actions_addopen(
      &actions, STDOUT_FILENO, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(
      &actions, STDERR_FILENO, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  const int failed = posix_spawn(
      &pid, REMAT_CLI_PATH, &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (failed != 0) {
    throw std::runtime_error("posix_spawn failed");
  }
  return pid;
}

std::string read_file(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

#if REMAT_WITH_DISTRIBUTED  // the launcher is remat::distributed's
/// Live (not zombie) processes whose environment names `launcher` as their
/// REMAT_LAUNCHER_PID: the workers it started.
std::vector<pid_t> workers_of(pid_t launcher) {
  const std::string needle = "REMAT_LAUNCHER_PID=" + std::to_string(launcher);
  std::vector<pid_t> workers;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) {
      continue;
    }
    const std::string stat = read_file(entry.path() / "stat");
    const size_t close = stat.rfind(')');
    if (close == std::string::npos || close + 2 >= stat.size() ||
        stat[close + 2] == 'Z') {
      continue;
    }
    const std::string environment = read_file(entry.path() / "environ");
    size_t start = 0;
    while (start < environment.size()) {
      const size_t end = environment.find('\0', start);
      const std::string variable = environment.substr(
          start, (end == std::string::npos ? environment.size() : end) - start);
      if (variable == needle) {
        workers.push_back(static_cast<pid_t>(std::stol(name)));
        break;
      }
      if (end == std::string::npos) {
        break;
      }
      start = end + 1;
    }
  }
  return workers;
}

/// Waits up to `seconds` for `condition`; true if it held.
template <typename Condition>
bool wait_for(double seconds, Condition condition) {
  const auto until =
      std::chrono::steady_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  while (!condition()) {
    if (std::chrono::steady_clock::now() >= until) {
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

class HostileLauncher : public ::testing::TestWithParam<int> {};

TEST_P(HostileLauncher, NoWorkerOutlivesTheLauncher) {
  const int signal_number = GetParam();
  const std::string tag = "launch_" + std::to_string(signal_number);
  const pid_t launcher = spawn_remat(
      {"train",
       "--model",
       "mlp",
       "--layers",
       "2",
       "--hidden",
       "32",
       "--batch",
       "8",
       "--nproc",
       "2",
       "--steps",
       "100000000",
       "--threads",
       "1"},
      tag);
  const bool started =
      wait_for(60, [&] { return workers_of(launcher).size() == 2; });
  if (!started) {
    ::kill(launcher, SIGKILL);
    ::waitpid(launcher, nullptr, 0);
    FAIL() << "the workers did not start: "
           << read_file(scratch() / (tag + ".err"));
  }
  // Each worker handles SIGTERM from the start of its main(): wait for that
  // (bit 15 of SigCgt in /proc/PID/status), so that the message can be
  // checked; a worker killed before has no message, but is gone all the same.
  auto handles_sigterm = [](pid_t pid) {
    const std::string status =
        read_file("/proc/" + std::to_string(pid) + "/status");
    const size_t at = status.find("SigCgt:");
    return at != std::string::npos &&
           (std::stoull(status.substr(at + 7), nullptr, 16) >> (SIGTERM - 1) &
            1) != 0;
  };
  EXPECT_TRUE(wait_for(60, [&] {
    for (const pid_t worker : workers_of(launcher)) {
      if (!handles_sigterm(worker)) {
        return false;
      }
    }
    return true;
  }));
  ASSERT_EQ(::kill(launcher, signal_number), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(launcher, &status, 0), launcher);
  EXPECT_TRUE(wait_for(5, [&] { return workers_of(launcher).empty(); }))
      << workers_of(launcher).size() << " workers left 5 s after signal "
      << signal_number << " to the launcher";
  for (const pid_t worker : workers_of(launcher)) {
    ::kill(worker, SIGKILL);  // leave nothing behind even on failure
  }
  const std::string err = read_file(scratch() / (tag + ".err"));
  if (signal_number == SIGKILL) {
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    EXPECT_NE(
        err.find("its launcher (pid " + std::to_string(launcher) + ") is gone"),
        std::string::npos)
        << err;
  } else {
    ASSERT_TRUE(WIFEXITED(status)) << "status " << status;
    EXPECT_EQ(WEXITSTATUS(status), 128 + signal_number) << err;
    EXPECT_NE(
        err.find(
            "the launcher received signal " + std::to_string(signal_number)),
        std::string::npos)
        << err;
  }
}

INSTANTIATE_TEST_SUITE_P(
    EverySignal,
    HostileLauncher,
    ::testing::Values(SIGKILL, SIGTERM, SIGINT, SIGHUP),
    [](const ::testing::TestParamInfo<int>& info) {
      return std::string(strsignal(info.param)).substr(0, 4) +
             std::to_string(info.param);
    });
#endif  // REMAT_WITH_DISTRIBUTED

/// Runs the tool to completion; its exit code, stdout and stderr.
struct Finished {
  int exit_code = -1;
  std::string out;
  std::string err;
};
Finished run_remat(
    const std::vector<std::string>& arguments, const std::string& tag) {
  const pid_t pid = spawn_remat(arguments, tag);
  int status = 0;
  ::waitpid(pid, &status, 0);
  Finished result;
  result.exit_code =
      WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.out = read_file(scratch() / (tag + ".out"));
  result.err = read_file(scratch() / (tag + ".err"));
  return result;
}

/// A chain file of `stages` identical stages.
fs::path long_chain(int64_t stages) {
  const fs::path path =
      scratch() / ("chain_" + std::to_string(stages) + ".json");
  std::ofstream file(path);
  file << "{\"input_bytes\": 4096, \"stages\": [";
  for (int64_t i = 0; i < stages; ++i) {
    file << (i ? "," : "")
         << "{\"forward_ms\": 1, \"backward_ms\": 2, \"output_bytes\": 4096, "
            "\"saved_bytes\": 16384, \"forward_tmp_bytes\": 0, "
            "\"backward_tmp_bytes\": 0}";
  }
  file << "]}";
  return path;
}

TEST(HostileTool, AChainOfTenThousandStagesIsPlannedOrRefusedAtOnce) {
  const fs::path chain = long_chain(10000);
  for (const std::string strategy : {"sqrt", "uniform:50", "chen", "none"}) {
    SCOPED_TRACE(strategy);
    const Finished result = run_remat(
        {"plan", chain.string(), "--strategy", strategy, "--json"},
        "long_" + strategy.substr(0, 4));
    ASSERT_EQ(result.exit_code, 0) << result.err;
    const auto text = result.out;
    EXPECT_NE(text.find("\"min_feasible_bytes\": null"), std::string::npos);
  }
  const Finished optimal = run_remat(
      {"plan", chain.string(), "--strategy", "optimal", "--budget", "50%"},
      "long_optimal");
  EXPECT_NE(optimal.exit_code, 0);
  EXPECT_NE(optimal.err.find("10000 stages"), std::string::npos) << optimal.err;
  EXPECT_NE(optimal.err.find("at most 1000"), std::string::npos) << optimal.err;
}

TEST(HostileTool, IrregularFilesAreRefusedWithoutReadingThem) {
  const fs::path fifo = scratch() / "chain.fifo";
  fs::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  Finished result = run_remat({"plan", fifo.string()}, "fifo");
  EXPECT_EQ(result.exit_code, 1) << result.err;  // a usage error
  EXPECT_NE(result.err.find("not a regular file"), std::string::npos)
      << result.err;
  result = run_remat({"plan", scratch().string()}, "directory");
  EXPECT_EQ(result.exit_code, 1) << result.err;  // a usage error
  EXPECT_NE(result.err.find("is a directory"), std::string::npos) << result.err;
  result = run_remat(
      {"train", "--data", scratch().string(), "--steps", "1"}, "data_dir");
  EXPECT_EQ(result.exit_code, 1) << result.err;  // a usage error
  EXPECT_NE(result.err.find("--data"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("is a directory"), std::string::npos) << result.err;
}

TEST(HostileTool, BadFlagsAreNamedWithTheirValue) {
  Finished result = run_remat({"train", "--lr", "-1"}, "lr");
  EXPECT_EQ(result.exit_code, 1) << result.err;  // a usage error
  EXPECT_NE(result.err.find("--lr"), std::string::npos) << result.err;
  EXPECT_NE(
      result.err.find("expected a positive number, got '-1'"),
      std::string::npos)
      << result.err;
  EXPECT_LT(result.err.size(), 400u) << result.err;
  result = run_remat({"fit", "--model", "mlp", "--cap", "0"}, "cap");
  EXPECT_EQ(result.exit_code, 1) << result.err;  // a usage error
  EXPECT_NE(result.err.find("--cap"), std::string::npos) << result.err;
  EXPECT_EQ(result.err.find('%'), std::string::npos) << result.err;
  result = run_remat(
      {"plan", long_chain(3).string(), "--budget", "1152921504606846977B"},
      "huge_budget");
  EXPECT_EQ(result.exit_code, 1) << result.err;  // a usage error
  EXPECT_NE(result.err.find("at most 1 EiB"), std::string::npos) << result.err;
}

// Allocation failures while remat prepares a recomputation or a profile
// leave the caller's RNG state and gradients as they were.

/// The process's address space limited to what it maps now plus `headroom`
/// bytes while alive: a larger allocation fails with c10's out-of-memory
/// error.
class AddressSpaceLimit {
 public:
  /// Under AddressSanitizer, whose allocator maps memory of its own and
  /// aborts when it cannot, the limit would kill the test: those tests skip.
  static bool usable() {
#if defined(__SANITIZE_ADDRESS__)
    return false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
    return false;
#else
    return true;
#endif
#else
    return true;
#endif
  }
  explicit AddressSpaceLimit(int64_t headroom) {
    getrlimit(RLIMIT_AS, &saved_);
    std::ifstream status("/proc/self/status");
    std::string line;
    int64_t mapped = 0;
    while (std::getline(status, line)) {
      if (line.rfind("VmSize:", 0) == 0) {
        mapped = std::stoll(line.substr(7)) * 1024;
      }
    }
    rlimit limited = saved_;
    limited.rlim_cur = static_cast<rlim_t>(mapped + headroom);
    setrlimit(RLIMIT_AS, &limited);
  }
  ~AddressSpaceLimit() {
    setrlimit(RLIMIT_AS, &saved_);
  }

 private:
  rlimit saved_{};
};

torch::Tensor cpu_rng_state() {
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

struct BigBufferImpl : torch::nn::Module {
  BigBufferImpl() {
    register_buffer("big", torch::zeros({int64_t{64} << 20}));  // 256 MiB
    linear = register_module("linear", torch::nn::Linear(8, 8));
    dropout = register_module("dropout", torch::nn::Dropout(0.5));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return dropout(torch::tanh(linear(x)));
  }
  torch::nn::Linear linear{nullptr};
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(BigBuffer);

class FailureInjection : public ::testing::TestWithParam<remat::Mode> {};

// The recomputation backs up the module's buffers; when that backup cannot
// be allocated, the backward fails with the allocator's error, and the RNG
// state is the one before the backward (not the forward's, which would make
// the next step draw the dropout masks of this one again).
TEST_P(FailureInjection, AFailedBufferBackupLeavesTheRngStateAsItWas) {
  if (!AddressSpaceLimit::usable()) {
    GTEST_SKIP() << "an address-space limit under AddressSanitizer";
  }
  BigBuffer module;
  torch::manual_seed(3);
  const torch::Tensor x = torch::randn({4, 8}, torch::requires_grad());
  const torch::Tensor loss =
      remat::checkpoint(module, x, remat::CheckpointOptions().mode(GetParam()))
          .sum();
  const torch::Tensor before = cpu_rng_state();
  std::string message;
  {
    const AddressSpaceLimit limit(int64_t{32} << 20);
    message = remat::testing::error_message_of([&] { loss.backward(); });
  }
  EXPECT_NE(message.find("can't allocate memory"), std::string::npos)
      << message;
  EXPECT_TRUE(remat::testing::bitwise_equal(before, cpu_rng_state()));
  EXPECT_FALSE(remat::is_recomputing());
}

INSTANTIATE_TEST_SUITE_P(
    Modes,
    FailureInjection,
    remat::testing::both_modes(),
    remat::testing::mode_test_name);

struct HugeParameterImpl : torch::nn::Module {
  HugeParameterImpl() {
    weight = register_parameter("weight", torch::zeros({int64_t{64} << 20}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return x * weight[0];
  }
  torch::Tensor weight;
};
TORCH_MODULE(HugeParameter);

// The profiler preallocates every parameter's gradient; when one cannot be
// allocated, the gradients the caller had (accumulated over earlier
// micro-batches) are still there, not zeros.
TEST(FailureInjectionProfile, AFailedGradientAllocationKeepsTheCallersGrads) {
  if (!AddressSpaceLimit::usable()) {
    GTEST_SKIP() << "an address-space limit under AddressSanitizer";
  }
  torch::manual_seed(0);
  torch::nn::Linear small(8, 8);
  HugeParameter huge;
  const torch::Tensor x = torch::randn({4, 8});
  small(x).sum().backward();
  const torch::Tensor grad = small->weight.grad().clone();
  const std::vector<remat::Stage> stages{
      {[&](const torch::Tensor& t) { return small(t); }, small.ptr()},
      {[&](const torch::Tensor& t) { return huge(t); }, huge.ptr()}};
  std::string message;
  {
    const AddressSpaceLimit limit(int64_t{32} << 20);
    message = remat::testing::error_message_of([&] {
      remat::profile_chain(
          stages, x, remat::ProfileOptions().cold_write_max_bytes(0));
    });
  }
  EXPECT_NE(message.find("can't allocate memory"), std::string::npos)
      << message;
  EXPECT_TRUE(remat::testing::bitwise_equal(grad, small->weight.grad()));
  EXPECT_FALSE(huge->weight.grad().defined());
}

}  // namespace
