// residual_ffn.h — a stack of pre-LayerNorm residual feed-forward blocks:
//   x + Linear(hidden->dim)(Dropout(GELU(Linear(dim->hidden)(LayerNorm(x)))))
//
// Demo model (not the remat API); the checkpoint benchmark's model is the
// default options (32 blocks, dim 512, hidden 2048) with a batch of 1024 rows.
// Each block is one child of the returned Sequential; input and output are
// [*, dim].
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace remat::models {

/// Options of one residual FFN block.
struct ResidualFfnBlockOptions {
  ResidualFfnBlockOptions(int64_t dim, int64_t hidden)
      : dim_(dim), hidden_(hidden) {}
  /// Model width (features of input and output).
  TORCH_ARG(int64_t, dim);
  /// Inner width of the feed-forward layer.
  TORCH_ARG(int64_t, hidden);
  /// Dropout probability after GELU. Default: 0.1.
  TORCH_ARG(double, dropout) = 0.1;
};

/// x + fc2(dropout(gelu(fc1(norm(x))))).
class ResidualFfnBlockImpl : public torch::nn::Cloneable<ResidualFfnBlockImpl> {
 public:
  explicit ResidualFfnBlockImpl(const ResidualFfnBlockOptions& options_);
  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  torch::Tensor forward(const torch::Tensor& input);

  ResidualFfnBlockOptions options;
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear fc1{nullptr};
  torch::nn::GELU gelu{nullptr};
  torch::nn::Dropout dropout{nullptr};
  torch::nn::Linear fc2{nullptr};
};
TORCH_MODULE(ResidualFfnBlock);

/// Options of residual_ffn_stack().
struct ResidualFfnStackOptions {
  /// Number of blocks (children). Default: 32.
  TORCH_ARG(int64_t, blocks) = 32;
  /// Model width. Default: 512.
  TORCH_ARG(int64_t, dim) = 512;
  /// Inner feed-forward width. Default: 2048.
  TORCH_ARG(int64_t, hidden) = 2048;
  /// Dropout probability inside every block. Default: 0.1.
  TORCH_ARG(double, dropout) = 0.1;
};

/// `blocks` ResidualFfnBlocks in a Sequential.
///
/// Example: auto model = residual_ffn_stack();  // the 32-block default
///          auto y = model->forward(torch::randn({1024, 512}));
/// Throws c10::Error if blocks, dim or hidden < 1 or dropout not in [0, 1).
torch::nn::Sequential residual_ffn_stack(
    const ResidualFfnStackOptions& options = {});

}  // namespace remat::models
