// checkpoint_test.cpp: remat::checkpoint against plain autograd.
//
// Every equivalence test runs the same model twice from the same parameters
// and RNG seed, once plainly and once through checkpoints, and requires input
// and parameter gradients (and BatchNorm running statistics) to be bitwise
// equal: the recomputation replays the forward exactly on CPU.
#include <atomic>
#include <optional>
#include <thread>

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "compat/compat.h"
#include "remat/remat.h"
#include "test_util.h"

namespace {

using remat::CheckpointOptions;
using remat::DeterminismCheck;
using remat::Mode;
using remat::testing::bitwise_equal;
using remat::testing::both_modes;
using remat::testing::error_message_of;
using remat::testing::expect_all_bitwise_equal;
using remat::testing::expect_same_step;
using remat::testing::grads_of;
using remat::testing::mode_test_name;
using remat::testing::TrainingStep;
using torch::autograd::variable_list;

// ---- small models, each a Sequential of blocks -----------------------------

/// A Sequential that can itself be a child of a Sequential.
struct StageImpl : torch::nn::SequentialImpl {
  using SequentialImpl::SequentialImpl;
  torch::Tensor forward(torch::Tensor x) {
    return SequentialImpl::forward(x);
  }
};
TORCH_MODULE(Stage);

torch::nn::Sequential mlp_with_dropout() {
  torch::manual_seed(1);
  torch::nn::Sequential model;
  for (int i = 0; i < 3; ++i) {
    model->push_back(Stage(
        torch::nn::Linear(16, 32),
        torch::nn::ReLU(),
        torch::nn::Dropout(0.3),
        torch::nn::Linear(32, 16)));
  }
  return model;
}

torch::nn::Sequential cnn_with_batchnorm() {
  torch::manual_seed(2);
  torch::nn::Sequential model;
  model->push_back(Stage(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)),
      torch::nn::BatchNorm2d(8),
      torch::nn::ReLU()));
  model->push_back(Stage(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 8, 3).padding(1)),
      torch::nn::BatchNorm2d(8),
      torch::nn::ReLU(),
      torch::nn::MaxPool2d(2)));
  model->push_back(
      Stage(torch::nn::Flatten(), torch::nn::Linear(8 * 4 * 4, 10)));
  return model;
}

/// Pre-LayerNorm transformer block with dropout, one child of a Sequential.
struct BlockImpl : torch::nn::Module {
  BlockImpl() {
    norm1 = register_module(
        "norm1", torch::nn::LayerNorm(std::vector<int64_t>{16}));
    attention = register_module(
        "attention",
        torch::nn::MultiheadAttention(
            torch::nn::MultiheadAttentionOptions(16, 2).dropout(0.2)));
    norm2 = register_module(
        "norm2", torch::nn::LayerNorm(std::vector<int64_t>{16}));
    mlp = register_module(
        "mlp",
        Stage(
            torch::nn::Linear(16, 64),
            torch::nn::GELU(),
            torch::nn::Linear(64, 16),
            torch::nn::Dropout(0.2)));
  }
  torch::Tensor forward(torch::Tensor x) {  // x: [seq, batch, 16]
    auto h = norm1(x);
    x = x + std::get<0>(attention(h, h, h));
    return x + mlp->forward(norm2(x));
  }
  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  torch::nn::MultiheadAttention attention{nullptr};
  Stage mlp{nullptr};
};
TORCH_MODULE(Block);

torch::nn::Sequential transformer_with_dropout() {
  torch::manual_seed(3);
  return torch::nn::Sequential(Block(), Block());
}

struct ModelCase {
  std::string name;
  std::function<torch::nn::Sequential()> make;
  std::function<torch::Tensor()> input;
};

std::vector<ModelCase> model_cases() {
  return {
      {"mlp",
       mlp_with_dropout,
       [] {
         return torch::randn({8, 16});
       }},
      {"cnn",
       cnn_with_batchnorm,
       [] {
         return torch::randn({4, 3, 8, 8});
       }},
      {"transformer",
       transformer_with_dropout,
       [] {
         return torch::randn({5, 3, 16});
       }},
  };
}

/// How the model's forward is run.
enum class Wrap { kPlain, kPerBlock, kNested };

torch::Tensor run_model(
    torch::nn::Sequential& model,
    const torch::Tensor& x,
    Wrap wrap,
    const CheckpointOptions& options) {
  if (wrap == Wrap::kPlain) {
    return model->forward(x);
  }
  auto per_block = [model, options](torch::Tensor h) {
    for (size_t i = 0; i < model->size(); ++i) {
      CheckpointOptions block_options = options;
      block_options.preserve_buffers_of({model->ptr(i)});
      h = remat::checkpoint(
          [impl = model.ptr(), i](const torch::Tensor& in) {
            return (impl->begin() + i)->forward(in);
          },
          h,
          block_options);
    }
    return h;
  };
  if (wrap == Wrap::kPerBlock) {
    return per_block(x);
  }
  // Nested: the whole model in one region, each block in an inner region.
  CheckpointOptions outer = options;
  outer.preserve_buffers_of({model.ptr()});
  return remat::checkpoint(per_block, x, outer);
}

// One training step; its rng_after is a value drawn after the step (the RNG
// stream's position).
TrainingStep train_step(
    const ModelCase& model_case,
    Wrap wrap,
    const CheckpointOptions& options = {}) {
  auto model = model_case.make();
  model->train();
  torch::manual_seed(42);
  auto x = model_case.input().requires_grad_(true);
  auto y = run_model(model, x, wrap, options);
  auto loss = (y * y).sum();
  loss.backward();
  TrainingStep result{grads_of(*model), x.grad().clone(), {}, torch::rand({1})};
  for (const auto& b : model->buffers()) {
    result.buffers.push_back(b.clone());
  }
  return result;
}

// ---- equivalence suite
// -------------------------------------------------------

class Equivalence : public ::testing::TestWithParam<Mode> {};

TEST_P(Equivalence, PerBlockCheckpointGradientsEqualPlainBitwise) {
  for (const auto& model_case : model_cases()) {
    SCOPED_TRACE(model_case.name);
    auto plain = train_step(model_case, Wrap::kPlain);
    auto checkpointed = train_step(
        model_case, Wrap::kPerBlock, CheckpointOptions().mode(GetParam()));
    expect_same_step(plain, checkpointed);
  }
}

TEST_P(Equivalence, NestedCheckpointGradientsEqualPlainBitwise) {
  for (const auto& model_case : model_cases()) {
    SCOPED_TRACE(model_case.name);
    auto plain = train_step(model_case, Wrap::kPlain);
    auto nested = train_step(
        model_case, Wrap::kNested, CheckpointOptions().mode(GetParam()));
    expect_same_step(plain, nested);
  }
}

TEST_P(Equivalence, CheckpointSequentialGradientsEqualPlainBitwise) {
  for (const auto& model_case : model_cases()) {
    SCOPED_TRACE(model_case.name);
    auto plain = train_step(model_case, Wrap::kPlain);
    const auto size = static_cast<int64_t>(model_case.make()->size());
    for (int64_t segments = 1; segments <= size; ++segments) {
      auto model = model_case.make();
      torch::manual_seed(42);
      auto x = model_case.input().requires_grad_(true);
      auto y = remat::checkpoint_sequential(
          model, segments, x, CheckpointOptions().mode(GetParam()));
      (y * y).sum().backward();
      TrainingStep result{
          grads_of(*model), x.grad().clone(), {}, torch::rand({1})};
      for (const auto& b : model->buffers()) {
        result.buffers.push_back(b.clone());
      }
      SCOPED_TRACE("segments=" + std::to_string(segments));
      expect_same_step(plain, result);
    }
  }
}

TEST_P(Equivalence, ModuleFormUpdatesBatchNormStatisticsOnce) {
  torch::manual_seed(5);
  torch::nn::Sequential reference(
      torch::nn::Conv2d(3, 4, 3), torch::nn::BatchNorm2d(4));
  torch::nn::Sequential checkpointed(
      torch::nn::Conv2d(3, 4, 3), torch::nn::BatchNorm2d(4));
  torch::NoGradGuard no_grad_copy;
  for (size_t i = 0; i < reference->parameters().size(); ++i) {
    checkpointed->parameters()[i].copy_(reference->parameters()[i]);
  }
  {
    torch::AutoGradMode enable(true);
    auto x = torch::randn({2, 3, 6, 6}, torch::requires_grad());
    reference->forward(x).sum().backward();
    remat::checkpoint(checkpointed, x, CheckpointOptions().mode(GetParam()))
        .sum()
        .backward();
  }
  expect_all_bitwise_equal(
      reference->buffers(), checkpointed->buffers(), "BatchNorm buffer");
  auto bn = checkpointed[1]->as<torch::nn::BatchNorm2d>();
  EXPECT_EQ(bn->num_batches_tracked.item<int64_t>(), 1);
}

// The model switched to eval() between forward and backward (a validation
// loss logged before backward): the module forms recompute Dropout and
// BatchNorm in the forward's mode, as plain autograd computes from what the
// forward saved, and leave the caller's mode in place. Before, reentrant
// mode gave other gradients silently and non-reentrant mode failed on a
// saved tensor's shape.
TEST_P(Equivalence, ModuleFormsRecomputeInTheModeOfTheForward) {
  enum class Form { kPlain, kSequential, kModule };
  auto run = [&](Form form) {
    torch::manual_seed(9);
    torch::nn::Sequential model(
        torch::nn::Linear(8, 16),
        torch::nn::Dropout(0.5),
        torch::nn::BatchNorm1d(16),
        torch::nn::Tanh(),
        torch::nn::Linear(16, 4),
        torch::nn::Tanh());
    model->train();
    torch::manual_seed(3);
    const auto x = torch::randn({6, 8}, torch::requires_grad());
    const auto options = CheckpointOptions().mode(GetParam());
    torch::Tensor y;
    switch (form) {
      case Form::kPlain:
        y = model->forward(x);
        break;
      case Form::kSequential:  // Dropout and BatchNorm in checkpointed segments
        y = remat::checkpoint_sequential(model, 3, x, options);
        break;
      case Form::kModule:
        y = remat::checkpoint(model, x, options);
        break;
    }
    model->eval();
    (y * y).sum().backward();
    EXPECT_FALSE(model->is_training());
    EXPECT_FALSE(model[1]->is_training());
    EXPECT_FALSE(model[2]->is_training());
    std::vector<torch::Tensor> state = grads_of(*model);
    state.push_back(x.grad().clone());
    for (const auto& buffer : model->buffers()) {
      state.push_back(buffer.clone());
    }
    return state;
  };
  const auto plain = run(Form::kPlain);
  expect_all_bitwise_equal(
      plain, run(Form::kSequential), "checkpoint_sequential");
  expect_all_bitwise_equal(plain, run(Form::kModule), "module form");
}

// A parameter updated in place between forward and backward: the
// recomputation would read the new value where plain autograd uses the saved
// one; refused, naming what happened.
TEST_P(Equivalence, ModuleFormsRefuseParametersChangedSinceTheForward) {
  torch::nn::Sequential model(torch::nn::Linear(4, 4), torch::nn::Tanh());
  const auto x = torch::randn({2, 4}, torch::requires_grad());
  auto y = remat::checkpoint(model, x, CheckpointOptions().mode(GetParam()));
  {
    torch::NoGradGuard no_grad;
    model[0]->as<torch::nn::Linear>()->bias.add_(1);
  }
  const std::string message = error_message_of([&] { y.sum().backward(); });
  EXPECT_NE(
      message.find("a parameter of a module of the region was modified in "
                   "place since the forward"),
      std::string::npos)
      << message;
}

TEST_P(Equivalence, InputsThatDoNotRequireGradWork) {
  torch::manual_seed(6);
  torch::nn::Linear layer(4, 4);
  auto x = torch::randn({3, 4});
  auto w = torch::randn({3, 4}, torch::requires_grad());
  auto plain = (layer(x) * w).sum();
  auto plain_grad = torch::autograd::grad({plain}, {w})[0];
  auto outs = remat::checkpoint(
      [&](const variable_list& in) {
        return variable_list{layer(in[0]) * in[1]};
      },
      {x, w},
      CheckpointOptions().mode(GetParam()));
  outs[0].sum().backward();
  EXPECT_TRUE(bitwise_equal(plain_grad, w.grad()));
}

// Inputs as real programs pass them: a boolean mask, integer indices, the
// same tensor twice, a view of another input, a 0-dim scale, an empty
// batch. The gradients of every float input and parameter match the plain
// run, under the default recomputation check and the bitwise values check
// (whose comparison must also take empty tensors).
TEST_P(Equivalence, InputsOfEveryKindMatchThePlainRun) {
  torch::manual_seed(12);
  torch::nn::Linear layer(4, 4);
  const auto region = [&](const variable_list& in) {
    torch::Tensor h = torch::tanh(layer(in[0])) * in[3] + in[4];
    h = h.masked_fill(in[1], 0.0);
    return variable_list{h.index_select(0, in[2]) * in[5] + in[0].sum()};
  };
  for (int64_t batch : {3, 0}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    const torch::Tensor base = torch::randn({batch, 4});
    const torch::Tensor mask = torch::rand({batch, 4}) > 0.5;
    const torch::Tensor indices = batch > 0
                                      ? torch::tensor({2, 0, 2}, torch::kLong)
                                      : torch::empty({0}, torch::kLong);
    const torch::Tensor scale = torch::tensor(1.5);
    const auto run = [&](std::optional<DeterminismCheck> check) {
      layer->zero_grad();
      torch::Tensor x = base.clone().requires_grad_();
      torch::Tensor s = scale.clone().requires_grad_();
      // x twice (as itself and as a view of itself), s as a 0-dim factor.
      const variable_list inputs{x, mask, indices, s, x.narrow(1, 0, 4), s};
      const variable_list outs = check ? remat::checkpoint(
                                             region,
                                             inputs,
                                             CheckpointOptions()
                                                 .mode(GetParam())
                                                 .determinism_check(*check))
                                       : region(inputs);
      outs[0].pow(2).sum().backward();
      return variable_list{
          layer->weight.grad().clone(),
          layer->bias.grad().clone(),
          x.grad(),
          s.grad()};
    };
    const variable_list plain = run(std::nullopt);
    for (auto check :
         {DeterminismCheck::kMetadata, DeterminismCheck::kValues}) {
      const variable_list checkpointed = run(check);
      for (size_t k = 0; k < plain.size(); ++k) {
        EXPECT_TRUE(bitwise_equal(plain[k], checkpointed[k]))
            << "gradient " << k << ", check " << static_cast<int>(check);
      }
    }
  }
}

// A region may return what it did not compute: its input, a parameter, a
// tensor it closes over. The reentrant function once made itself the grad_fn
// of a returned parameter, so the next backward through that parameter led
// back into the function, which waited on itself forever. Two steps, with the
// returned tensor used next to a plain use of the same parameter. Bitwise in
// the non-reentrant mode; the reentrant one adds a gradient that arrives by
// two paths in another order (its nested backward accumulates on its own), so
// there the sums agree to rounding.
TEST_P(Equivalence, OutputsTheRegionDidNotComputeMatchThePlainRun) {
  torch::manual_seed(8);
  torch::nn::Linear before(5, 5);
  torch::nn::Linear returned(5, 5);
  const torch::Tensor input = torch::randn({4, 5});
  using Region = std::function<variable_list(const variable_list&)>;
  const std::vector<std::pair<std::string, Region>> regions = {
      {"a parameter",
       [&](const variable_list&) { return variable_list{returned->weight}; }},
      {"its input", [](const variable_list& in) { return in; }},
      {"its input and a parameter",
       [&](const variable_list& in) {
         return variable_list{in[0], returned->bias.expand({4, 5})};
       }},
  };
  for (const auto& [what, region] : regions) {
    SCOPED_TRACE(what);
    const auto steps = [&](bool checkpointed) {
      for (auto* module : {&before, &returned}) {
        for (auto& p : (*module)->parameters()) {
          p.mutable_grad() = torch::Tensor();
        }
      }
      for (int step = 0; step < 2; ++step) {
        const torch::Tensor h = before(input).tanh();
        const variable_list outs =
            checkpointed
                ? remat::checkpoint(
                      region, {h}, CheckpointOptions().mode(GetParam()))
                : region({h});
        torch::Tensor loss = returned(h).sum();
        for (const torch::Tensor& out : outs) {
          loss = loss + (out.sum(0) * h).pow(2).sum();
        }
        loss.backward();
      }
      std::vector<torch::Tensor> grads = grads_of(*before);
      for (const torch::Tensor& grad : grads_of(*returned)) {
        grads.push_back(grad);
      }
      return grads;
    };
    const std::vector<torch::Tensor> plain = steps(false);
    const std::vector<torch::Tensor> checkpointed = steps(true);
    if (GetParam() == Mode::kNonReentrant) {
      expect_all_bitwise_equal(plain, checkpointed, "parameter grad");
      continue;
    }
    ASSERT_EQ(plain.size(), checkpointed.size());
    for (size_t i = 0; i < plain.size(); ++i) {
      EXPECT_TRUE(torch::allclose(plain[i], checkpointed[i], 1e-5, 1e-6))
          << "parameter grad #" << i << ": max abs difference "
          << (plain[i] - checkpointed[i]).abs().max().item<double>();
    }
  }
}

TEST_P(Equivalence, AutocastIsReplayed) {
  torch::manual_seed(7);
  torch::nn::Linear layer(8, 8);
  auto x = torch::randn({4, 8}, torch::requires_grad());
  auto run = [&](bool use_checkpoint) {
    layer->zero_grad();
    x.mutable_grad() = torch::Tensor();
    // compat::AutocastState: the setters differ between LibTorch versions.
    auto autocast = remat::compat::AutocastState::capture();
    autocast.cpu_enabled = true;
    autocast.apply();
    auto y = use_checkpoint ? remat::checkpoint(
                                  [&](const torch::Tensor& in) {
                                    return torch::relu(layer(in));
                                  },
                                  x,
                                  CheckpointOptions().mode(GetParam()))
                            : torch::relu(layer(x));
    autocast.cpu_enabled = false;
    autocast.apply();
    at::autocast::clear_cache();
    EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
    y.to(torch::kFloat).sum().backward();
    return std::make_pair(x.grad().clone(), layer->weight.grad().clone());
  };
  auto plain = run(false);
  auto checkpointed = run(true);
  EXPECT_TRUE(bitwise_equal(plain.first, checkpointed.first));
  EXPECT_TRUE(bitwise_equal(plain.second, checkpointed.second));
}

TEST_P(Equivalence, IsRecomputingIsTrueOnlyDuringRecomputation) {
  std::vector<bool> seen;
  auto x = torch::randn({3}, torch::requires_grad());
  auto y = remat::checkpoint(
      [&](const torch::Tensor& in) {
        seen.push_back(remat::is_recomputing());
        return in.exp();
      },
      x,
      CheckpointOptions().mode(GetParam()));
  EXPECT_FALSE(remat::is_recomputing());
  y.sum().backward();
  EXPECT_EQ(seen, (std::vector<bool>{false, true}));
  EXPECT_FALSE(remat::is_recomputing());
}

TEST_P(Equivalence, InPlaceModificationOfAnInputIsReported) {
  auto leaf = torch::randn({4}, torch::requires_grad());
  auto x = leaf * 2;
  auto y = remat::checkpoint(
      [](const torch::Tensor& in) { return in.sin(); },
      x,
      CheckpointOptions().mode(GetParam()));
  auto loss = y.sum();
  {
    torch::NoGradGuard no_grad;
    x.add_(1);
  }
  try {
    loss.backward();
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("modified by an inplace operation"),
        std::string::npos)
        << e.what();
  }
}

TEST_P(Equivalence, UndefinedOutputIsAnError) {
  auto x = torch::randn({2}, torch::requires_grad());
  try {
    remat::checkpoint(
        [](const variable_list& in) {
          return variable_list{in[0] * 2, torch::Tensor()};
        },
        {x},
        CheckpointOptions().mode(GetParam()));
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("undefined tensor at output #1"),
        std::string::npos)
        << e.what();
  }
}

TEST_P(Equivalence, DifferentOutputCountOnRecomputationIsAnError) {
  auto x = torch::randn({2}, torch::requires_grad());
  int calls = 0;
  auto outs = remat::checkpoint(
      [&](const variable_list& in) {
        ++calls;
        variable_list out{in[0].exp()};
        if (calls > 1) {
          out.push_back(in[0] * 3);
        }
        return out;
      },
      {x},
      CheckpointOptions().mode(GetParam()).early_stop(false));
  try {
    outs[0].sum().backward();
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("returned 1 outputs in forward but 2"),
        std::string::npos)
        << e.what();
  }
}

TEST_P(Equivalence, OutputShapeChangeOnRecomputationIsReported) {
  auto x = torch::randn({4}, torch::requires_grad());
  int calls = 0;
  auto outs = remat::checkpoint(
      [&](const variable_list& in) {
        ++calls;
        auto part = calls == 1 ? in[0] : in[0].narrow(0, 0, 2);
        return variable_list{in[0].exp(), part * 2};
      },
      {x},
      CheckpointOptions().mode(GetParam()).early_stop(false));
  try {
    (outs[0].sum() + outs[1].sum()).backward();
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("shape [4]"), std::string::npos)
        << e.what();
  }
}

TEST(NonReentrant, SavedTensorShapeChangeOnRecomputationIsReported) {
  auto x = torch::randn({4}, torch::requires_grad());
  int calls = 0;
  auto y = remat::checkpoint(
      [&](const torch::Tensor& in) {
        ++calls;
        auto part = calls == 1 ? in : in.narrow(0, 0, 2);
        return part.exp().sum().expand({4});
      },
      x);
  try {
    y.sum().backward();
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("saved tensor #0"), std::string::npos)
        << e.what();
  }
}

TEST_P(Equivalence, ValueChangeIsReportedOnlyUnderValuesCheck) {
  for (auto check : {DeterminismCheck::kMetadata, DeterminismCheck::kValues}) {
    auto x = torch::randn({4}, torch::requires_grad());
    auto shift = torch::zeros({4});
    auto y = remat::checkpoint(
        [&](const torch::Tensor& in) { return (in + shift).exp(); },
        x,
        CheckpointOptions().mode(GetParam()).determinism_check(check));
    shift.fill_(1);  // the function now computes something else
    if (check == DeterminismCheck::kValues) {
      try {
        y.sum().backward();
        FAIL() << "expected an error";
      } catch (const c10::Error& e) {
        EXPECT_NE(
            std::string(e.what()).find("not bitwise equal"), std::string::npos)
            << e.what();
      }
    } else {
      EXPECT_NO_THROW(y.sum().backward());
    }
  }
}

TEST_P(Equivalence, ExceptionInForwardLeavesNothingBehind) {
  int64_t packed = 0;
  remat::SavedTensorHooks counting(
      [&](const torch::Tensor& t) -> std::any {
        ++packed;
        return t;
      },
      [](const std::any& p) { return std::any_cast<torch::Tensor>(p); });
  auto x = torch::randn({3}, torch::requires_grad());
  try {
    remat::checkpoint(
        [](const torch::Tensor& in) -> torch::Tensor {
          auto h = in.exp();
          throw std::runtime_error("boom in forward");
          return h;
        },
        x,
        CheckpointOptions().mode(GetParam()));
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "boom in forward");
  }
  // The checkpoint's hooks are gone: the user's hooks see the next save.
  const int64_t before = packed;
  auto y = x.exp();
  EXPECT_EQ(packed, before + 1);
  y.sum().backward();
  EXPECT_TRUE(bitwise_equal(x.exp(), x.grad()));
}

TEST_P(Equivalence, ExceptionInRecomputationRestoresStateAndNextStepWorks) {
  torch::manual_seed(8);
  torch::nn::Sequential block(
      torch::nn::Linear(4, 4),
      torch::nn::BatchNorm1d(4),
      torch::nn::Dropout(0.5));
  auto x = torch::randn({6, 4}, torch::requires_grad());
  bool fail = false;
  auto options = CheckpointOptions().mode(GetParam());
  options.preserve_buffers_of({block.ptr()});
  auto fn = [&](const torch::Tensor& in) {
    if (fail && remat::is_recomputing()) {
      throw std::runtime_error("boom in recompute");
    }
    return block->forward(in);
  };
  auto y = remat::checkpoint(fn, x, options);
  std::vector<torch::Tensor> buffers_after_forward;
  for (const auto& b : block->buffers()) {
    buffers_after_forward.push_back(b.clone());
  }
  fail = true;
  auto generator = at::globalContext().defaultGenerator(torch::kCPU);
  auto rng_before = generator.get_state();
  EXPECT_THROW(
      {
        try {
          y.sum().backward();
        } catch (const std::exception& e) {
          EXPECT_NE(
              std::string(e.what()).find("boom in recompute"),
              std::string::npos)
              << e.what();
          throw;
        }
      },
      std::exception);
  EXPECT_TRUE(bitwise_equal(rng_before, generator.get_state()));
  EXPECT_FALSE(remat::is_recomputing());
  expect_all_bitwise_equal(buffers_after_forward, block->buffers(), "buffer");
  // The next step works normally.
  fail = false;
  x.mutable_grad() = torch::Tensor();
  remat::checkpoint(fn, x, options).sum().backward();
  EXPECT_TRUE(x.grad().defined());
}

TEST_P(Equivalence, TwoThreadsTrainIndependently) {
  // Models and inputs are made on this thread (the global RNG is shared);
  // each thread then trains its own model through checkpoints.
  struct Job {
    torch::nn::Sequential model;
    torch::Tensor x;
    std::vector<torch::Tensor> grads;
  };
  auto make_job = [](int seed) {
    torch::manual_seed(seed);
    Job job{
        torch::nn::Sequential(
            torch::nn::Linear(8, 32),
            torch::nn::Tanh(),
            torch::nn::Linear(32, 8)),
        torch::randn({16, 8}, torch::requires_grad()),
        {}};
    return job;
  };
  auto train = [&](Job& job, bool use_checkpoint) {
    for (int step = 0; step < 20; ++step) {
      auto y = use_checkpoint
                   ? remat::checkpoint(
                         job.model, job.x, CheckpointOptions().mode(GetParam()))
                   : job.model->forward(job.x);
      (y * y).sum().backward();
    }
    job.grads = grads_of(*job.model);
  };
  Job expected_a = make_job(10), expected_b = make_job(20);
  train(expected_a, false);
  train(expected_b, false);
  Job got_a = make_job(10), got_b = make_job(20);
  std::thread thread_a([&] { train(got_a, true); });
  std::thread thread_b([&] { train(got_b, true); });
  thread_a.join();
  thread_b.join();
  expect_all_bitwise_equal(expected_a.grads, got_a.grads, "thread a");
  expect_all_bitwise_equal(expected_b.grads, got_b.grads, "thread b");
}

INSTANTIATE_TEST_SUITE_P(BothModes, Equivalence, both_modes(), mode_test_name);

// ---- non-reentrant only
// ------------------------------------------------------

TEST(Nesting, MixedModesGiveGradientsEqualToPlain) {
  for (auto [outer_mode, inner_mode] :
       {std::pair{Mode::kNonReentrant, Mode::kReentrant},
        std::pair{Mode::kReentrant, Mode::kNonReentrant}}) {
    torch::manual_seed(13);
    torch::nn::Linear first(6, 6), second(6, 6);
    auto x = torch::randn({4, 6}, torch::requires_grad());
    torch::manual_seed(14);
    auto plain_loss =
        torch::tanh(second(torch::dropout(torch::tanh(first(x)), 0.5, true)))
            .sum();
    auto expected = torch::autograd::grad({plain_loss}, {x})[0];
    torch::manual_seed(14);
    auto y = remat::checkpoint(
        [&](const torch::Tensor& in) {
          auto h = remat::checkpoint(
              [&](const torch::Tensor& a) {
                return torch::dropout(torch::tanh(first(a)), 0.5, true);
              },
              in,
              CheckpointOptions().mode(inner_mode));
          return torch::tanh(second(h));
        },
        x,
        CheckpointOptions().mode(outer_mode));
    y.sum().backward();
    EXPECT_TRUE(bitwise_equal(expected, x.grad()));
  }
}

TEST(NonReentrant, AutogradGradWithExplicitInputsMatchesPlain) {
  torch::manual_seed(9);
  torch::nn::Linear layer(5, 5);
  auto x = torch::randn({3, 5}, torch::requires_grad());
  auto plain = torch::autograd::grad({torch::tanh(layer(x)).sum()}, {x})[0];
  auto y = remat::checkpoint(
      [&](const torch::Tensor& in) { return torch::tanh(layer(in)); }, x);
  auto got = torch::autograd::grad({y.sum()}, {x})[0];
  EXPECT_TRUE(bitwise_equal(plain, got));
  EXPECT_FALSE(layer->weight.grad().defined()) << "grad() must not accumulate";
}

TEST(NonReentrant, CapturedParametersGetGradientsWhenNoInputRequiresGrad) {
  torch::manual_seed(10);
  torch::nn::Linear layer(4, 3);
  auto x = torch::randn({2, 4});
  layer(x).pow(2).sum().backward();
  auto expected = layer->weight.grad().clone();
  layer->zero_grad();
  remat::checkpoint([&](const torch::Tensor& in) { return layer(in); }, x)
      .pow(2)
      .sum()
      .backward();
  EXPECT_TRUE(bitwise_equal(expected, layer->weight.grad()));
}

TEST(NonReentrant, BackwardThroughPartOfARegion) {
  auto x = torch::randn({4}, torch::requires_grad());
  auto outs = remat::checkpoint(
      [](const variable_list& in) {
        auto a = in[0].exp();
        auto b = a.sin();
        return variable_list{a, b};
      },
      {x});
  outs[0].sum().backward();  // only the first output: b's branch unused
  EXPECT_TRUE(bitwise_equal(x.exp(), x.grad()));
}

TEST(NonReentrant, BackwardTwiceWithRetainGraph) {
  torch::manual_seed(11);
  torch::nn::Linear layer(4, 4);
  auto x = torch::randn({2, 4}, torch::requires_grad());
  torch::tanh(layer(x)).sum().backward();
  auto once = x.grad().clone();
  x.mutable_grad() = torch::Tensor();
  auto y = remat::checkpoint(
      [&](const torch::Tensor& in) { return torch::tanh(layer(in)); }, x);
  auto loss = y.sum();
  loss.backward({}, /*retain_graph=*/true);
  EXPECT_TRUE(bitwise_equal(once, x.grad()));
  loss.backward();
  EXPECT_TRUE(bitwise_equal(once * 2, x.grad()));
}

TEST(NonReentrant, EarlyStopSkipsWorkAfterTheLastSavedTensor) {
  for (bool early_stop : {true, false}) {
    int tail_runs = 0;
    auto x = torch::randn({3}, torch::requires_grad());
    auto y = remat::checkpoint(
        [&](const torch::Tensor& in) {
          auto saved = in.exp();  // exp saves its result
          ++tail_runs;            // work after the last saved tensor
          return saved * 2;       // multiplying by a scalar saves no tensor
        },
        x,
        CheckpointOptions().early_stop(early_stop));
    y.sum().backward();
    EXPECT_EQ(tail_runs, early_stop ? 1 : 2) << "early_stop=" << early_stop;
    EXPECT_TRUE(bitwise_equal(x.exp() * 2, x.grad()));
  }
}

/// A region that differentiates what it computed (a gradient penalty):
/// y = dropout(tanh(x W^T + b)); out = y + d(sum y^2)/dx.
variable_list region_with_inner_gradient(
    torch::nn::Linear& layer, const variable_list& in) {
  auto x = in[0];
  auto y = torch::dropout(torch::tanh(layer(x)), 0.25, true);
  auto dx = torch::autograd::grad(
      {y.pow(2).sum()}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true);
  return {y.matmul(layer->weight) + dx[0]};
}

TEST(NonReentrant, AGradientInsideTheRegionMatchesPlain) {
  torch::manual_seed(21);
  torch::nn::Linear layer(6, 6);
  const auto input = torch::randn({5, 6});
  auto run =
      [&](const std::function<variable_list(const variable_list&)>& step) {
        layer->zero_grad();
        auto x = input.clone().requires_grad_(true);
        torch::manual_seed(22);
        step({x})[0].tanh().pow(2).sum().backward();
        return variable_list{
            x.grad().clone(),
            layer->weight.grad().clone(),
            layer->bias.grad().clone()};
      };
  const auto expected = run([&](const variable_list& in) {
    return region_with_inner_gradient(layer, in);
  });
  for (bool early_stop : {true, false}) {
    for (bool nested : {false, true}) {
      SCOPED_TRACE(
          "early_stop=" + std::to_string(early_stop) +
          " nested=" + std::to_string(nested));
      const auto options = CheckpointOptions().early_stop(early_stop);
      const auto got = run([&](const variable_list& in) {
        // Captured by value: the frames call them in backward, after this
        // lambda has returned.
        auto region = [&layer](const variable_list& inner) {
          return region_with_inner_gradient(layer, inner);
        };
        if (!nested) {
          return remat::checkpoint(region, in, options);
        }
        return remat::checkpoint(
            [region, options](const variable_list& outer) {
              auto h = remat::checkpoint(region, {outer[0].sin()}, options);
              return variable_list{h[0] * outer[0]};
            },
            in,
            options);
      });
      if (!nested) {
        expect_all_bitwise_equal(expected, got, "gradient");
      } else {
        // The nested run computes a different function: compare it with
        // its own plain run.
        const auto plain = run([&](const variable_list& in) {
          auto h = region_with_inner_gradient(layer, {in[0].sin()});
          return variable_list{h[0] * in[0]};
        });
        expect_all_bitwise_equal(plain, got, "gradient");
      }
    }
  }
}

TEST(NonReentrant, AGradientInsideARegionWithAPolicyIsRefused) {
  torch::manual_seed(23);
  torch::nn::Linear layer(4, 4);
  auto x = torch::randn({3, 4}, torch::requires_grad());
  try {
    remat::checkpoint(
        [&](const variable_list& in) {
          return region_with_inner_gradient(layer, in);
        },
        {x},
        CheckpointOptions().policy(remat::policies::save_compute_intensive()));
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("torch::autograd::grad inside"),
        std::string::npos)
        << e.what();
  }
}

TEST(Reentrant, AutogradGradIsRefusedWithAClearError) {
  auto x = torch::randn({3}, torch::requires_grad());
  auto y = remat::checkpoint(
      [](const torch::Tensor& in) { return in.exp(); },
      x,
      CheckpointOptions().mode(Mode::kReentrant));
  try {
    torch::autograd::grad({y.sum()}, {x});
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("kNonReentrant"), std::string::npos)
        << e.what();
  }
}

// A backward with create_graph would build no graph of the region's
// gradients (a gradient penalty's second derivative would be missing), and
// an undefined input cannot be saved: both refused, naming the mode.
TEST(Reentrant, CreateGraphAndUndefinedInputsAreRefusedWithAClearError) {
  auto x = torch::randn({3}, torch::requires_grad());
  auto y = remat::checkpoint(
      [](const torch::Tensor& in) { return in.exp(); },
      x,
      CheckpointOptions().mode(Mode::kReentrant));
  try {
    y.sum().backward({}, /*retain_graph=*/true, /*create_graph=*/true);
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(
        std::string(e.what()).find(
            "Mode::kReentrant does not support backward(create_graph=true)"),
        std::string::npos)
        << e.what();
  }
  try {
    remat::checkpoint(
        [](const torch::autograd::variable_list& in) {
          return torch::autograd::variable_list{in[0].exp()};
        },
        {x, torch::Tensor()},
        CheckpointOptions().mode(Mode::kReentrant));
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("got an undefined tensor as input 1"),
        std::string::npos)
        << e.what();
  }
}

// With no check, a recomputation that saves fewer tensors than the forward
// is still reported as the function's fault, not as an internal error.
TEST(NonReentrant, ARecomputationThatSavesLessIsReportedWithoutTheCheck) {
  auto x = torch::randn({4}, torch::requires_grad());
  int calls = 0;
  auto y = remat::checkpoint(
      [&](const torch::Tensor& in) {
        ++calls;
        return calls == 1 ? in.exp().exp() : in.exp() * 2;
      },
      x,
      CheckpointOptions().determinism_check(DeterminismCheck::kNone));
  try {
    y.sum().backward();
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(
        std::string(e.what()).find(
            "the recomputation saved fewer tensors than the forward did"),
        std::string::npos)
        << e.what();
  }
}

// ---- bad input
// ---------------------------------------------------------------

TEST(CheckpointSequential, RejectsBadSegmentCounts) {
  torch::nn::Sequential model(torch::nn::Linear(2, 2), torch::nn::ReLU());
  auto x = torch::randn({1, 2});
  for (int64_t segments : {0, -1, 3}) {
    try {
      remat::checkpoint_sequential(model, segments, x);
      FAIL() << "expected an error for segments=" << segments;
    } catch (const c10::Error& e) {
      EXPECT_NE(
          std::string(e.what()).find(
              "got segments = " + std::to_string(segments)),
          std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(
      remat::checkpoint_sequential(torch::nn::Sequential(), 1, x), c10::Error);
}

TEST(Checkpoint, EmptyFunctionIsRejected) {
  EXPECT_THROW(
      remat::checkpoint(remat::Function(), {torch::randn({1})}), c10::Error);
}

/// A user's module whose forward takes exactly one `const Tensor&`.
struct ScaledLinearImpl : torch::nn::Module {
  ScaledLinearImpl()
      : linear(register_module("linear", torch::nn::Linear(8, 8))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return linear->forward(x).tanh() * 3;
  }
  torch::nn::Linear linear;
};
TORCH_MODULE(ScaledLinear);

TEST(Checkpoint, ModuleFormTakesAUsersModuleWithATensorForward) {
  torch::manual_seed(9);
  ScaledLinear module;
  auto x = torch::randn({4, 8}, torch::requires_grad());
  module->forward(x).sum().backward();
  const auto reference = grads_of(*module);
  const auto reference_x = x.grad().clone();
  module->zero_grad();
  x.mutable_grad() = torch::Tensor();
  remat::checkpoint(module, x).sum().backward();
  expect_all_bitwise_equal(reference, grads_of(*module), "module form");
  EXPECT_TRUE(bitwise_equal(reference_x, x.grad()));
}

TEST(Checkpoint, WithoutGradModeRunsPlainly) {
  torch::NoGradGuard no_grad;
  auto x = torch::randn({3});
  auto y = remat::checkpoint([](const torch::Tensor& in) { return in * 2; }, x);
  EXPECT_TRUE(bitwise_equal(x * 2, y));
  EXPECT_FALSE(y.requires_grad());
}

TEST(Reentrant, AConstantTheRegionReturnsKeepsItsOwnHistory) {
  auto x = torch::randn({3}, torch::requires_grad());
  auto constant = torch::randn({3});
  auto outs = remat::checkpoint(
      [constant](const variable_list& in) {
        return variable_list{in[0] * 2, constant};
      },
      {x},
      CheckpointOptions().mode(Mode::kReentrant));
  EXPECT_FALSE(constant.requires_grad());
  EXPECT_EQ(constant.grad_fn(), nullptr);
  (outs[0].sum() + outs[1].sum()).backward();  // hung before
  EXPECT_TRUE(bitwise_equal(torch::full({3}, 2.0f), x.grad()));
  auto other = torch::randn({3}, torch::requires_grad());
  (other * constant).sum().backward();
  EXPECT_TRUE(bitwise_equal(constant, other.grad()));
}

TEST(Reentrant, AnInputTheRegionWritesInPlaceIsRefusedInBackward) {
  auto x = torch::randn({3}, torch::requires_grad());
  auto state = torch::ones({3});
  auto outs = remat::checkpoint(
      [](const variable_list& in) {
        in[1].add_(1);
        return variable_list{in[0] * in[1]};
      },
      {x, state},
      CheckpointOptions().mode(Mode::kReentrant));
  const std::string message =
      error_message_of([&] { outs[0].sum().backward(); });
  EXPECT_NE(message.find("modified its input #1 in place"), std::string::npos)
      << message;
  // The recomputation did not write it a second time.
  EXPECT_TRUE(bitwise_equal(torch::full({3}, 2.0f), state));
}

TEST(NonReentrant, ValuesCheckComparesConjugateViewsByValue) {
  auto x = torch::randn({3, 3}, torch::kComplexFloat).requires_grad_();
  auto y = torch::randn({3, 3}, torch::kComplexFloat).requires_grad_();
  auto fn = [](const variable_list& in) {
    return variable_list{(in[0] * in[1].conj()).exp()};  // saves a conj view
  };
  auto plain = fn({x, y});
  plain[0].abs().sum().backward();
  const auto gx = x.grad().clone();
  const auto gy = y.grad().clone();
  x.mutable_grad().reset();
  y.mutable_grad().reset();
  auto outs = remat::checkpoint(
      fn,
      {x, y},
      CheckpointOptions().determinism_check(DeterminismCheck::kValues));
  outs[0].abs().sum().backward();  // reported "not bitwise equal" before
  EXPECT_TRUE(bitwise_equal(gx, x.grad()));
  EXPECT_TRUE(bitwise_equal(gy, y.grad()));
}

}  // namespace
