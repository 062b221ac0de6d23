// cnn.h — convolutional demo models with BatchNorm: small_cnn (Conv-BN-ReLU
// stages, pooling, flatten, linear head) and resnet_chain (ResNet-style
// residual blocks of growing channels and shrinking resolution).
//
// Demo models (not the remat API). Every child of the returned Sequential
// takes one Tensor and returns one Tensor. Inputs are NCHW float images;
// outputs are logits [N, classes]. BatchNorm makes them the test case for
// module state under recomputation (running statistics must update once).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace remat::models {

/// Options of one Conv3x3-BatchNorm-ReLU stage.
struct ConvBnReluOptions {
  ConvBnReluOptions(int64_t in_channels, int64_t out_channels)
      : in_channels_(in_channels), out_channels_(out_channels) {}
  /// Input channels.
  TORCH_ARG(int64_t, in_channels);
  /// Output channels.
  TORCH_ARG(int64_t, out_channels);
  /// Convolution stride (resolution divides by it). Default: 1.
  TORCH_ARG(int64_t, stride) = 1;
};

/// relu(bn(conv3x3(x))), padding 1, no convolution bias.
class ConvBnReluImpl : public torch::nn::Cloneable<ConvBnReluImpl> {
 public:
  explicit ConvBnReluImpl(const ConvBnReluOptions& options_);
  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  torch::Tensor forward(const torch::Tensor& input);

  ConvBnReluOptions options;
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
};
TORCH_MODULE(ConvBnRelu);

/// Options of one ResNet basic block.
struct ResidualConvBlockOptions {
  ResidualConvBlockOptions(int64_t in_channels, int64_t out_channels)
      : in_channels_(in_channels), out_channels_(out_channels) {}
  /// Input channels.
  TORCH_ARG(int64_t, in_channels);
  /// Output channels.
  TORCH_ARG(int64_t, out_channels);
  /// Stride of the first convolution and the shortcut. Default: 1.
  TORCH_ARG(int64_t, stride) = 1;
};

/// ResNet basic block: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)),
/// the shortcut a 1x1 convolution + BatchNorm when shape changes, else x.
class ResidualConvBlockImpl
    : public torch::nn::Cloneable<ResidualConvBlockImpl> {
 public:
  explicit ResidualConvBlockImpl(const ResidualConvBlockOptions& options_);
  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  torch::Tensor forward(const torch::Tensor& input);

  ResidualConvBlockOptions options;
  torch::nn::Conv2d conv1{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr};
  torch::nn::Conv2d conv2{nullptr};
  torch::nn::BatchNorm2d bn2{nullptr};
  torch::nn::Conv2d shortcut_conv{nullptr};  // null for identity shortcuts
  torch::nn::BatchNorm2d shortcut_bn{nullptr};
};
TORCH_MODULE(ResidualConvBlock);

/// Classifier head: global average pooling, flatten, Linear.
/// Input [N, C, H, W], output [N, classes].
class PoolLinearHeadImpl : public torch::nn::Cloneable<PoolLinearHeadImpl> {
 public:
  PoolLinearHeadImpl(int64_t channels, int64_t classes);
  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  torch::Tensor forward(const torch::Tensor& input);

  int64_t channels;
  int64_t classes;
  torch::nn::Linear linear{nullptr};
};
TORCH_MODULE(PoolLinearHead);

/// Options of small_cnn().
struct SmallCnnOptions {
  /// Input image channels. Default: 3.
  TORCH_ARG(int64_t, in_channels) = 3;
  /// Input image height and width; must be divisible by 2^channels.size().
  /// Default: 32.
  TORCH_ARG(int64_t, image_size) = 32;
  /// Output channels of each Conv-BN-ReLU stage (each followed by 2x2 max
  /// pooling). Default: {16, 32}.
  TORCH_ARG(std::vector<int64_t>, channels) = std::vector<int64_t>{16, 32};
  /// Number of classes (logits). Default: 10.
  TORCH_ARG(int64_t, classes) = 10;
};

/// [ConvBnRelu, MaxPool2d(2)] per entry of channels, then Flatten and Linear.
///
/// Example: auto model = small_cnn();
///          auto logits = model->forward(torch::randn({8, 3, 32, 32}));
/// Throws c10::Error on non-positive sizes, empty channels, or an image size
/// not divisible by 2^channels.size().
torch::nn::Sequential small_cnn(const SmallCnnOptions& options = {});

/// Options of resnet_chain().
struct ResNetChainOptions {
  /// Input image channels. Default: 3.
  TORCH_ARG(int64_t, in_channels) = 3;
  /// Channels of each stage; stage 0 keeps the stem resolution, every later
  /// stage halves it. Default: {16, 32, 64, 128}.
  TORCH_ARG(std::vector<int64_t>, stage_channels) = std::vector<int64_t>{
      16, 32, 64, 128};
  /// Residual blocks per stage (each block is one child). Default: 2.
  TORCH_ARG(int64_t, blocks_per_stage) = 2;
  /// Number of classes (logits). Default: 10.
  TORCH_ARG(int64_t, classes) = 10;
};

/// Stem ConvBnRelu, then ResidualConvBlocks stage by stage, then a
/// PoolLinearHead: 2 + stage_channels.size() * blocks_per_stage children.
///
/// Example: auto model = resnet_chain();
///          auto logits = model->forward(torch::randn({8, 3, 32, 32}));
/// Throws c10::Error on empty stage_channels or non-positive sizes.
torch::nn::Sequential resnet_chain(const ResNetChainOptions& options = {});

}  // namespace remat::models
