// dynamic_test.cpp: DynamicRemat, saved tensors under a byte budget with no
// plan.
//
// Reference: the plain run of the same model from the same parameters and
// seed; gradients must be bitwise equal at every budget. The counters of the
// scope show that a tight budget really evicts and recomputes (so the
// equality is not vacuous), and the tracking allocator bounds the peak.
#include <functional>
#include <optional>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "models/models.h"
#include "remat/remat.h"
#include "test_util.h"

namespace {

using remat::DynamicRemat;
using remat::DynamicRematOptions;
using remat::testing::bitwise_equal;
using remat::testing::expect_all_bitwise_equal;
using remat::testing::grads_of;

constexpr int64_t kWidth = 64;
constexpr int64_t kBatch = 256;
constexpr int64_t kMaxBlocks = 8;

/// A forward whose number of blocks depends on the data, each block
/// h + fc2(dropout(relu(fc1(h)))): dropout and a skip connection.
struct LoopNetImpl : torch::nn::Module {
  LoopNetImpl() {
    for (int64_t i = 0; i < kMaxBlocks; ++i) {
      up.push_back(register_module(
          "up" + std::to_string(i), torch::nn::Linear(kWidth, 4 * kWidth)));
      down.push_back(register_module(
          "down" + std::to_string(i), torch::nn::Linear(4 * kWidth, kWidth)));
    }
  }

  /// How many blocks this input runs: 4 to kMaxBlocks, from its values.
  static int64_t blocks_for(const torch::Tensor& x) {
    const double total = x.detach().abs().sum().item<double>();
    return 4 + static_cast<int64_t>(total) % (kMaxBlocks - 3);
  }

  torch::Tensor block(int64_t i, const torch::Tensor& h) {
    auto inner = torch::relu(up[i]->forward(h));
    inner = torch::dropout(inner, /*p=*/0.2, /*train=*/true);
    return h + down[i]->forward(inner);
  }

  torch::Tensor forward(torch::Tensor x) {
    const int64_t blocks = blocks_for(x);
    torch::Tensor h = x;
    for (int64_t i = 0; i < blocks; ++i) {
      h = block(i, h);
    }
    return h.tanh().pow(2).mean();
  }

  std::vector<torch::nn::Linear> up, down;
};
TORCH_MODULE(LoopNet);

struct Step {
  std::vector<torch::Tensor> grads;
  torch::Tensor input_grad;
  int64_t peak_delta_bytes = 0;
};

/// One training step from seed 7, optionally inside a scope with `budget`;
/// `stats` receives the scope's counters.
Step run_step(
    LoopNet& model,
    const torch::Tensor& input,
    std::optional<int64_t> budget,
    remat::DynamicRematStats* stats = nullptr) {
  model->zero_grad();
  for (auto& parameter : model->parameters()) {
    parameter.mutable_grad() = torch::zeros_like(parameter);
  }
  torch::Tensor x = input.detach().clone().requires_grad_(true);
  torch::manual_seed(7);
  Step step;
  {
    remat::MemoryMeter meter;
    std::optional<DynamicRemat> scope;
    if (budget) {
      scope.emplace(DynamicRematOptions().budget_bytes(*budget));
    }
    torch::Tensor loss = model->forward(x);
    loss.backward();
    step.peak_delta_bytes = meter.peak_delta_bytes();
    if (scope && stats != nullptr) {
      *stats = scope->stats();
    }
  }
  step.grads = grads_of(*model);
  step.input_grad = x.grad().clone();
  return step;
}

torch::Tensor sample_input(int64_t batch = kBatch) {
  torch::manual_seed(3);
  return torch::randn({batch, kWidth});
}

/// Bytes one block saves for backward in a plain run (the activations the
/// budget is about): the saved inputs of both linears, the relu output, the
/// dropout mask.
int64_t block_saved_bytes(int64_t batch = kBatch) {
  return batch * (kWidth + 3 * 4 * kWidth) * 4;
}

/// A block's working set: what it saves, and what its backward holds on
/// top (the gradients arriving at its output and leaving its input, the
/// gradient of its hidden activation, and the small buffers reductions and
/// the autograd engine allocate, which vary with the thread count).
int64_t block_working_set_bytes(int64_t batch = kBatch) {
  return block_saved_bytes(batch) + batch * (2 * kWidth + 4 * kWidth) * 4;
}

TEST(DynamicRemat, GradientsAreBitwiseThePlainOnesAtABudgetThatEvictsNothing) {
  LoopNet model;
  const torch::Tensor input = sample_input();
  ASSERT_GE(LoopNetImpl::blocks_for(input), 4);
  const Step plain = run_step(model, input, std::nullopt);
  remat::DynamicRematStats stats;
  const Step dynamic = run_step(model, input, int64_t{1} << 30, &stats);
  expect_all_bitwise_equal(plain.grads, dynamic.grads, "parameter grad");
  EXPECT_TRUE(bitwise_equal(plain.input_grad, dynamic.input_grad));
  EXPECT_EQ(stats.evictions, 0);
  EXPECT_EQ(stats.rematerializations, 0);
  EXPECT_GT(stats.recorded_calls, 0);
  EXPECT_GT(stats.saved_tensors, 0);
  // Activations only: parameters (and views of them, such as a linear's
  // transposed weight) are not counted.
  EXPECT_LE(stats.tracked_peak_bytes, plain.peak_delta_bytes);
  // Every block's activations were tracked.
  EXPECT_GE(
      stats.tracked_peak_bytes,
      LoopNetImpl::blocks_for(input) * block_saved_bytes() * 3 / 4);
}

TEST(DynamicRemat, GradientsAreBitwiseThePlainOnesAtATightBudget) {
  LoopNet model;
  const torch::Tensor input = sample_input();
  const int64_t blocks = LoopNetImpl::blocks_for(input);
  const Step plain = run_step(model, input, std::nullopt);
  const int64_t budget = 2 * block_saved_bytes();
  remat::DynamicRematStats stats;
  const Step dynamic = run_step(model, input, budget, &stats);
  expect_all_bitwise_equal(plain.grads, dynamic.grads, "parameter grad");
  EXPECT_TRUE(bitwise_equal(plain.input_grad, dynamic.input_grad));
  // Not vacuous: tensors were evicted and recomputed.
  EXPECT_GT(stats.evictions, 0);
  EXPECT_GT(stats.rematerializations, 0);
  // Tracked bytes stay within the budget plus the block being worked on.
  EXPECT_LE(stats.tracked_peak_bytes, budget + block_saved_bytes())
      << "blocks " << blocks << ", evictions " << stats.evictions
      << ", rematerializations " << stats.rematerializations;
  // The measured peak falls well below the plain run's.
  EXPECT_LT(dynamic.peak_delta_bytes, plain.peak_delta_bytes)
      << "blocks " << blocks;
  // And the measured one (gradients in flight included) within the budget
  // plus one block's working set.
  EXPECT_LE(dynamic.peak_delta_bytes, budget + block_working_set_bytes())
      << "plain " << plain.peak_delta_bytes << ", blocks " << blocks
      << ", evictions " << stats.evictions;
}

TEST(DynamicRemat, DifferentInputsRunDifferentBlockCountsAndStillMatch) {
  LoopNet model;
  for (int64_t batch : {kBatch, kBatch / 2 + 3}) {
    torch::manual_seed(11 + batch);
    const torch::Tensor input = torch::randn({batch, kWidth});
    const Step plain = run_step(model, input, std::nullopt);
    remat::DynamicRematStats stats;
    const Step dynamic =
        run_step(model, input, block_saved_bytes(batch), &stats);
    expect_all_bitwise_equal(plain.grads, dynamic.grads, "parameter grad");
    EXPECT_GT(stats.evictions, 0) << "batch " << batch;
  }
}

TEST(DynamicRemat, BackwardAfterTheScopeEndedIsBitwiseThePlainOne) {
  LoopNet model;
  const torch::Tensor input = sample_input();
  const Step plain = run_step(model, input, std::nullopt);

  model->zero_grad();
  for (auto& parameter : model->parameters()) {
    parameter.mutable_grad() = torch::zeros_like(parameter);
  }
  torch::Tensor x = input.detach().clone().requires_grad_(true);
  torch::manual_seed(7);
  torch::Tensor loss;
  remat::DynamicRematStats after_forward;
  {
    DynamicRemat scope(DynamicRematOptions().budget_bytes(block_saved_bytes()));
    loss = model->forward(x);
    after_forward = scope.stats();
  }
  loss.backward();
  EXPECT_GT(after_forward.evictions, 0);
  expect_all_bitwise_equal(plain.grads, grads_of(*model), "parameter grad");
  EXPECT_TRUE(bitwise_equal(plain.input_grad, x.grad()));
}

/// Views, in-place writes and aliasing: a transposed view, slices (chunk),
/// a reshape and a view, an in-place relu on an intermediate, an in-place add
/// of a view of the input.
/// Stage 1: a product, an in-place relu on it, two chunk views of it
/// multiplied (saving both views of one storage).
torch::Tensor views_stage1(const torch::Tensor& x, const torch::Tensor& w1) {
  auto h = torch::mm(x, w1);
  h.relu_();
  auto halves = h.chunk(2, /*dim=*/1);
  return halves[0] * halves[1];
}

/// Stage 2: a transposed copy, a reshape and a view, a sigmoid (saving its
/// output); with `write_saved`, that output is then written in place.
torch::Tensor views_stage2(const torch::Tensor& a, bool write_saved) {
  auto t = a.t().contiguous();
  auto r = t.reshape({-1}).view({a.size(1), a.size(0)});
  auto s = torch::sigmoid(r);
  if (write_saved) {
    s.mul_(2);
  } else {
    s = s * 2;
  }
  return s;
}

/// Stage 3: a product with a transposed view (saved as such), an in-place
/// add of a view of the input.
torch::Tensor views_stage3(
    const torch::Tensor& s, const torch::Tensor& w2, const torch::Tensor& x) {
  auto u = torch::mm(s.t(), w2);
  u.add_(x.narrow(1, 0, u.size(1)));
  return torch::tanh(u).sum();
}

TEST(DynamicRemat, ViewsAndInPlaceWritesMatchThePlainRun) {
  torch::manual_seed(5);
  const int64_t n = 128, d = 32;
  auto x = torch::randn({n, d}).requires_grad_(true);
  auto w1 = torch::randn({d, 2 * d}).requires_grad_(true);
  auto w2 = torch::randn({d, d}).requires_grad_(true);
  auto forward = [&](bool write_saved) {
    return views_stage3(views_stage2(views_stage1(x, w1), write_saved), w2, x);
  };
  forward(false).backward();
  const std::vector<torch::Tensor> expected = {
      x.grad().clone(), w1.grad().clone(), w2.grad().clone()};
  for (auto* tensor : {&x, &w1, &w2}) {
    tensor->mutable_grad() = torch::Tensor();
  }
  // The largest storage one operator saves is h's (n x 2d floats).
  const int64_t budget = n * 2 * d * 4 + n * d * 2;
  remat::DynamicRematStats stats;
  {
    DynamicRemat scope(DynamicRematOptions().budget_bytes(budget));
    forward(false).backward();
    stats = scope.stats();
  }
  expect_all_bitwise_equal(
      expected, {x.grad(), w1.grad(), w2.grad()}, "gradient");
  EXPECT_GT(stats.evictions, 0);
  EXPECT_GT(stats.rematerializations, 0);

  // Writing a saved tensor in place is refused at backward, as without a
  // scope (where autograd's own check refuses it).
  EXPECT_THROW(forward(true).backward(), c10::Error);
  {
    DynamicRemat scope(DynamicRematOptions().budget_bytes(budget));
    try {
      forward(true).backward();
      FAIL() << "a saved tensor written in place was not refused";
    } catch (const c10::Error& error) {
      EXPECT_NE(
          std::string(error.what_without_backtrace())
              .find("modified by an inplace operation"),
          std::string::npos)
          << error.what_without_backtrace();
    }
  }
}

/// A write through a view of a tensor made in the scope, then a read and a
/// write of the whole tensor: after the first write, the whole tensor is at a
/// version that no recorded call returned (only the view is sin_'s output).
torch::Tensor write_through_view(const torch::Tensor& x) {
  auto h = x * 2;
  h.narrow(0, 0, 2).sin_();
  auto s = h.sign().detach();
  h.mul_(s + 2);
  return (h.exp() * h.exp()).sum();
}

TEST(DynamicRemat, AWriteThroughAViewIsReplayedNotRefused) {
  torch::manual_seed(17);
  auto x = torch::randn({16, 32}).requires_grad_(true);
  write_through_view(x).backward();
  const torch::Tensor expected = x.grad().clone();
  x.mutable_grad() = torch::Tensor();
  remat::DynamicRematStats stats;
  {
    // One 16 x 32 float storage: what mul_ alone saves (s + 2).
    DynamicRemat scope(DynamicRematOptions().budget_bytes(16 * 32 * 4));
    write_through_view(x).backward();
    stats = scope.stats();
  }
  expect_all_bitwise_equal({expected}, {x.grad()}, "gradient");
  EXPECT_EQ(stats.untracked_saved_tensors, 0);
  EXPECT_GT(stats.evictions, 0);
  EXPECT_GT(stats.rematerializations, 0);
}

/// Saves conjugate and negative views next to the tensors they view: a
/// conjugate view (h.conj()) and a negative view (imag of a conjugate) share
/// their base's storage, geometry, dtype and version, and differ from it only
/// in their bits.
torch::Tensor conjugate_and_negative_views(const torch::Tensor& x) {
  torch::Tensor h = x * 1;
  for (int i = 0; i < 4; ++i) {
    h = (h * h.conj()).sin() + h;
    const torch::Tensor im = torch::imag(h.conj());
    h = torch::complex(torch::real(h) * im, im.sin());
  }
  return torch::real(h).sum();
}

TEST(DynamicRemat, ConjugateAndNegativeViewsMatchThePlainRun) {
  torch::manual_seed(6);
  const torch::Tensor x0 = torch::randn({64, 64}, torch::kComplexFloat);
  const auto grad = [&](std::optional<int64_t> budget,
                        remat::DynamicRematStats* stats) {
    torch::Tensor x = x0.clone().requires_grad_(true);
    std::optional<DynamicRemat> scope;
    if (budget) {
      scope.emplace(DynamicRematOptions().budget_bytes(*budget));
    }
    conjugate_and_negative_views(x).backward();
    if (scope) {
      *stats = scope->stats();
    }
    return x.grad().clone();
  };
  const torch::Tensor expected = grad(std::nullopt, nullptr);
  remat::DynamicRematStats loose;
  EXPECT_TRUE(bitwise_equal(expected, grad(int64_t{1} << 30, &loose)));
  EXPECT_EQ(loose.evictions, 0);
  remat::DynamicRematStats tight;
  const int64_t budget =
      std::max(loose.tracked_peak_bytes / 3, loose.largest_call_bytes);
  EXPECT_TRUE(bitwise_equal(expected, grad(budget, &tight)));
  EXPECT_GT(tight.evictions, 0);
  EXPECT_GT(tight.rematerializations, 0);
}

TEST(DynamicRemat, AGraphWithAWriteThroughAViewFreesItsSavedWhenDropped) {
  torch::manual_seed(19);
  const auto x = torch::randn({16, 32});
  const auto w = torch::randn({32, 32}) * 0.2;
  DynamicRemat scope(DynamicRematOptions().budget_bytes(1 << 20));
  for (int step = 0; step < 3; ++step) {
    {
      auto h = x.clone().requires_grad_(true);
      for (int block = 0; block < 4; ++block) {
        h = torch::dropout(torch::tanh(h.mm(w)) + h, 0.2, true);
        h.narrow(1, 0, 16).mul_(1.01);
        h = h.sin();
      }
      auto loss = (h * h).sum();  // dropped without backward
    }
    EXPECT_GT(scope.stats().tracked_peak_bytes, 0);
    EXPECT_EQ(scope.stats().tracked_bytes, 0) << "after step " << step;
  }
}

TEST(DynamicRemat, AGraphReadThroughAnUnrecordedCallFreesItsSavedWhenDropped) {
  // index takes a list of optional tensors: its output is recorded by no
  // call, and the calls that read it keep it as they keep a tensor from
  // outside the scope.
  torch::manual_seed(23);
  const auto x = torch::randn({16, 32});
  const auto w = torch::randn({32, 32}) * 0.2;
  const auto rows = torch::arange(0, 16, 2);
  DynamicRemat scope(DynamicRematOptions().budget_bytes(1 << 20));
  for (int step = 0; step < 3; ++step) {
    {
      auto a = x.clone().requires_grad_(true);
      auto h = torch::tanh(a.mm(w)).index({rows});
      auto loss = h.exp().sum();  // dropped without backward
    }
    EXPECT_GT(scope.stats().tracked_peak_bytes, 0);
    EXPECT_EQ(scope.stats().tracked_bytes, 0) << "after step " << step;
  }
}

TEST(DynamicRemat, RetainGraphRunsBackwardTwiceWithTheSameGradients) {
  LoopNet model;
  const torch::Tensor input = sample_input();
  auto twice = [&](std::optional<int64_t> budget,
                   remat::DynamicRematStats* stats) {
    model->zero_grad();
    torch::manual_seed(7);
    std::optional<DynamicRemat> scope;
    if (budget) {
      scope.emplace(DynamicRematOptions().budget_bytes(*budget));
    }
    torch::Tensor loss = model->forward(input);
    loss.backward({}, /*retain_graph=*/true);
    loss.backward();
    if (scope) {
      *stats = scope->stats();
    }
    return grads_of(*model);
  };
  remat::DynamicRematStats stats;
  const auto expected = twice(std::nullopt, &stats);
  const auto actual = twice(block_saved_bytes(), &stats);
  ASSERT_EQ(expected.size(), actual.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    // Blocks past this input's count get no gradient in either run.
    EXPECT_TRUE(
        remat::testing::bitwise_equal_or_both_undefined(expected[i], actual[i]))
        << "parameter grad #" << i;
  }
  EXPECT_GT(stats.rematerializations, 0);
}

TEST(DynamicRemat, ABudgetBelowOneOperatorIsRefusedNamingItAndTheBytes) {
  auto x = torch::randn({1024, 1024}).requires_grad_(true);
  auto w = torch::randn({1024, 1024}).requires_grad_(true);
  DynamicRemat scope(DynamicRematOptions().budget_bytes(1024));
  auto a = x * 2;  // saves nothing: a scalar product
  auto b = w * 2;
  try {
    auto y = torch::mm(a, b);
    FAIL() << "expected the budget to be refused";
  } catch (const c10::Error& error) {
    const std::string message = error.what_without_backtrace();
    EXPECT_NE(
        message.find("remat::DynamicRemat: budget 1.00 KiB is below what "
                     "aten::mm needs (4.00 MiB"),
        std::string::npos)
        << message;
  }
  // Nothing was tracked for the refused call; the scope stays usable.
  EXPECT_EQ(scope.stats().tracked_bytes, 0);
  auto small = torch::randn({4, 4}).requires_grad_(true);
  (small * small).sum().backward();
  EXPECT_TRUE(bitwise_equal(small * 2, small.grad()));
}

// largest_call_bytes is the least budget the code works with: exactly that
// budget runs it, one byte less refuses the call that needs it.
TEST(DynamicRemat, TheLargestCallsBytesAreTheLeastBudgetThatRuns) {
  auto x = torch::randn({256, 256}).requires_grad_(true);
  auto w = torch::randn({256, 256}).requires_grad_(true);
  const auto step = [&](int64_t budget) {
    DynamicRemat scope(DynamicRematOptions().budget_bytes(budget));
    // mm saves both of its 256 KiB operands, relu its 256 KiB result.
    auto y = torch::relu(torch::mm(x * 2, w * 2));
    torch::relu(torch::mm(y, w * 3)).sum().backward();
    return scope.stats();
  };
  const remat::DynamicRematStats roomy = step(64ll << 20);
  EXPECT_EQ(roomy.largest_call_bytes, 2 * 256 * 256 * 4);
  const remat::DynamicRematStats tight = step(roomy.largest_call_bytes);
  EXPECT_EQ(tight.largest_call_bytes, roomy.largest_call_bytes);
  EXPECT_GT(tight.evictions, 0);
  EXPECT_THROW(step(roomy.largest_call_bytes - 1), c10::Error);
}

TEST(DynamicRemat, InvalidOptionsAreRejectedWithTheValue) {
  for (int64_t budget : {int64_t{0}, int64_t{-5}}) {
    try {
      DynamicRemat scope(DynamicRematOptions().budget_bytes(budget));
      FAIL() << "accepted budget " << budget;
    } catch (const c10::Error& error) {
      const std::string message = error.what_without_backtrace();
      EXPECT_NE(
          message.find(
              "expected budget_bytes > 0, got " + std::to_string(budget)),
          std::string::npos)
          << message;
    }
  }
}

TEST(DynamicRemat, NestedScopesAndScopesUnderOtherHooksAreRefused) {
  {
    DynamicRemat outer(DynamicRematOptions().budget_bytes(1 << 20));
    EXPECT_THROW(
        DynamicRemat(DynamicRematOptions().budget_bytes(1 << 20)), c10::Error);
  }
  remat::SavedTensorHooks hooks(
      [](const torch::Tensor& t) -> std::any { return t; },
      [](const std::any& packed) {
        return std::any_cast<torch::Tensor>(packed);
      });
  try {
    DynamicRemat scope(DynamicRematOptions().budget_bytes(1 << 20));
    FAIL() << "opened under saved-tensor hooks";
  } catch (const c10::Error& error) {
    EXPECT_NE(
        std::string(error.what_without_backtrace()).find("checkpoint region"),
        std::string::npos);
  }
}

TEST(DynamicRemat, ACheckpointRegionInsideTheScopeKeepsItsOwnGradients) {
  torch::manual_seed(9);
  auto x = torch::randn({64, 32}).requires_grad_(true);
  auto w = torch::randn({32, 32}).requires_grad_(true);
  auto body = [&](const torch::Tensor& in) {
    return torch::dropout(torch::relu(torch::mm(in, w)), 0.3, true);
  };
  torch::manual_seed(1);
  body(body(x)).sum().backward();
  const std::vector<torch::Tensor> expected = {
      x.grad().clone(), w.grad().clone()};
  x.mutable_grad() = torch::Tensor();
  w.mutable_grad() = torch::Tensor();
  {
    DynamicRemat scope(DynamicRematOptions().budget_bytes(64 * 32 * 4));
    torch::manual_seed(1);
    auto h = body(x);
    remat::checkpoint(body, h).sum().backward();
  }
  expect_all_bitwise_equal(expected, {x.grad(), w.grad()}, "gradient");
}

}  // namespace

/// One step of `loss_of` inside a scope of `budget` bytes (none: plain), from
/// seed 31: parameter gradients and buffers after it, and the counters.
struct ModelStep {
  std::vector<torch::Tensor> grads, buffers;
  remat::DynamicRematStats stats;
};

ModelStep model_step(
    torch::nn::Module& model,
    const std::vector<torch::Tensor>& initial_buffers,
    const std::function<torch::Tensor()>& loss_of,
    std::optional<int64_t> budget) {
  {
    torch::NoGradGuard no_grad;
    auto buffers = model.buffers();
    for (size_t i = 0; i < buffers.size(); ++i) {
      buffers[i].copy_(initial_buffers[i]);
    }
  }
  model.zero_grad();
  torch::manual_seed(31);
  ModelStep step;
  {
    std::optional<DynamicRemat> scope;
    if (budget) {
      scope.emplace(DynamicRematOptions().budget_bytes(*budget));
    }
    loss_of().backward();
    if (scope) {
      step.stats = scope->stats();
    }
  }
  step.grads = grads_of(model);
  for (const auto& buffer : model.buffers()) {
    step.buffers.push_back(buffer.clone());
  }
  return step;
}

/// The built-in models (attention with dropout and masks, BatchNorm,
/// pooling, convolutions, concatenated skips, recurrent layers) at a third of
/// what they save, or what one call saves if more:
/// gradients and buffers bitwise the plain run's.
void expect_plain_at_a_third(
    torch::nn::Module& model, const std::function<torch::Tensor()>& loss_of) {
  std::vector<torch::Tensor> initial;
  for (const auto& buffer : model.buffers()) {
    initial.push_back(buffer.clone());
  }
  const ModelStep plain = model_step(model, initial, loss_of, std::nullopt);
  const ModelStep roomy = model_step(model, initial, loss_of, int64_t{1} << 40);
  ASSERT_EQ(roomy.stats.evictions, 0);
  // A third of the tracked peak, but not below one call's own saved tensors
  // (LibTorch 2.x runs a CPU LSTM layer as one mkldnn_rnn_layer call).
  const int64_t budget = std::max(
      roomy.stats.tracked_peak_bytes / 3, roomy.stats.largest_call_bytes);
  const ModelStep tight = model_step(model, initial, loss_of, budget);
  for (size_t i = 0; i < plain.grads.size(); ++i) {
    EXPECT_TRUE(remat::testing::bitwise_equal_or_both_undefined(
        plain.grads[i], tight.grads[i]))
        << "parameter grad #" << i;
  }
  expect_all_bitwise_equal(plain.buffers, tight.buffers, "buffer");
  EXPECT_GT(tight.stats.evictions, 0);
  EXPECT_GT(tight.stats.rematerializations, 0);
  EXPECT_LT(tight.stats.tracked_peak_bytes, roomy.stats.tracked_peak_bytes);
}

TEST(DynamicRemat, TheBuiltInGptMatchesThePlainRun) {
  namespace models = remat::models;
  torch::manual_seed(21);
  auto model = models::gpt(
      models::GptOptions().vocab(32).seq_len(64).layers(2).hidden(64).heads(4));
  const auto tokens = torch::randint(32, {4, 48});
  const auto targets = torch::randint(32, {4, 48});
  expect_plain_at_a_third(*model, [&] {
    return models::gpt_loss(model->forward(tokens), targets);
  });
}

TEST(DynamicRemat, TheBuiltInResNetWithBatchNormMatchesThePlainRun) {
  namespace models = remat::models;
  torch::manual_seed(23);
  auto model = models::resnet_chain(
      models::ResNetChainOptions().stage_channels({8, 16}).blocks_per_stage(1));
  const auto images = torch::randn({4, 3, 16, 16});
  expect_plain_at_a_third(*model, [&] { return model->forward(images).sum(); });
}

TEST(DynamicRemat, TheBuiltInUNetMatchesThePlainRun) {
  namespace models = remat::models;
  torch::manual_seed(25);
  models::UNet model(
      models::UNetOptions().levels(2).base_width(4).dropout(0.1));
  const auto images = torch::randn({2, 1, 16, 16});
  expect_plain_at_a_third(
      *model, [&] { return model->forward(images).pow(2).mean(); });
}

// LibTorch's CPU LSTM and GRU cells split their gates with unsafe_chunk,
// whose chunks have version counters of their own, and write them in place.
struct RecurrentNetImpl : torch::nn::Module {
  explicit RecurrentNetImpl(bool gru) {
    if (gru) {
      gru_ = register_module(
          "gru",
          torch::nn::GRU(
              torch::nn::GRUOptions(12, 16).num_layers(2).dropout(0.3)));
    } else {
      lstm_ = register_module(
          "lstm",
          torch::nn::LSTM(
              torch::nn::LSTMOptions(12, 16).num_layers(2).dropout(0.3)));
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const torch::Tensor out =
        gru_ ? std::get<0>(gru_->forward(x)) : std::get<0>(lstm_->forward(x));
    return out.tanh().pow(2).mean();
  }
  torch::nn::GRU gru_{nullptr};
  torch::nn::LSTM lstm_{nullptr};
};
TORCH_MODULE(RecurrentNet);

TEST(DynamicRemat, LstmAndGruMatchThePlainRun) {
  for (const bool gru : {false, true}) {
    SCOPED_TRACE(gru ? "GRU" : "LSTM");
    torch::manual_seed(27);
    RecurrentNet model(gru);
    const auto sequence = torch::randn({10, 4, 12});  // time, batch, features
    expect_plain_at_a_third(*model, [&] { return model->forward(sequence); });
  }
}

// In-place writes on unsafe_chunk's chunks, written out; and rrelu in
// training mode, which fills a noise tensor made inside the scope without
// moving its version counter.
struct ChunkedGatesImpl : torch::nn::Module {
  ChunkedGatesImpl() {
    for (int i = 0; i < 3; ++i) {
      gates.push_back(register_module(
          "gates" + std::to_string(i), torch::nn::Linear(16, 48)));
    }
  }
  torch::Tensor forward(torch::Tensor h) {
    for (torch::nn::Linear& layer : gates) {
      const std::vector<torch::Tensor> c = layer->forward(h).unsafe_chunk(3, 1);
      const torch::Tensor input = c[0].sigmoid_();
      const torch::Tensor forget = c[1].sigmoid_();
      const torch::Tensor cell = c[2].tanh_();
      h = torch::rrelu(forget * h + input * cell, 0.1, 0.3, /*training=*/true);
    }
    return (h.sin() * h).mean();
  }
  std::vector<torch::nn::Linear> gates;
};
TORCH_MODULE(ChunkedGates);

TEST(DynamicRemat, WritesVersionCountersMissMatchThePlainRun) {
  torch::manual_seed(29);
  ChunkedGates model;
  const auto input = torch::randn({32, 16});
  expect_plain_at_a_third(*model, [&] { return model->forward(input); });
}

// A chunk written in place, then read by a recorded call, then written
// again (through the base, whose version counter is not the chunk's, or
// through the chunk): a re-run of the read must see the value the forward
// read.
TEST(DynamicRemat, AReadOfAChunkWrittenAgainAfterwardsMatchesThePlainRun) {
  for (const bool through_base : {true, false}) {
    SCOPED_TRACE(through_base ? "the base written" : "the chunk written");
    torch::manual_seed(41);
    const auto x = torch::randn({8, 4}).requires_grad_(true);
    const auto w = torch::randn({8, 4}).requires_grad_(true);
    auto step = [&](std::optional<int64_t> budget,
                    remat::DynamicRematStats* stats) {
      x.mutable_grad() = torch::Tensor();
      w.mutable_grad() = torch::Tensor();
      std::optional<DynamicRemat> scope;
      if (budget) {
        scope.emplace(DynamicRematOptions().budget_bytes(*budget));
      }
      torch::Tensor h;
      {
        const torch::Tensor y = torch::mm(x, w.t());
        const std::vector<torch::Tensor> c = y.unsafe_chunk(2, 1);
        c[0].mul_(2);
        const torch::Tensor read = through_base ? c[0].sin() : c[0].exp();
        if (through_base) {
          y.add_(1);
        } else {
          c[0].zero_();
        }
        h = read * read;
      }
      for (int i = 0; i < 4; ++i) {
        h = h.sin();
      }
      h.sum().backward();
      if (scope && stats != nullptr) {
        *stats = scope->stats();
      }
      return std::vector<torch::Tensor>{x.grad().clone(), w.grad().clone()};
    };
    const auto plain = step(std::nullopt, nullptr);
    remat::DynamicRematStats roomy;
    step(int64_t{1} << 40, &roomy);
    ASSERT_GT(roomy.largest_call_bytes, 0);
    for (const int64_t factor : {1, 2}) {
      SCOPED_TRACE(factor);
      remat::DynamicRematStats stats;
      const auto tight = step(factor * roomy.largest_call_bytes, &stats);
      EXPECT_GT(stats.evictions, 0);
      expect_all_bitwise_equal(plain, tight, "gradient");
    }
  }
}

TEST(DynamicRemat, ALongChainOfRecipesIsFreedWithoutDeepRecursion) {
  // 60000 recorded calls, each recipe holding the previous value: freeing
  // them recursively would overflow the stack.
  auto x = torch::randn({4}).requires_grad_(true);
  remat::DynamicRematStats stats;
  {
    DynamicRemat scope(DynamicRematOptions().budget_bytes(1 << 20));
    torch::Tensor h = x;
    for (int i = 0; i < 30000; ++i) {
      h = torch::sin(h) + 1;
    }
    h.sum().backward();
    stats = scope.stats();
  }
  EXPECT_GE(stats.recorded_calls, 60000);
  EXPECT_TRUE(x.grad().defined());
}

TEST(DynamicRemat, TensorListsMultipleOutputsAndBranchesMatchThePlainRun) {
  torch::manual_seed(13);
  auto x = torch::randn({8, 4, 16, 16}).requires_grad_(true);
  auto w = torch::randn({8, 4, 3, 3}).requires_grad_(true);
  auto forward = [&] {
    torch::Tensor h = torch::conv2d(x, w, {}, 1, 1);
    for (int step = 0; step < 3; ++step) {
      auto parts = h.split(4, /*dim=*/1);  // several views out
      auto joined =
          torch::cat({torch::relu(parts[0]), torch::sigmoid(parts[1])}, 1);
      auto pooled =
          std::get<0>(torch::max_pool2d_with_indices(joined, 3, 1, 1));
      // A branch on the data, and a masked select of a tracked value.
      h = pooled.mean().item<double>() > 0.5
              ? torch::where(pooled > 0.2, pooled, pooled * 0.5)
              : torch::stack({pooled, -pooled}).sum(0);
      h = torch::dropout(h, 0.25, true) + h.tanh();
    }
    return h.pow(2).sum();
  };
  torch::manual_seed(2);
  forward().backward();
  const std::vector<torch::Tensor> expected = {
      x.grad().clone(), w.grad().clone()};
  x.mutable_grad() = torch::Tensor();
  w.mutable_grad() = torch::Tensor();
  remat::DynamicRematStats stats;
  {
    // Four activations of 8 x 8 x 16 x 16 floats: max pooling alone saves
    // its input and int64 indices, three of them.
    DynamicRemat scope(
        DynamicRematOptions().budget_bytes(4 * 8 * 8 * 16 * 16 * 4));
    torch::manual_seed(2);
    forward().backward();
    stats = scope.stats();
  }
  expect_all_bitwise_equal(expected, {x.grad(), w.grad()}, "gradient");
  EXPECT_GT(stats.evictions, 0);
  EXPECT_GT(stats.rematerializations, 0);
}
