// compress_test.cpp: CompressActivations against the uncompressed run: the
// bytes kept between forward and backward (tracking allocator), gradients
// close to the plain ones, what is left uncompressed.
#include <optional>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/remat.h"

namespace {

using remat::CompressActivations;
using remat::CompressedType;
using remat::CompressOptions;

/// An MLP whose saved activations dwarf everything else.
struct Mlp {
  torch::nn::Sequential model;
  torch::Tensor input;
  Mlp() {
    torch::manual_seed(4);
    model = torch::nn::Sequential(
        torch::nn::Linear(64, 512),
        torch::nn::Tanh(),
        torch::nn::Linear(512, 512),
        torch::nn::Tanh(),
        torch::nn::Linear(512, 64));
    input = torch::randn({256, 64});
    for (auto& p : model->parameters()) {
      p.mutable_grad() = torch::zeros_like(p);
    }
  }
};

/// Bytes alive between forward and backward (the saved activations), and
/// the gradients.
std::pair<int64_t, std::vector<torch::Tensor>> step(
    Mlp& mlp, std::optional<CompressOptions> options) {
  for (auto& p : mlp.model->parameters()) {
    p.grad().zero_();
  }
  remat::MemoryMeter meter;
  torch::Tensor loss;
  {
    std::optional<CompressActivations> compressed;
    if (options) {
      compressed.emplace(*options);
    }
    loss = mlp.model->forward(mlp.input).pow(2).mean();
  }
  const int64_t kept = meter.current_bytes() - meter.baseline_bytes();
  loss.backward();
  std::vector<torch::Tensor> grads;
  for (const auto& p : mlp.model->parameters()) {
    grads.push_back(p.grad().clone());
  }
  return {kept, grads};
}

double max_relative_error(
    const std::vector<torch::Tensor>& expected,
    const std::vector<torch::Tensor>& actual) {
  double worst = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double scale = expected[i].abs().max().item<double>();
    worst = std::max(
        worst, (expected[i] - actual[i]).abs().max().item<double>() / scale);
  }
  return worst;
}

TEST(CompressActivations, Bf16HalvesTheSavedBytesAndKeepsGradientsClose) {
  Mlp mlp;
  const auto [plain_bytes, plain_grads] = step(mlp, std::nullopt);
  const auto [bf16_bytes, bf16_grads] =
      step(mlp, CompressOptions().type(CompressedType::kBFloat16));
  const auto [fp16_bytes, fp16_grads] =
      step(mlp, CompressOptions().type(CompressedType::kFloat16));
  const auto [int8_bytes, int8_grads] =
      step(mlp, CompressOptions().type(CompressedType::kInt8));
  // The input (a leaf that does not require grad) and the loss are kept as
  // in the plain run; everything else at half (quarter) size.
  const double bf16_ratio =
      static_cast<double>(bf16_bytes) / static_cast<double>(plain_bytes);
  const double int8_ratio =
      static_cast<double>(int8_bytes) / static_cast<double>(plain_bytes);
  EXPECT_GT(bf16_ratio, 0.45);
  EXPECT_LT(bf16_ratio, 0.56);
  EXPECT_EQ(fp16_bytes, bf16_bytes);
  EXPECT_GT(int8_ratio, 0.2);
  EXPECT_LT(int8_ratio, 0.31);
  // Lossy, but close: bf16 keeps 8 bits of mantissa, fp16 11, int8 ~7.
  EXPECT_LT(max_relative_error(plain_grads, bf16_grads), 0.05);
  EXPECT_LT(max_relative_error(plain_grads, fp16_grads), 0.01);
  EXPECT_LT(max_relative_error(plain_grads, int8_grads), 0.1);
  EXPECT_GT(max_relative_error(plain_grads, bf16_grads), 0)
      << "bf16 storage must actually round the saved values";
}

/// Bytes alive after a forward that saves a parameter-like leaf `a`, an
/// fp32 activation `b`, an int64 index and a bf16 tensor.
int64_t bytes_kept_by_mixed_forward(std::optional<CompressOptions> options) {
  torch::manual_seed(5);
  auto a = torch::randn({256, 256}, torch::requires_grad());
  auto index = torch::arange(0, 256, 2);
  remat::MemoryMeter meter;
  torch::Tensor b, loss;
  {
    std::optional<CompressActivations> compressed;
    if (options) {
      compressed.emplace(*options);
    }
    b = a * 2;                                   // fp32 activation, 256 KiB
    auto c = b.mm(a);                            // saves b and a
    loss = c.index_select(0, index).sum() +      // saves the int64 index
           c.to(torch::kBFloat16).pow(2).sum();  // saves a bf16 tensor
  }
  const int64_t kept = meter.current_bytes() - meter.baseline_bytes();
  loss.backward();
  return kept;
}

TEST(CompressActivations, CompressesOnlyWideFloatActivations) {
  // Of the saved tensors only b becomes a copy (int8: 64 KiB); the leaf a,
  // the index and the bf16 tensor are kept as they are.
  const int64_t plain = bytes_kept_by_mixed_forward(std::nullopt);
  EXPECT_EQ(
      bytes_kept_by_mixed_forward(
          CompressOptions().type(CompressedType::kInt8)),
      plain + 256 * 256);
  EXPECT_EQ(
      bytes_kept_by_mixed_forward(
          CompressOptions().type(CompressedType::kBFloat16)),
      plain + 256 * 256 * 2);
  EXPECT_THROW(
      CompressActivations(CompressOptions().min_bytes(-1)), c10::Error);
}

// An expanded tensor (stride 0) over a small storage is kept as it is: a
// compressed copy would hold every repetition. Before, the step's peak rose
// from 50.3 MB to 75.5 MB (bf16) and 71.3 MB (int8) on this forward.
TEST(CompressActivations, TensorsThatRepeatTheirStorageAreKept) {
  torch::manual_seed(1);
  const auto peak = [](std::optional<CompressOptions> options) {
    const torch::Tensor x = torch::randn({256, 64}, torch::requires_grad());
    remat::MemoryMeter meter;
    torch::Tensor loss;
    {
      std::optional<CompressActivations> guard;
      if (options) {
        guard.emplace(*options);
      }
      const torch::Tensor row = x.sum(0, true).expand({65536, 64});
      loss = (row * row).sum();
    }
    loss.backward();
    return meter.peak_delta_bytes();
  };
  const int64_t plain = peak(std::nullopt);
  for (const CompressedType type :
       {CompressedType::kBFloat16, CompressedType::kInt8}) {
    EXPECT_EQ(peak(CompressOptions().type(type)), plain);
  }
}

// A saved tensor modified in place after the forward: the compressed copy
// holds the value before the change; plain autograd refuses such a backward,
// and so does the guard, compressed or kept as is (min_bytes).
TEST(CompressActivations, ASavedTensorModifiedInPlaceIsRefused) {
  torch::manual_seed(4);
  torch::nn::Linear layer(64, 64);
  const torch::Tensor input = torch::randn({128, 64});
  for (const int64_t min_bytes : {int64_t{0}, int64_t{1} << 40}) {
    SCOPED_TRACE("min_bytes " + std::to_string(min_bytes));
    const torch::Tensor hidden = layer(input);
    torch::Tensor loss;
    {
      CompressActivations compress(CompressOptions()
                                       .type(CompressedType::kBFloat16)
                                       .min_bytes(min_bytes));
      loss = torch::tanh(hidden).sum() + (hidden * hidden).sum();
    }
    hidden.detach().add_(1);
    try {
      loss.backward();
      ADD_FAILURE() << "expected an error";
    } catch (const c10::Error& error) {
      EXPECT_NE(
          std::string(error.what_without_backtrace())
              .find("remat::CompressActivations: one of the variables needed "
                    "for gradient computation has been modified by an "
                    "inplace operation since it was saved"),
          std::string::npos)
          << error.what_without_backtrace();
    }
  }
}

TEST(CompressActivations, MinBytesKeepsSmallTensorsExact) {
  Mlp mlp;
  const auto [plain_bytes, plain_grads] = step(mlp, std::nullopt);
  const auto [bytes, grads] = step(
      mlp,
      CompressOptions()
          .type(CompressedType::kBFloat16)
          .min_bytes(int64_t{1} << 40));
  EXPECT_EQ(bytes, plain_bytes);
  for (size_t i = 0; i < grads.size(); ++i) {
    EXPECT_TRUE(torch::equal(grads[i], plain_grads[i])) << "parameter " << i;
  }
}

// A tensor kept as it is (below min_bytes) that is the output of the node
// saving it must not keep that node alive.
TEST(CompressActivations, AGraphWhoseBackwardNeverRunsIsFreed) {
  // The output's storage: held by the node if the node holds itself.
  std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> output;
  {
    const torch::Tensor a = torch::randn({8, 8}).requires_grad_(true);
    torch::Tensor loss;
    {
      CompressActivations compress(CompressOptions().min_bytes(1 << 20));
      const torch::Tensor y = (a * 2).exp();
      output.emplace(y.storage().getWeakStorageImpl());
      loss = y.sum();
    }
  }
  EXPECT_TRUE(output && output->expired());
}

}  // namespace
