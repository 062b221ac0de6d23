// unet.h — a U-Net for 2D or 3D segmentation, as a module and as a graph of
// stages for the graph planner (remat/graph.h).
//
// Demo model (not the remat API). Layout for levels L, width w:
//   encoder l (l = 0 .. L-1): UNetBlock to w * 2^l channels, then 2x max-pool
//   bottleneck:               UNetBlock to w * 2^L channels
//   decoder l (l = L-1 .. 0): transposed conv (kernel 2, stride 2) of the
//                             stage below to w * 2^l channels, concatenated
//                             after encoder l's output, then a UNetBlock to
//                             w * 2^l channels
//   head:                     1x1 convolution to `classes` logits
// Input float [N, in_channels, *spatial] with dims spatial sizes, each
// divisible by 2^L (so every pooling halves exactly and every upsampling
// meets its skip); output logits [N, classes, *spatial].
//
// UNet::stages() gives the same computation as 3L + 2 GraphStages (one per
// block), or 6L + 3 (one per convolution round); unlike the
// other demo models this one is not a chain (the skips are graph edges), so it
// has no Sequential form.
#pragma once

#include <torch/torch.h>

#include "remat/graph.h"

#include <cstdint>
#include <string>
#include <vector>

namespace remat::models {

/// The normalization after each convolution of a UNetBlock.
enum class UNetNorm {
  kBatch,  ///< BatchNorm2d / BatchNorm3d (running statistics in buffers)
  kGroup,  ///< GroupNorm of UNetOptions::norm_groups groups
  kNone,   ///< none; the convolutions then have a bias
};

/// Parses "batch", "group" or "none". Throws c10::Error naming the text
/// otherwise.
UNetNorm parse_unet_norm(const std::string& text);

/// "batch", "group" or "none".
std::string to_string(UNetNorm norm);

/// Options of UNet.
struct UNetOptions {
  /// Spatial dimensions: 2 (images [N, C, H, W]) or 3 (volumes
  /// [N, C, D, H, W]). Default: 2.
  TORCH_ARG(int64_t, dims) = 2;
  /// Input channels. Default: 1.
  TORCH_ARG(int64_t, in_channels) = 1;
  /// Output classes (logit channels). Default: 2.
  TORCH_ARG(int64_t, classes) = 2;
  /// Resolution levels (poolings); at least 1. Spatial sizes must be
  /// divisible by 2^levels. Default: 3.
  TORCH_ARG(int64_t, levels) = 3;
  /// Channels of level 0; each deeper level doubles them. Default: 8.
  TORCH_ARG(int64_t, base_width) = 8;
  /// Normalization after each convolution. Default: UNetNorm::kBatch.
  TORCH_ARG(UNetNorm, norm) = UNetNorm::kBatch;
  /// Groups of UNetNorm::kGroup; must divide base_width. Ignored by the
  /// other norms. Default: 4.
  TORCH_ARG(int64_t, norm_groups) = 4;
  /// Dropout probability after each ReLU of every block (element-wise);
  /// 0 adds no Dropout modules. Default: 0.
  TORCH_ARG(double, dropout) = 0.0;
};

/// Options of one UNetBlock or UNetDecoderBlock.
struct UNetBlockOptions {
  UNetBlockOptions(int64_t dims, int64_t in_channels, int64_t out_channels)
      : dims_(dims), in_channels_(in_channels), out_channels_(out_channels) {}
  /// Spatial dimensions: 2 or 3.
  TORCH_ARG(int64_t, dims);
  /// Input channels.
  TORCH_ARG(int64_t, in_channels);
  /// Output channels.
  TORCH_ARG(int64_t, out_channels);
  /// As UNetOptions::norm. Default: UNetNorm::kBatch.
  TORCH_ARG(UNetNorm, norm) = UNetNorm::kBatch;
  /// As UNetOptions::norm_groups; must divide out_channels under kGroup.
  /// Default: 4.
  TORCH_ARG(int64_t, norm_groups) = 4;
  /// As UNetOptions::dropout. Default: 0.
  TORCH_ARG(double, dropout) = 0.0;
};

/// Two rounds of conv3x3 (3x3x3 in 3D, padding 1) -> norm -> ReLU
/// (-> Dropout when dropout > 0). Keeps the spatial size.
/// Input [N, in_channels, *spatial], output [N, out_channels, *spatial].
class UNetBlockImpl : public torch::nn::Cloneable<UNetBlockImpl> {
 public:
  explicit UNetBlockImpl(const UNetBlockOptions& options_);
  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  torch::Tensor forward(const torch::Tensor& input);
  /// Round `index` (0 or 1) of the block: its convolution, norm, ReLU (and
  /// Dropout), a Sequential sharing this block's modules. Running round 0
  /// then round 1 is forward(). Throws c10::Error naming the index unless it
  /// is 0 or 1.
  torch::nn::Sequential round(int64_t index) const;

  UNetBlockOptions options;
  /// The layers in order, for example Conv2d, BatchNorm2d, ReLU, Conv2d,
  /// BatchNorm2d, ReLU.
  torch::nn::Sequential layers{nullptr};
};
TORCH_MODULE(UNetBlock);

/// One decoder level: block(cat(skip, up(below))). `up` is a transposed
/// convolution (kernel 2, stride 2) from in_channels to out_channels, `block`
/// a UNetBlock from 2 * out_channels to out_channels.
/// Input `below` [N, in_channels, *s] and `skip` [N, out_channels, *2s];
/// output [N, out_channels, *2s].
class UNetDecoderBlockImpl : public torch::nn::Cloneable<UNetDecoderBlockImpl> {
 public:
  explicit UNetDecoderBlockImpl(const UNetBlockOptions& options_);
  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  /// Throws c10::Error naming both shapes if `skip` is not the shape of the
  /// upsampled `below`.
  torch::Tensor forward(const torch::Tensor& below, const torch::Tensor& skip);
  /// cat(skip, up(below)) along the channels: what forward() passes to
  /// `block`. Throws as forward().
  torch::Tensor join(const torch::Tensor& below, const torch::Tensor& skip);

  UNetBlockOptions options;
  torch::nn::AnyModule up;  // ConvTranspose2d or ConvTranspose3d
  UNetBlock block{nullptr};
};
TORCH_MODULE(UNetDecoderBlock);

/// How UNet::stages() cuts the network into graph stages.
enum class UNetStageSplit {
  /// One stage per block: 3 * levels + 2 stages.
  kBlock,
  /// One stage per convolution round (conv, norm, ReLU, Dropout) of every
  /// block, and a decoder level's upsampling and concatenation as a stage of
  /// its own: 6 * levels + 3 stages. Finer stages let a plan keep or drop
  /// each convolution's output, down to less memory than whole blocks allow.
  kConvolution,
};

/// The U-Net of the top of this header. Children, in execution order:
/// encoder0, pool0, encoder1, pool1, ..., bottleneck, decoder{L-1}, ...,
/// decoder0, head.
///
/// Example:
///   UNet net(UNetOptions().dims(2).levels(3).base_width(8));
///   auto logits = net->forward(torch::randn({4, 1, 64, 64}));  // [4, 2, ..]
///   auto planned = remat::auto_checkpoint(net->stages(), images,
///                                         remat::Budget::parse("50%"));
/// Throws c10::Error (constructor) naming the value if dims is not 2 or 3,
/// levels < 1, in_channels, classes, base_width or norm_groups < 1, dropout
/// is outside [0, 1), or (kGroup) norm_groups does not divide base_width.
class UNetImpl : public torch::nn::Cloneable<UNetImpl> {
 public:
  explicit UNetImpl(const UNetOptions& options_ = {});
  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  /// Logits [N, classes, *spatial] of `input` [N, in_channels, *spatial].
  /// Throws c10::Error if input is not of that form (naming its shape), if
  /// a spatial size is not divisible by 2^levels (naming the rule, the size
  /// and levels), or if, in training with BatchNorm, the bottleneck would
  /// have one value per channel (batch 1 with an input of 2^levels per
  /// side).
  torch::Tensor forward(const torch::Tensor& input);

  /// The same computation as graph stages. With UNetStageSplit::kBlock
  /// (the default), 3 * levels + 2 stages, in this order:
  ///   encoder l, pool l         for l = 0 .. levels-1 (stages 2l, 2l + 1)
  ///   bottleneck                (stage 2 * levels)
  ///   decoder l                 for l = levels-1 .. 0
  ///   head                      (the last stage)
  /// Encoder 0 reads the graph input (and checks it as forward() does),
  /// every other encoder, pool and the bottleneck the stage before it;
  /// decoder l reads {the stage before it, encoder l's stage}; the head the
  /// last decoder. Each stage's module is the child it runs (encoder l,
  /// pool l, ...), shared with this UNet.
  /// With UNetStageSplit::kConvolution, 6 * levels + 3 stages: every block
  /// above becomes its two rounds (UNetBlock::round), read in turn, and
  /// decoder l becomes join l (UNetDecoderBlock::join; it reads {the stage
  /// before it, encoder l's round 1}, its module the decoder's `up`) and
  /// the two rounds of the decoder's block.
  /// Either way, running the stages in order computes forward(input)
  /// bitwise (in train mode: from the same RNG state).
  ///
  /// Example:
  ///   auto planned = remat::auto_checkpoint(net->stages(), images, budget);
  std::vector<remat::GraphStage> stages(
      UNetStageSplit split = UNetStageSplit::kBlock) const;

  UNetOptions options;
  std::vector<UNetBlock> encoder;           // encoder[l]: w * 2^l channels
  std::vector<torch::nn::AnyModule> pools;  // MaxPool2d or MaxPool3d, size 2
  UNetBlock bottleneck{nullptr};            // w * 2^levels channels
  std::vector<UNetDecoderBlock> decoder;    // decoder[l]: w * 2^l channels
  torch::nn::AnyModule head;                // 1x1 Conv2d or Conv3d to classes
};
TORCH_MODULE(UNet);

}  // namespace remat::models
