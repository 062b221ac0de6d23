// offload_test.cpp: SaveToFile and SaveOnCpu against the plain run
// (gradients bitwise equal, the activation peak), and the bookkeeping both
// share (which tensors move, one copy per tensor, the prefetch order) through
// a recording store.
#include <sys/resource.h>

#include <any>
#include <csignal>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "offload/stores.h"
#include "remat/remat.h"
#include "test_util.h"

namespace {

using remat::testing::expect_all_bitwise_equal;
using remat::testing::grads_of;

/// `blocks` blocks of Linear(width, 4 width), ReLU, Dropout, Linear back.
torch::nn::Sequential mlp(int64_t width, int64_t blocks, double dropout) {
  torch::manual_seed(11);
  torch::nn::Sequential model;
  for (int64_t i = 0; i < blocks; ++i) {
    model->push_back(torch::nn::Linear(width, 4 * width));
    model->push_back(torch::nn::ReLU());
    model->push_back(torch::nn::Dropout(dropout));
    model->push_back(torch::nn::Linear(4 * width, width));
  }
  return model;
}

/// Zeroes the gradients in place (keeps their memory allocated).
void zero_grads(torch::nn::Module& model) {
  for (auto& p : model.parameters()) {
    if (p.grad().defined()) {
      p.mutable_grad().zero_();
    }
  }
}

/// One training step from seed 5 under a `Guard` made from `args` before the
/// forward and destroyed before backward, as users scope it; the gradients,
/// and the guard's stats in `stats` if given.
template <typename Guard, typename... Args>
std::vector<torch::Tensor> guarded_step(
    torch::nn::Sequential& model,
    const torch::Tensor& input,
    remat::OffloadStats* stats,
    Args&&... args) {
  zero_grads(*model);
  torch::manual_seed(5);
  torch::Tensor loss;
  {
    Guard guard(std::forward<Args>(args)...);
    loss = model->forward(input).pow(2).mean();
    if (stats != nullptr) {
      *stats = guard.stats();
    }
  }
  loss.backward();
  return grads_of(*model);
}

/// The same step without a guard.
std::vector<torch::Tensor> plain_step(
    torch::nn::Sequential& model, const torch::Tensor& input) {
  zero_grads(*model);
  torch::manual_seed(5);
  model->forward(input).pow(2).mean().backward();
  return grads_of(*model);
}

// ---------------------------------------------------------------------------
// The bookkeeping, through a store that moves every CPU tensor to a clone and
// logs what it is asked.

struct RecordingSlot final : remat::detail::OffloadSlot {
  int64_t number = 0;
  torch::Tensor copy;
};

class RecordingStore final : public remat::detail::OffloadStore {
 public:
  explicit RecordingStore(std::vector<std::string>* log) : log_(log) {}

  bool moves(const torch::Tensor& tensor) const override {
    return tensor.device().is_cpu();
  }
  std::shared_ptr<remat::detail::OffloadSlot> put(
      const torch::Tensor& tensor) override {
    auto slot = std::make_shared<RecordingSlot>();
    slot->number = puts_++;
    slot->copy = tensor.clone();
    put_tensors.push_back(tensor);
    return slot;
  }
  void fetch(remat::detail::OffloadSlot& slot) override {
    log_->push_back("fetch " + number(slot));
  }
  torch::Tensor take(remat::detail::OffloadSlot& slot) override {
    log_->push_back("take " + number(slot));
    return static_cast<RecordingSlot&>(slot).copy;
  }

  std::vector<torch::Tensor> put_tensors;  // what put() was given

 private:
  static std::string number(remat::detail::OffloadSlot& slot) {
    return std::to_string(static_cast<RecordingSlot&>(slot).number);
  }
  std::vector<std::string>* log_;
  int64_t puts_ = 0;
};

struct Recorded {
  std::vector<std::string> log;
  RecordingStore* store = nullptr;
  std::shared_ptr<remat::detail::Offloader> offloader;

  Recorded(int64_t prefetch, int64_t min_bytes) {
    auto owned = std::make_unique<RecordingStore>(&log);
    store = owned.get();
    offloader = std::make_shared<remat::detail::Offloader>(
        "recorded", std::move(owned), prefetch, min_bytes);
  }
};

TEST(Offload, ParametersAndSmallTensorsStayAndEachTensorMovesOnce) {
  torch::manual_seed(1);
  torch::nn::Linear first(32, 64), second(64, 32);
  const torch::Tensor input = torch::randn({16, 32});
  const torch::Tensor tiny = torch::randn({16, 32}, torch::requires_grad());
  Recorded recorded(/*prefetch=*/2, /*min_bytes=*/16 * 32 * 4 + 1);
  torch::Tensor loss;
  {
    auto hooks = remat::detail::offload_hooks(recorded.offloader);
    // tanh saves its output, and `second` saves the same tensor as its input.
    const torch::Tensor hidden = first->forward(input).tanh();
    loss = (second->forward(hidden) * tiny).sum();
  }
  // Moved: the tanh output (16x64 floats), once. Left: the parameters,
  // `input` and `tiny` (under min_bytes), the product's other operand.
  ASSERT_EQ(recorded.store->put_tensors.size(), 1u);
  EXPECT_EQ(
      recorded.store->put_tensors[0].sizes(), torch::IntArrayRef({16, 64}));
  for (const auto& moved : recorded.store->put_tensors) {
    EXPECT_FALSE(moved.is_leaf() && moved.requires_grad());
  }
  const remat::OffloadStats stats = recorded.offloader->stats();
  EXPECT_EQ(stats.tensors_moved, 1);
  EXPECT_EQ(stats.bytes_moved, 16 * 64 * 4);
  EXPECT_GE(stats.tensors_left, 3);  // two weights, tiny (and more)
  loss.backward();
  // Both saves of the tanh output were served by one fetch.
  EXPECT_EQ(recorded.offloader->stats().fetches, 1);
  EXPECT_EQ(recorded.log, (std::vector<std::string>{"fetch 0", "take 0"}));
}

// An expanded tensor (stride 0) holds a small storage; moving it would copy
// every repetition. Before it was left in place, SaveToFile wrote a dense copy
// 256 times the storage's size here (and the forward's peak doubled while it
// was being written).
TEST(Offload, TensorsThatRepeatTheirStorageStay) {
  torch::manual_seed(1);
  const torch::Tensor x = torch::randn({16, 64}, torch::requires_grad());
  Recorded recorded(/*prefetch=*/2, /*min_bytes=*/0);
  torch::Tensor loss;
  {
    auto hooks = remat::detail::offload_hooks(recorded.offloader);
    // mul saves both operands: the expanded row twice (4096 x 64 floats
    // over a storage of 64), and the tanh output (16 x 64) once.
    const torch::Tensor row = x.sum(0, true).expand({4096, 64});
    const torch::Tensor hidden = x.tanh();
    loss = (row * row).sum() + (hidden * hidden).sum();
  }
  ASSERT_EQ(recorded.store->put_tensors.size(), 1u);
  EXPECT_EQ(
      recorded.store->put_tensors[0].sizes(), torch::IntArrayRef({16, 64}));
  EXPECT_EQ(recorded.offloader->stats().bytes_moved, 16 * 64 * 4);
  loss.backward();
  const torch::Tensor with_guard = x.grad().clone();
  x.mutable_grad() = torch::Tensor();
  const torch::Tensor row = x.sum(0, true).expand({4096, 64});
  ((row * row).sum() + (x.tanh() * x.tanh()).sum()).backward();
  EXPECT_TRUE(remat::testing::bitwise_equal(with_guard, x.grad()));
}

TEST(Offload, FetchesRunAheadOfBackwardInReverseSaveOrder) {
  // A chain of exp: each saves its own output, one distinct tensor per op.
  const torch::Tensor input = torch::randn({64, 64}, torch::requires_grad());
  for (const int64_t prefetch : {0, 1, 2}) {
    Recorded recorded(prefetch, /*min_bytes=*/0);
    torch::Tensor loss;
    {
      auto hooks = remat::detail::offload_hooks(recorded.offloader);
      torch::Tensor x = input * 0.01;
      for (int i = 0; i < 6; ++i) {
        x = x.exp() * 0.01;  // exp saves its output; mul by a scalar nothing
      }
      loss = x.sum();
    }
    loss.backward();
    std::vector<std::string> expected;
    // The first unpack (save 5) starts its own fetch and `prefetch` more;
    // every later take is followed by the fetch that keeps `prefetch` ahead.
    int64_t next_fetch = 5;
    expected.push_back("fetch " + std::to_string(next_fetch--));
    for (int64_t i = 0; i < prefetch; ++i) {
      expected.push_back("fetch " + std::to_string(next_fetch--));
    }
    for (int64_t taken = 5; taken >= 0; --taken) {
      if (taken < 5 && prefetch == 0) {
        expected.push_back("fetch " + std::to_string(next_fetch--));
      } else if (taken < 5 && next_fetch >= 0) {
        expected.push_back("fetch " + std::to_string(next_fetch--));
      }
      expected.push_back("take " + std::to_string(taken));
    }
    EXPECT_EQ(recorded.log, expected) << "prefetch " << prefetch;
    const auto order = recorded.offloader->fetch_order();
    EXPECT_EQ(order, (std::vector<int64_t>{5, 4, 3, 2, 1, 0}));
    EXPECT_EQ(recorded.offloader->stats().prefetch_hits, prefetch == 0 ? 0 : 5);
  }
}

TEST(Offload, GradientsThroughTheRecordingStoreAreBitwiseThePlainOnes) {
  auto model = mlp(32, 3, 0.25);
  const torch::Tensor input = torch::randn({64, 32});
  const auto plain = plain_step(model, input);
  Recorded recorded(2, 0);
  zero_grads(*model);
  torch::manual_seed(5);
  torch::Tensor loss;
  {
    auto hooks = remat::detail::offload_hooks(recorded.offloader);
    loss = model->forward(input).pow(2).mean();
  }
  loss.backward();
  expect_all_bitwise_equal(plain, grads_of(*model), "recording store");
  EXPECT_GT(recorded.offloader->stats().tensors_moved, 0);
}

// ---------------------------------------------------------------------------
// SaveToFile

TEST(SaveToFile, GradientsAreBitwiseThePlainOnesWithDropout) {
  auto model = mlp(64, 4, 0.3);
  const torch::Tensor input = torch::randn({128, 64});
  const auto plain = plain_step(model, input);
  remat::OffloadStats stats;
  expect_all_bitwise_equal(
      plain,
      guarded_step<remat::SaveToFile>(model, input, &stats),
      "SaveToFile");
  EXPECT_GT(stats.tensors_moved, 0);
  // Every tensor spilled, the dropout masks too, one write queued at a time.
  const auto all = remat::SaveToFileOptions().min_bytes(0).max_pending_bytes(1);
  expect_all_bitwise_equal(
      plain,
      guarded_step<remat::SaveToFile>(model, input, &stats, all),
      "SaveToFile, min_bytes 0");
  EXPECT_EQ(stats.write_failures, 0);
}

TEST(SaveToFile, ThePeakFallsByWhatWasSpilled) {
  // 48 blocks, batch 256: about 60 MiB of saved activations.
  auto model = mlp(256, 48, 0.0);
  const torch::Tensor input = torch::randn({256, 256});
  for (auto& p : model->parameters()) {
    p.mutable_grad() = torch::zeros_like(p);  // allocated before both runs
  }
  // The peak of one forward and backward (the gradients are read after).
  auto peak_of_step = [&](const std::optional<remat::SaveToFileOptions>& spill,
                          remat::OffloadStats* stats) {
    zero_grads(*model);
    remat::MemoryMeter meter;
    torch::Tensor loss;
    {
      std::optional<remat::SaveToFile> guard;
      if (spill) {
        guard.emplace(*spill);
      }
      loss = model->forward(input).pow(2).mean();
      if (guard) {
        *stats = guard->stats();
      }
    }
    loss.backward();
    loss = torch::Tensor();
    return meter.peak_delta_bytes();
  };
  remat::OffloadStats stats;
  const int64_t plain_peak = peak_of_step(std::nullopt, nullptr);
  const auto plain = grads_of(*model);
  const int64_t spill_peak = peak_of_step(
      remat::SaveToFileOptions().max_pending_bytes(2 << 20), &stats);
  expect_all_bitwise_equal(plain, grads_of(*model), "SaveToFile");
  const double fall = static_cast<double>(plain_peak - spill_peak);
  EXPECT_GE(fall, 0.8 * static_cast<double>(stats.bytes_moved))
      << "plain peak " << plain_peak << ", spill peak " << spill_peak
      << ", spilled " << stats.bytes_moved;
  EXPECT_GT(stats.bytes_moved, 40 << 20);
  EXPECT_GE(stats.peak_file_bytes, stats.bytes_moved);
  EXPECT_EQ(stats.write_failures, 0);
}

TEST(SaveToFile, CombinesWithCheckpointAndRetainGraph) {
  // Six blocks; every other one checkpointed: its saves are the region's,
  // the rest (the regions' inputs too) go to the file.
  std::vector<torch::nn::Sequential> blocks;
  torch::nn::ModuleList all;
  for (int i = 0; i < 6; ++i) {
    blocks.push_back(mlp(64, 1, 0.2));
    all->push_back(blocks.back());
  }
  const torch::Tensor input = torch::randn({128, 64});
  auto loss_of = [&] {
    torch::Tensor x = input;
    for (size_t i = 0; i < blocks.size(); ++i) {
      auto block = [&, i](const torch::Tensor& h) {
        return blocks[i]->forward(h);
      };
      x = i % 2 == 0 ? remat::checkpoint(block, x) : block(x);
    }
    return x.pow(2).mean();
  };
  zero_grads(*all);
  torch::manual_seed(5);
  loss_of().backward();
  const auto plain = grads_of(*all);

  zero_grads(*all);
  torch::manual_seed(5);
  torch::Tensor loss;
  remat::OffloadStats stats;
  {
    remat::SaveToFile spill;
    loss = loss_of();
    stats = spill.stats();
  }
  loss.backward(/*gradient=*/{}, /*retain_graph=*/true);
  expect_all_bitwise_equal(plain, grads_of(*all), "first backward");
  EXPECT_GT(stats.tensors_moved, 0);
  // A second backward of the retained graph gets the same tensors again.
  zero_grads(*all);
  loss.backward();
  expect_all_bitwise_equal(plain, grads_of(*all), "second backward");
}

TEST(SaveToFile, AFailedWriteKeepsTheTensorInMemory) {
  // Files of this process may not grow past 256 KiB. SIGXFSZ keeps its
  // default action (ending the process): the writer must fail with EFBIG.
  struct rlimit saved {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_DFL);
  struct rlimit small = saved;
  small.rlim_cur = 256 << 10;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);

  auto model = mlp(64, 4, 0.0);
  const torch::Tensor input = torch::randn({256, 64});
  const auto plain = plain_step(model, input);
  zero_grads(*model);
  torch::Tensor loss;
  remat::OffloadStats stats;
  {
    remat::SaveToFile spill(remat::SaveToFileOptions().min_bytes(0));
    loss = model->forward(input).pow(2).mean();
    loss.backward();
    stats = spill.stats();
  }
  setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, old_handler);
  expect_all_bitwise_equal(plain, grads_of(*model), "after failed writes");
  EXPECT_GT(stats.write_failures, 0);
  EXPECT_LT(stats.write_failures, stats.tensors_moved);
}

TEST(SaveToFile, BadOptionsAreRefusedAndLeaveNoHooks) {
  auto expect_error = [](const remat::SaveToFileOptions& options,
                         const std::string& message) {
    try {
      remat::SaveToFile spill(options);
      ADD_FAILURE() << "expected an error containing: " << message;
    } catch (const c10::Error& error) {
      EXPECT_NE(std::string(error.what()).find(message), std::string::npos)
          << error.what();
    }
  };
  expect_error(
      remat::SaveToFileOptions().directory("/nonexistent/remat-dir"),
      "cannot create a spill file in directory '/nonexistent/remat-dir'");
  expect_error(
      remat::SaveToFileOptions().prefetch(-1),
      "expected prefetch >= 0, got -1");
  expect_error(
      remat::SaveToFileOptions().max_pending_bytes(0),
      "expected max_pending_bytes > 0, got 0");
  // No hook was left pushed: saved tensors are the plain ones again.
  int64_t packed = 0;
  {
    remat::SavedTensorHooks counting(
        [&packed](const torch::Tensor& t) -> std::any {
          ++packed;
          return t;
        },
        [](const std::any& p) { return std::any_cast<torch::Tensor>(p); });
    torch::Tensor x = torch::randn({4}, torch::requires_grad());
    x.exp().sum().backward();
  }
  EXPECT_EQ(packed, 1);
}

// ---------------------------------------------------------------------------
// SaveOnCpu on a CPU-only run: nothing to move; the copies are checked by
// cuda_test where a GPU is present.

// A saved tensor modified in place after the forward: plain autograd
// refuses the backward; so does every offload guard, whether the tensor
// moved (its stored copy would hold the value before or after the change,
// as the writer's timing fell) or stayed.
TEST(Offload, ASavedTensorModifiedInPlaceIsRefusedAsPlainAutogradRefusesIt) {
  torch::manual_seed(4);
  torch::nn::Linear layer(256, 256);
  const torch::Tensor input = torch::randn({512, 256});
  const auto backward_after_change =
      [&](const std::function<std::any()>& guard) {
        const torch::Tensor hidden = layer(input);  // 512 KiB
        torch::Tensor loss;
        {
          const std::any alive = guard();
          loss = (hidden * hidden).sum();  // saves `hidden` twice
        }
        hidden.detach().mul_(3);  // detached: shares the version counter
        try {
          loss.backward();
        } catch (const c10::Error& error) {
          return std::string(error.what_without_backtrace());
        }
        return std::string("no error");
      };
  EXPECT_NE(
      backward_after_change([] {
        return std::any();
      }).find("modified by an inplace operation"),
      std::string::npos);
  const std::string spilled = backward_after_change(
      [] { return std::any(std::make_shared<remat::SaveToFile>()); });
  EXPECT_NE(
      spilled.find("remat::SaveToFile: one of the variables needed for "
                   "gradient computation has been modified by an inplace "
                   "operation since it was saved (version 0 when saved, 1 "
                   "now)"),
      std::string::npos)
      << spilled;
  // On the CPU, SaveOnCpu leaves every tensor where it is.
  const std::string kept = backward_after_change(
      [] { return std::any(std::make_shared<remat::SaveOnCpu>()); });
  EXPECT_NE(
      kept.find("remat::SaveOnCpu: one of the variables needed"),
      std::string::npos)
      << kept;
  // Unchanged, the same step runs.
  const torch::Tensor hidden = layer(input);
  torch::Tensor loss;
  {
    remat::SaveToFile spill;
    loss = (hidden * hidden).sum();
  }
  EXPECT_NO_THROW(loss.backward());
}

TEST(SaveOnCpu, CpuTensorsStayAndGradientsAreThePlainOnes) {
  auto model = mlp(32, 2, 0.25);
  const torch::Tensor input = torch::randn({64, 32});
  const auto plain = plain_step(model, input);
  remat::OffloadStats stats;
  expect_all_bitwise_equal(
      plain,
      guarded_step<remat::SaveOnCpu>(model, input, &stats),
      "SaveOnCpu on CPU");
  EXPECT_EQ(stats.tensors_moved, 0);
  EXPECT_GT(stats.tensors_left, 0);
  EXPECT_THROW(
      remat::SaveOnCpu(remat::SaveOnCpuOptions().min_bytes(-1)), c10::Error);
}

// A conjugate (or negative) view's bytes are not its values: what comes back
// from the file is the values.
TEST(SaveToFile, ConjugateViewsComeBackAsTheirValues) {
  torch::manual_seed(5);
  const torch::Tensor a0 = torch::randn({64, 300}, torch::kDouble);
  const auto f = [](const torch::Tensor& a) {
    const torch::Tensor c = torch::complex(a * 2, a * 3).conj();
    return torch::real(c * c).sum() +
           (torch::imag(c) * torch::imag(c).sin()).sum();
  };
  torch::Tensor plain_input = a0.clone().requires_grad_(true);
  f(plain_input).backward();
  torch::Tensor input = a0.clone().requires_grad_(true);
  torch::Tensor loss;
  {
    remat::SaveToFile spill(remat::SaveToFileOptions().min_bytes(0));
    loss = f(input);
  }
  loss.backward();
  EXPECT_TRUE(torch::equal(input.grad(), plain_input.grad()));
}

// An output saved by its own node (exp) must not keep that node alive
// through the store: a forward whose backward never runs frees its graph
// (and SaveToFile's file and thread with it).
TEST(Offload, AGraphWhoseBackwardNeverRunsIsFreed) {
  for (int store = 0; store < 3; ++store) {
    // The output's storage: held by the node if the node holds itself.
    std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> output;
    {
      const torch::Tensor a = torch::randn({8, 8}).requires_grad_(true);
      torch::Tensor loss;
      {
        std::optional<remat::SaveToFile> spill;
        std::optional<remat::SaveOnCpu> on_cpu;
        if (store == 0) {
          spill.emplace();  // small tensors: kept in memory
        } else if (store == 1) {
          spill.emplace(remat::SaveToFileOptions().min_bytes(0));
        } else {
          on_cpu.emplace();  // CPU tensors: kept
        }
        const torch::Tensor y = (a * 2).exp();
        output.emplace(y.storage().getWeakStorageImpl());
        loss = y.sum();
      }
    }
    EXPECT_TRUE(output && output->expired()) << "store " << store;
  }
}

}  // namespace
