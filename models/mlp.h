// mlp.h — MLP chains: a torch::nn::Sequential of Linear+ReLU(+Dropout) stages.
//
// Demo models (not the remat API). Every child of the returned Sequential
// takes one Tensor and returns one Tensor, so the model is a chain of stages
// for the planner. Used by experiment E1 (uniform_mlp_chain: n blocks of
// Linear(512->512)+ReLU) and E2 (mlp_chain over varying_mlp_widths()).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace remat::models {

/// Options of one Linear+ReLU(+Dropout) stage.
struct LinearReluOptions {
  LinearReluOptions(int64_t in_features, int64_t out_features)
      : in_features_(in_features), out_features_(out_features) {}
  /// Input width (features).
  TORCH_ARG(int64_t, in_features);
  /// Output width (features).
  TORCH_ARG(int64_t, out_features);
  /// Dropout probability after the ReLU; 0 adds no Dropout. Default: 0.
  TORCH_ARG(double, dropout) = 0.0;
};

/// One stage: relu(linear(x)), then dropout when options.dropout() > 0.
/// Input [*, in_features], output [*, out_features].
class LinearReluImpl : public torch::nn::Cloneable<LinearReluImpl> {
 public:
  explicit LinearReluImpl(const LinearReluOptions& options_);
  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  torch::Tensor forward(const torch::Tensor& input);

  LinearReluOptions options;
  torch::nn::Linear linear{nullptr};
  torch::nn::Dropout dropout{nullptr};  // null when options.dropout() == 0
};
TORCH_MODULE(LinearRelu);

/// Options of mlp_chain().
struct MlpChainOptions {
  explicit MlpChainOptions(std::vector<int64_t> widths)
      : widths_(std::move(widths)) {}
  /// Widths: widths[0] is the input width and stage i maps widths[i] to
  /// widths[i + 1]; at least two entries, all positive.
  TORCH_ARG(std::vector<int64_t>, widths);
  /// Dropout probability of every stage. Default: 0 (no Dropout modules).
  TORCH_ARG(double, dropout) = 0.0;
};

/// A chain of widths.size() - 1 LinearRelu stages.
///
/// Example: auto model = mlp_chain(MlpChainOptions({512, 2048, 256}));
/// Throws c10::Error if fewer than two widths or a width < 1 is given, or
/// dropout is outside [0, 1).
torch::nn::Sequential mlp_chain(const MlpChainOptions& options);

/// The E1 model: `blocks` stages of Linear(width->width)+ReLU.
///
/// Example: auto model = uniform_mlp_chain(32);  // 32 x Linear(512->512)+ReLU
/// Throws c10::Error if blocks < 1 or width < 1.
torch::nn::Sequential uniform_mlp_chain(int64_t blocks, int64_t width = 512);

/// Widths for a heterogeneous chain of `stages` stages (stages + 1 entries),
/// cycling deterministically through values between 256 and 2048 so that
/// stage costs and output sizes vary by up to 8x (the E2 MLP).
/// Throws c10::Error if stages < 1.
std::vector<int64_t> varying_mlp_widths(int64_t stages);

}  // namespace remat::models
