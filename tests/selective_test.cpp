// selective_test.cpp: selective checkpointing (CheckpointOptions::policy).
//
// References: the plain run of the same model from the same parameters and
// seed (gradients bitwise equal under every policy), execution counters of
// operators registered here (a kept operator does not run again in
// backward), and the tracking allocator (memory ordered by what is kept).
#include <atomic>
#include <optional>
#include <thread>

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/library.h>
#include <torch/torch.h>

#include "compat/compat.h"
#include "remat/remat.h"
#include "test_util.h"

namespace {

using remat::CheckpointOptions;
using remat::CheckpointPolicy;
using remat::OpContext;
using remat::Policy;
using remat::testing::bitwise_equal;
using remat::testing::expect_all_bitwise_equal;
using remat::testing::grads_of;
namespace policies = remat::policies;

// ---- operators of this test, each counting its executions ------------------

std::atomic<int> kernel_runs{0};     // remat_test::scaled_tanh's CPU kernel
std::atomic<int> composite_runs{0};  // remat_test::softsign (composite)

/// y = 2 tanh(x), with its own CPU kernel.
at::Tensor scaled_tanh_cpu(const at::Tensor& x) {
  ++kernel_runs;
  return x.tanh() * 2;
}

at::Tensor call_scaled_tanh(const at::Tensor& x) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("remat_test::scaled_tanh", "")
                             .typed<at::Tensor(const at::Tensor&)>();
  return op.call(x);
}

/// Its autograd formula: dy/dx = 2 - y^2 / 2, from the saved output.
struct ScaledTanh : torch::autograd::Function<ScaledTanh> {
  static at::Tensor forward(
      torch::autograd::AutogradContext* ctx, const at::Tensor& x) {
    at::AutoDispatchBelowADInplaceOrView below;
    at::Tensor y = call_scaled_tanh(x);
    ctx->save_for_backward({y});
    return y;
  }
  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grads) {
    const at::Tensor y = ctx->get_saved_variables()[0];
    return {grads[0] * (2 - y * y / 2)};
  }
};

at::Tensor scaled_tanh_autograd(const at::Tensor& x) {
  return ScaledTanh::apply(x);
}

/// x / (1 + |x|), a composite operator: autograd sees the aten operators it
/// calls.
at::Tensor softsign(const at::Tensor& x) {
  ++composite_runs;
  return x / (x.abs() + 1);
}

TORCH_LIBRARY(remat_test, m) {
  m.def("scaled_tanh(Tensor x) -> Tensor");
  m.def("softsign(Tensor x) -> Tensor", &softsign);
}
TORCH_LIBRARY_IMPL(remat_test, CPU, m) {
  m.impl("scaled_tanh", &scaled_tanh_cpu);
}
TORCH_LIBRARY_IMPL(remat_test, Autograd, m) {
  m.impl("scaled_tanh", &scaled_tanh_autograd);
}

at::Tensor call_softsign(const at::Tensor& x) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("remat_test::softsign", "")
                             .typed<at::Tensor(const at::Tensor&)>();
  return op.call(x);
}

// ---- a small model with matmuls, softmax, dropout and both operators -------

struct Weights {
  torch::Tensor w1, w2, x;
  std::vector<torch::Tensor> all() const {
    return {w1, w2, x};
  }
};

Weights make_weights(int64_t rows = 64, int64_t dim = 32) {
  torch::manual_seed(3);
  return {
      torch::randn({dim, 4 * dim}).div_(8).requires_grad_(),
      torch::randn({4 * dim, dim}).div_(16).requires_grad_(),
      torch::randn({rows, dim}).requires_grad_()};
}

/// One block: attention-like scores, dropout, a matmul, both operators.
torch::Tensor block(const torch::Tensor& x, const Weights& w) {
  torch::Tensor h = call_scaled_tanh(x.mm(w.w1));              // rows x 4d
  torch::Tensor scores = torch::softmax(h.mm(h.t()) / 8, -1);  // rows x rows
  scores = torch::dropout(scores, 0.2, /*train=*/true);
  torch::Tensor mixed = call_softsign(torch::matmul(scores, h));
  return x + mixed.mm(w.w2);
}

/// Runs `blocks` blocks (each checkpointed with `options`, or plainly when
/// `options` is empty), backward of a scalar loss; returns the gradients.
std::vector<torch::Tensor> train_step(
    const Weights& w,
    std::optional<CheckpointOptions> options,
    int blocks = 1,
    int64_t* peak_bytes = nullptr) {
  for (const auto& t : w.all()) {
    t.mutable_grad() = torch::zeros_like(t);
  }
  torch::manual_seed(11);
  remat::MemoryMeter meter;
  torch::Tensor y = w.x;
  for (int i = 0; i < blocks; ++i) {
    if (options) {
      y = remat::checkpoint(
          [&w](const torch::Tensor& in) { return block(in, w); }, y, *options);
    } else {
      y = block(y, w);
    }
  }
  y.pow(2).sum().backward();
  if (peak_bytes != nullptr) {
    *peak_bytes = meter.peak_delta_bytes();
  }
  std::vector<torch::Tensor> grads;
  for (const auto& t : w.all()) {
    grads.push_back(t.grad().clone());
  }
  return grads;
}

CheckpointOptions with(Policy policy) {
  return CheckpointOptions().policy(std::move(policy));
}

// ---- the tests -------------------------------------------------------------

TEST(SelectiveCheckpoint, KeptOperatorRunsOncePerStepRecomputedRunsTwice) {
  const Weights w = make_weights();
  kernel_runs = 0;
  train_step(w, std::nullopt);
  EXPECT_EQ(kernel_runs, 1) << "plain run";

  kernel_runs = 0;
  train_step(w, with(policies::save_ops({"remat_test::scaled_tanh"})));
  EXPECT_EQ(kernel_runs, 1) << "kept: must not run again in backward";

  kernel_runs = 0;
  train_step(w, with(policies::recompute_all()));
  EXPECT_EQ(kernel_runs, 2) << "recomputed: forward and backward";

  kernel_runs = 0;
  train_step(w, CheckpointOptions());
  EXPECT_EQ(kernel_runs, 2) << "no policy recomputes everything";
}

TEST(SelectiveCheckpoint, KeptCompositeOperatorRunsOncePerStep) {
  const Weights w = make_weights();
  composite_runs = 0;
  train_step(w, with(policies::save_ops({"remat_test::softsign"})));
  EXPECT_EQ(composite_runs, 1);
  composite_runs = 0;
  train_step(w, with(policies::recompute_all()));
  EXPECT_EQ(composite_runs, 2);
}

TEST(SelectiveCheckpoint, GradientsBitwiseEqualPlainRunUnderEveryPolicy) {
  const Weights w = make_weights();
  const auto reference = train_step(w, std::nullopt, /*blocks=*/3);
  const std::vector<std::pair<std::string, Policy>> cases = {
      {"save_all", policies::save_all()},
      {"recompute_all", policies::recompute_all()},
      {"save_compute_intensive", policies::save_compute_intensive()},
      {"save_ops(scaled_tanh, softsign, _softmax)",
       policies::save_ops(
           {"remat_test::scaled_tanh",
            "remat_test::softsign",
            "aten::_softmax"})},
      {"recompute_ops(mm)", policies::recompute_ops({"aten::mm"})},
      {"combine",
       policies::combine(
           {policies::recompute_ops({"aten::mm"}),
            policies::save_compute_intensive()})},
  };
  for (const auto& [name, policy] : cases) {
    expect_all_bitwise_equal(
        reference, train_step(w, with(policy), /*blocks=*/3), name);
  }
}

TEST(SelectiveCheckpoint, PeakMemoryOrderedByWhatIsKept) {
  const Weights w = make_weights(/*rows=*/256, /*dim=*/64);
  int64_t plain = 0, save_all = 0, selective = 0, recompute_all = 0;
  train_step(w, std::nullopt, 4, &plain);
  train_step(w, with(policies::save_all()), 4, &save_all);
  train_step(w, with(policies::save_compute_intensive()), 4, &selective);
  train_step(w, with(policies::recompute_all()), 4, &recompute_all);
  EXPECT_GE(save_all, selective);
  EXPECT_GT(selective, recompute_all);
  EXPECT_GT(plain, selective);
  EXPECT_GT(save_all, recompute_all);
}

TEST(SelectiveCheckpoint, KeptOutputIsFreedOnceTheRecomputationPassedItOn) {
  // The kept x.mm(w) is needed in backward only through its product with 2.
  // The recomputation must free it once that product exists, as it frees a
  // recomputed one: the live bytes inside the recomputation, measured after
  // the product, are the same under both policies.
  torch::manual_seed(3);
  const auto x = torch::randn({256, 256}).requires_grad_();
  const auto w = torch::randn({256, 256}).div_(16).requires_grad_();
  const auto live_in_recomputation = [&x, &w](Policy policy) {
    remat::MemoryMeter meter;
    int runs = 0;
    int64_t live_bytes = -1;
    auto body = [&](const torch::Tensor& in) {
      torch::Tensor scaled = in.mm(w) * 2.0;
      if (++runs == 2) {
        live_bytes = meter.current_bytes() - meter.baseline_bytes();
      }
      return scaled.sin();
    };
    remat::checkpoint(body, x, with(std::move(policy))).sum().backward();
    EXPECT_EQ(runs, 2);
    return live_bytes;
  };
  const int64_t recomputed = live_in_recomputation(policies::recompute_all());
  const int64_t kept = live_in_recomputation(policies::save_ops({"aten::mm"}));
  EXPECT_EQ(kept, recomputed)
      << "kept output still alive: " << kept - recomputed << " bytes more";
}

TEST(SelectiveCheckpoint, PolicySeesOperatorsInBothRunsWithOutputBytes) {
  const Weights w = make_weights();
  int forward_calls = 0, recompute_calls = 0;
  int64_t mm_bytes = -1;
  Policy counting = [&](const OpContext& context) {
    (context.is_recompute ? recompute_calls : forward_calls) += 1;
    if (context.op_name == "aten::mm" && !context.is_recompute &&
        mm_bytes < 0) {
      mm_bytes = context.output_bytes;
    }
    return context.op_name == "aten::mm" ? CheckpointPolicy::kMustSave
                                         : CheckpointPolicy::kPreferRecompute;
  };
  train_step(w, with(counting));
  EXPECT_GT(forward_calls, 5);
  EXPECT_GT(recompute_calls, 0);
  EXPECT_LE(recompute_calls, forward_calls);
  EXPECT_EQ(mm_bytes, 64 * 128 * 4) << "x.mm(w1): 64 x 128 floats";
}

TEST(SelectiveCheckpoint, InPlaceChangeOfKeptOutputAfterForwardIsRefused) {
  const Weights w = make_weights();
  auto y = remat::checkpoint(
      [&w](const torch::Tensor& in) { return in.mm(w.w1); },
      w.x,
      with(policies::save_ops({"aten::mm"})));
  y.mul_(2);  // the region's output is the kept output of aten::mm
  try {
    y.sum().backward();
    FAIL() << "expected an error";
  } catch (const c10::Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("aten::mm"), std::string::npos) << message;
    EXPECT_NE(message.find("modified in place"), std::string::npos) << message;
  }
}

TEST(SelectiveCheckpoint, InPlaceChangeInsideTheForwardUnkeepsTheCall) {
  const Weights w = make_weights();
  auto region = [&w](const torch::Tensor& in) {
    torch::Tensor h = call_softsign(in.mm(w.w1));
    h.mul_(3);  // writes into the kept output: the call is recomputed
    return h.sin().mm(w.w2);
  };
  auto run = [&](std::optional<CheckpointOptions> options) {
    for (const auto& t : w.all()) {
      t.mutable_grad() = torch::zeros_like(t);
    }
    composite_runs = 0;
    auto y = options ? remat::checkpoint(region, w.x, *options) : region(w.x);
    y.pow(2).sum().backward();
    std::vector<torch::Tensor> grads;
    for (const auto& t : w.all()) {
      grads.push_back(t.grad().clone());
    }
    return grads;
  };
  const auto reference = run(std::nullopt);
  const auto grads = run(with(policies::save_ops({"remat_test::softsign"})));
  EXPECT_EQ(composite_runs, 2) << "un-kept: recomputed in backward";
  expect_all_bitwise_equal(reference, grads, "un-kept call");
}

TEST(SelectiveCheckpoint, PolicyThatChangesItsAnswerIsRefused) {
  const Weights w = make_weights();
  Policy fickle = [](const OpContext& context) {
    return context.op_name == "aten::mm" && !context.is_recompute
               ? CheckpointPolicy::kMustSave
               : CheckpointPolicy::kPreferRecompute;
  };
  auto y = remat::checkpoint(
      [&w](const torch::Tensor& in) { return in.mm(w.w1).sin(); },
      w.x,
      with(fickle));
  try {
    y.sum().backward();
    FAIL() << "expected an error";
  } catch (const c10::Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("answer the same"), std::string::npos) << message;
  }
}

TEST(SelectiveCheckpoint, ReentrantModeWithPolicyIsRefused) {
  const Weights w = make_weights();
  try {
    remat::checkpoint(
        [&w](const torch::Tensor& in) { return in.mm(w.w1); },
        w.x,
        with(policies::save_all()).mode(remat::Mode::kReentrant));
    FAIL() << "expected an error";
  } catch (const c10::Error& error) {
    EXPECT_NE(std::string(error.what()).find("kReentrant"), std::string::npos)
        << error.what();
  }
}

TEST(SelectiveCheckpoint, NestedRegionsAndRetainedGraphMatchPlainRun) {
  const Weights w = make_weights();
  const auto reference = train_step(w, std::nullopt);
  for (const auto& t : w.all()) {
    t.mutable_grad() = torch::zeros_like(t);
  }
  torch::manual_seed(11);
  auto y = remat::checkpoint(
      [&w](const torch::Tensor& in) {
        torch::Tensor h = call_scaled_tanh(in.mm(w.w1));
        // The inner region (no policy) suspends the outer one's.
        torch::Tensor scores = remat::checkpoint(
            [](const torch::Tensor& hh) {
              return torch::softmax(hh.mm(hh.t()) / 8, -1);
            },
            h);
        scores = torch::dropout(scores, 0.2, /*train=*/true);
        torch::Tensor mixed = call_softsign(torch::matmul(scores, h));
        return in + mixed.mm(w.w2);
      },
      w.x,
      with(policies::save_compute_intensive()));
  auto loss = y.pow(2).sum();
  loss.backward({}, /*retain_graph=*/true);
  std::vector<torch::Tensor> first;
  for (const auto& t : w.all()) {
    first.push_back(t.grad().clone());
  }
  expect_all_bitwise_equal(reference, first, "first backward");
  // The second backward recomputes every operator (kept outputs are
  // released after the first) and must still add the same gradients.
  loss.backward();
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(first[i] * 2, w.all()[i].grad()))
        << "second backward #" << i;
  }
}

TEST(SelectiveCheckpoint, AutogradGradMatchesBackward) {
  const Weights w = make_weights();
  const auto reference = train_step(w, std::nullopt);
  torch::manual_seed(11);
  auto y = remat::checkpoint(
      [&w](const torch::Tensor& in) { return block(in, w); },
      w.x,
      with(policies::save_compute_intensive()));
  auto grads = torch::autograd::grad({y.pow(2).sum()}, w.all());
  expect_all_bitwise_equal(reference, grads, "torch::autograd::grad");
}

TEST(SelectiveCheckpoint, AutocastRegionKeepsItsMatmulsAndMatchesPlainRun) {
  const Weights w = make_weights();
  auto run = [&](std::optional<CheckpointOptions> options) {
    for (const auto& t : w.all()) {
      t.mutable_grad() = torch::Tensor();
    }
    kernel_runs = 0;
    // compat::AutocastState: the setters differ between LibTorch versions.
    auto autocast = remat::compat::AutocastState::capture();
    autocast.cpu_enabled = true;
    autocast.apply();
    auto region = [&w](const torch::Tensor& in) {
      return call_scaled_tanh(in.mm(w.w1).to(torch::kFloat)).mm(w.w2);
    };
    torch::manual_seed(11);
    auto y = options ? remat::checkpoint(region, w.x, *options) : region(w.x);
    autocast.cpu_enabled = false;
    autocast.apply();
    at::autocast::clear_cache();
    EXPECT_EQ(y.scalar_type(), torch::kBFloat16) << "mm ran under autocast";
    y.to(torch::kFloat).pow(2).sum().backward();
    std::vector<torch::Tensor> grads;
    for (const auto& t : w.all()) {
      grads.push_back(t.grad().clone());
    }
    return grads;
  };
  const auto reference = run(std::nullopt);
  const auto selective = run(with(policies::combine(
      {policies::save_ops({"remat_test::scaled_tanh"}),
       policies::save_compute_intensive()})));
  EXPECT_EQ(kernel_runs, 1) << "kept under autocast: not run in backward";
  expect_all_bitwise_equal(reference, selective, "autocast");
}

TEST(Policies, CombineLetsFirstMustAnswerWinElseLastPolicy) {
  const Policy p = policies::combine(
      {policies::save_ops({"aten::_softmax"}),
       policies::recompute_ops({"aten::bmm"}),
       policies::save_compute_intensive()});
  auto answer = [&](const std::string& name) {
    return p(OpContext{name, false, 0});
  };
  EXPECT_EQ(answer("aten::_softmax"), CheckpointPolicy::kMustSave);
  EXPECT_EQ(answer("aten::bmm"), CheckpointPolicy::kMustRecompute);
  EXPECT_EQ(answer("aten::mm"), CheckpointPolicy::kPreferSave);
  EXPECT_EQ(answer("aten::gelu"), CheckpointPolicy::kPreferRecompute);
}

TEST(Policies, NamesWithoutNamespaceOrWithAnOverloadAreRefused) {
  for (const std::string bad : {"mm", "", "::mm", "aten::", "aten::mm.out"}) {
    try {
      policies::save_ops({"aten::mm", bad});
      FAIL() << "expected an error for '" << bad << "'";
    } catch (const c10::Error& error) {
      EXPECT_NE(
          std::string(error.what()).find("'" + bad + "'"), std::string::npos)
          << error.what();
    }
  }
  EXPECT_THROW(policies::combine({}), c10::Error);
  EXPECT_THROW(policies::combine({policies::save_all(), Policy()}), c10::Error);
}

TEST(Policies, ReadyMadePoliciesAnswerAsDocumented) {
  const OpContext mm{"aten::mm", false, 0};
  const OpContext gelu{"aten::gelu", false, 0};
  EXPECT_TRUE(remat::is_save(policies::save_all()(gelu)));
  EXPECT_FALSE(remat::is_save(policies::recompute_all()(mm)));
  EXPECT_TRUE(remat::is_save(policies::save_compute_intensive()(mm)));
  EXPECT_FALSE(remat::is_save(policies::save_compute_intensive()(gelu)));
  EXPECT_EQ(
      policies::recompute_ops({"aten::mm"})(mm),
      CheckpointPolicy::kMustRecompute);
  EXPECT_EQ(
      policies::recompute_ops({"aten::mm"})(gelu),
      CheckpointPolicy::kPreferSave);
}

// A kept call that saves a conjugate view of its input (linalg_vecdot on
// complex tensors saves x.conj()): the view's conjugate bit is part of what
// backward needs, so it is held, not rebuilt from the plain input.
TEST(SelectiveCheckpoint, ConjugateViewsOfInputsKeepTheirBit) {
  torch::manual_seed(3);
  const torch::Tensor x0 = torch::randn({8, 16}, torch::kComplexDouble);
  const torch::Tensor y0 = torch::randn({8, 16}, torch::kComplexDouble);
  const auto region = [](const torch::autograd::variable_list& in) {
    return torch::autograd::variable_list{
        torch::real(torch::linalg_vecdot(in[0], in[1])).sin()};
  };
  const auto grads = [&](const std::optional<remat::Policy>& policy) {
    torch::Tensor x = x0.clone().requires_grad_(true);
    torch::Tensor y = y0.clone().requires_grad_(true);
    torch::autograd::variable_list out;
    if (policy) {
      out = remat::checkpoint(
          region, {x * 1, y * 1}, CheckpointOptions().policy(*policy));
    } else {
      out = region({x * 1, y * 1});
    }
    out[0].sum().backward();
    return std::vector<torch::Tensor>{x.grad(), y.grad()};
  };
  const std::vector<torch::Tensor> plain = grads(std::nullopt);
  for (const auto& [name, policy] :
       std::vector<std::pair<std::string, remat::Policy>>{
           {"save_all", policies::save_all()},
           {"combine",
            policies::combine(
                {policies::recompute_ops({"aten::sin"}),
                 policies::save_all()})}}) {
    const std::vector<torch::Tensor> got = grads(policy);
    for (size_t k = 0; k < plain.size(); ++k) {
      EXPECT_TRUE(torch::equal(got[k], plain[k])) << name << ", input " << k;
    }
  }
}

// A region input that is not dense (a strided slice) comes back from
// SaveToFile as a dense copy; the views kept calls saved of it are rebuilt
// on the forward's layout, and the gradients are the plain ones.
TEST(SelectiveCheckpoint, NonDenseInputsSurviveAHookThatMakesThemDense) {
  torch::manual_seed(4);
  const torch::Tensor x0 = torch::randn({16, 64}, torch::kDouble);
  const torch::Tensor p0 = torch::randn({24, 64}, torch::kDouble);
  const auto region = [](const torch::autograd::variable_list& in) {
    return torch::autograd::variable_list{torch::linear(in[0], in[1]).sin()};
  };
  const auto grads = [&](bool selective) {
    torch::Tensor x = x0.clone().requires_grad_(true);
    torch::Tensor p = p0.clone().requires_grad_(true);
    torch::Tensor loss;
    {
      remat::SaveToFile spill(remat::SaveToFileOptions().min_bytes(0));
      const torch::Tensor w =
          (p * 1).index({torch::indexing::Slice(0, torch::indexing::None, 2)});
      loss = selective
                 ? remat::checkpoint(
                       region,
                       {x * 1, w},
                       CheckpointOptions().policy(policies::save_all()))[0]
                       .sum()
                 : region({x * 1, w})[0].sum();
    }
    loss.backward();
    return std::vector<torch::Tensor>{x.grad(), p.grad()};
  };
  const std::vector<torch::Tensor> plain = grads(false);
  const std::vector<torch::Tensor> kept = grads(true);
  for (size_t k = 0; k < plain.size(); ++k) {
    EXPECT_TRUE(torch::equal(kept[k], plain[k])) << "input " << k;
  }
}

// What a region with a policy keeps must not keep the region alive: the
// forward's kept outputs carry the region's graph, whose saved tensors hold the
// frame that owns the operator log. Without a recomputation to release them (a
// graph freed without backward; a region run again inside an enclosing
// region's recomputation, every step) they were never freed.
using StorageRef = c10::weak_intrusive_ptr<c10::StorageImpl>;

StorageRef weak_storage(const torch::Tensor& t) {
  return StorageRef(t.storage().getWeakStorageImpl());
}

TEST(SelectiveCheckpoint, AGraphFreedWithoutBackwardFreesTheRegion) {
  for (auto policy :
       {policies::save_compute_intensive(), policies::save_all()}) {
    const auto w = torch::randn({32, 32}).requires_grad_();
    std::vector<StorageRef> made;
    {
      const auto x = torch::randn({32, 32}).requires_grad_();
      auto y = remat::checkpoint(
          [&](const torch::Tensor& in) {
            auto h = in.mm(w);
            auto t = h.tanh();  // saves its own output
            made.push_back(weak_storage(h));
            made.push_back(weak_storage(t));
            return t.sin();
          },
          x,
          with(policy));
      made.push_back(weak_storage(x));
    }  // y, x and the graph dropped without backward
    ASSERT_EQ(made.size(), 3u);
    for (size_t i = 0; i < made.size(); ++i) {
      EXPECT_TRUE(made[i].expired()) << "tensor " << i << " still alive";
    }
  }
}

TEST(
    SelectiveCheckpoint,
    ARegionNestedInANonReentrantRegionIsFreedAfterBackward) {
  for (auto policy :
       {policies::save_compute_intensive(), policies::save_all()}) {
    const auto w = torch::randn({32, 32}).requires_grad_();
    std::vector<StorageRef> made;  // the inner region's mm output, every run
    {
      const auto x = torch::randn({32, 32}).requires_grad_();
      auto inner = [&](const torch::Tensor& in) {
        auto h = in.mm(w);
        made.push_back(weak_storage(h));
        return h.tanh();
      };
      auto y = remat::checkpoint(
          [&](const torch::Tensor& in) {
            return remat::checkpoint(inner, in.sin(), with(policy)).cos();
          },
          x);
      y.sum().backward();
    }
    EXPECT_GE(made.size(), 2u);  // forward, and the outer recomputation
    for (size_t i = 0; i < made.size(); ++i) {
      EXPECT_TRUE(made[i].expired())
          << "run " << i << "'s mm output still alive";
    }
  }
}

TEST(SelectiveCheckpoint, NestedInANonReentrantRegionGradientsStillMatchPlain) {
  torch::manual_seed(0);
  const auto w = torch::randn({32, 32}).div(4).requires_grad_();
  const auto x = torch::randn({32, 32}).requires_grad_();
  auto inner = [&](const torch::Tensor& in) {
    return in.mm(w).tanh().mm(w).sigmoid();
  };
  auto outer = [&](bool checkpointed) {
    w.mutable_grad() = torch::Tensor();
    x.mutable_grad() = torch::Tensor();
    torch::Tensor y;
    if (checkpointed) {
      y = remat::checkpoint(
          [&](const torch::Tensor& in) {
            return remat::checkpoint(
                       inner, in.sin(), with(policies::save_all()))
                .cos();
          },
          x);
    } else {
      y = inner(x.sin()).cos();
    }
    y.sum().backward({}, /*retain_graph=*/true);
    y.sum().backward();
    return std::make_pair(x.grad().clone(), w.grad().clone());
  };
  const auto plain = outer(false);
  const auto checkpointed = outer(true);
  EXPECT_TRUE(torch::equal(plain.first, checkpointed.first));
  EXPECT_TRUE(torch::equal(plain.second, checkpointed.second));
}

// ---- randomness a policy cannot see by its tag --------------------------

/// A noise tensor drawn by a kernel below autograd: an operator with an
/// autograd kernel of its own, not tagged nondeterministic_seeded, whose draw
/// the fallback does not see as a call.
at::Tensor hidden_noise_autograd(const at::Tensor& x) {
  at::AutoDispatchBelowADInplaceOrView below;
  return at::rand_like(x);
}
at::Tensor hidden_noise_cpu(const at::Tensor& x) {
  return at::rand_like(x);
}
TORCH_LIBRARY(remat_test_rng, m) {
  m.def("hidden_noise(Tensor x) -> Tensor");
}
TORCH_LIBRARY_IMPL(remat_test_rng, CPU, m) {
  m.impl("hidden_noise", &hidden_noise_cpu);
}
TORCH_LIBRARY_IMPL(remat_test_rng, Autograd, m) {
  m.impl("hidden_noise", &hidden_noise_autograd);
}

// A call that draws random numbers is never kept, even when neither its tag
// nor a nested call says so: keeping it would skip its draws in the
// recomputation, and the dropout after it would get another mask than in
// the forward (silently: shapes and dtypes are the same).
TEST(SelectiveCheckpoint, ACallThatDrawsRandomNumbersBelowAutogradIsNotKept) {
  static const auto noise =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("remat_test_rng::hidden_noise", "")
          .typed<at::Tensor(const at::Tensor&)>();
  auto run = [](bool use_checkpoint) {
    torch::manual_seed(0);
    const auto x = torch::randn({256}, torch::requires_grad());
    auto body = [](const torch::Tensor& in) {
      const auto h = in.sin() + noise.call(in.detach());
      return torch::dropout(h, 0.5, /*train=*/true).tanh();
    };
    const auto y =
        use_checkpoint
            ? remat::checkpoint(
                  body, x, CheckpointOptions().policy(policies::save_all()))
            : body(x);
    y.sum().backward();
    return std::vector<torch::Tensor>{y.detach(), x.grad().clone()};
  };
  expect_all_bitwise_equal(run(false), run(true), "save_all with hidden RNG");
}

// ---- saved-tensor hooks inside a region ----------------------------------

// A saved-tensor hook's own operators are not the region's: an offload guard
// packs a tensor saved twice only once (NOTE: [One copy per saved tensor]),
// and a kept call does not run its pack hooks in the recomputation, so the
// hook's second pack copies the tensor there but not in the forward. Here
// tanh (kept) saves its output under the guard, and the nested checkpoint
// saves it again as its input; with save_ops(mm), sin (recomputed) saves
// the tensor mm (kept) saved. Before the hooks' operators were hidden from
// the region, both backwards failed: "operator 4 of the region was
// aten::detach in the recomputation and aten::exp in the forward".
TEST(SelectiveCheckpoint, AnOffloadGuardInsideTheRegionPacksLikeTheForward) {
  torch::manual_seed(0);
  const auto w = torch::randn({16, 16}).div(4).requires_grad_();
  const auto x = torch::randn({16, 16}).requires_grad_();
  // exp, after the guard, saves a tensor of the region's own: backward
  // recomputes the region.
  auto nested = [&](const torch::Tensor& h, bool guarded) {
    torch::Tensor out;
    {
      std::optional<remat::SaveToFile> guard;
      if (guarded) {
        guard.emplace(remat::SaveToFileOptions().min_bytes(0));
      }
      const auto a = h.tanh();
      auto inner = [](const torch::Tensor& t) { return t.sin(); };
      out = guarded ? remat::checkpoint(inner, a) : inner(a);
    }
    return out.exp();
  };
  auto flat = [&](const torch::Tensor& h, bool guarded) {
    torch::Tensor out;
    {
      std::optional<remat::SaveToFile> guard;
      if (guarded) {
        guard.emplace(remat::SaveToFileOptions().min_bytes(0));
      }
      const auto m = h.mm(w);
      out = m + h.sin();
    }
    return out.exp();
  };
  auto run = [&](bool which_flat, bool checkpointed) {
    w.mutable_grad() = torch::Tensor();
    x.mutable_grad() = torch::Tensor();
    auto body = [&](const torch::Tensor& h) {
      return which_flat ? flat(h, checkpointed) : nested(h, checkpointed);
    };
    const auto h = x * 2;  // not a leaf: the guard moves it
    torch::Tensor y;
    if (checkpointed) {
      y = remat::checkpoint(
          body,
          h,
          with(
              which_flat ? policies::save_ops({"aten::mm"})
                         : policies::save_all()));
    } else {
      y = body(h);
    }
    y.sum().backward();
    return std::make_pair(
        x.grad().clone(),
        w.grad().defined() ? w.grad().clone() : torch::Tensor());
  };
  for (const bool which_flat : {false, true}) {
    SCOPED_TRACE(which_flat ? "save_ops(mm), no nested region" : "save_all");
    const auto plain = run(which_flat, false);
    std::pair<torch::Tensor, torch::Tensor> checkpointed;
    ASSERT_NO_THROW(checkpointed = run(which_flat, true));
    EXPECT_TRUE(torch::equal(plain.first, checkpointed.first));
    EXPECT_EQ(plain.second.defined(), checkpointed.second.defined());
    if (plain.second.defined()) {
      EXPECT_TRUE(torch::equal(plain.second, checkpointed.second));
    }
  }
}

// Another thread drawing from the default CPU generator while a region with a
// policy runs must not make ATen operators look random: they would be left
// out of the policy (never asked, never kept) and the region would silently
// recompute everything.
TEST(SelectiveThreads, AnotherThreadsRandomDrawsDoNotDisableThePolicy) {
  torch::manual_seed(3);
  torch::nn::Sequential model(
      torch::nn::Linear(256, 256),
      torch::nn::Tanh(),
      torch::nn::Linear(256, 256),
      torch::nn::Tanh());
  const auto x = torch::randn({64, 256});
  // The reference is the second plain step: the process's first one may run
  // before LibTorch's intra-op pool is set up, with other reduction orders.
  for (int warm = 0; warm < 2; ++warm) {
    for (auto& p : model->parameters()) {
      p.mutable_grad() = torch::Tensor();
    }
    model->forward(x).pow(2).sum().backward();
  }
  const auto expected = grads_of(*model);

  auto asked_in_forward = [&](bool other_thread_draws) {
    std::atomic<int> asked{0};
    const Policy save_addmm = policies::save_ops({"aten::addmm"});
    const Policy counting = [&](const OpContext& context) {
      if (!context.is_recompute) {
        ++asked;
      }
      return save_addmm(context);
    };
    std::atomic<bool> stop{false};
    std::atomic<bool> drawing{false};
    std::optional<std::thread> drawer;
    if (other_thread_draws) {
      drawer.emplace([&] {
        while (!stop) {
          (void)torch::rand({16});
          drawing = true;
        }
      });
      while (!drawing) {
        std::this_thread::yield();
      }
    }
    for (int step = 0; step < 20; ++step) {
      for (auto& p : model->parameters()) {
        p.mutable_grad() = torch::Tensor();
      }
      remat::checkpoint(model, x, CheckpointOptions().policy(counting))
          .pow(2)
          .sum()
          .backward();
      remat::testing::expect_all_bitwise_equal(
          expected,
          grads_of(*model),
          other_thread_draws ? "noisy step" : "quiet step");
    }
    stop = true;
    if (drawer) {
      drawer->join();
    }
    return asked.load();
  };
  const int quiet = asked_in_forward(false);
  EXPECT_GT(quiet, 0);
  EXPECT_EQ(asked_in_forward(true), quiet);
}

}  // namespace
