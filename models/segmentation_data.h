// segmentation_data.h — synthetic segmentation data (no download): random
// ellipse (2D) and ellipsoid (3D) phantoms with their label maps, and the
// loss and metric of the U-Net demo.
//
// A phantom is a zero background with a few randomly oriented ellipses or
// ellipsoids, each of one random brightness in [min_intensity, 1], plus
// Gaussian noise over the whole image; its label map is 1 inside any object
// and 0 elsewhere (two classes). Every object covers at least the voxel at
// its center, so every label map has foreground; with the default options
// the objects cannot cover a whole image, so it has background too. The data
// is a function of the seed and the arguments alone (its own generator; the
// global RNG is neither read nor advanced). Not supported: more than one
// foreground class, anisotropic voxels, 1D or 4D+ data.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace remat::models {

/// Options of phantom_batch(). Lengths are fractions of the smallest
/// spatial size.
struct PhantomOptions {
  /// Fewest objects per image; at least 1. Default: 1.
  TORCH_ARG(int64_t, min_objects) = 1;
  /// Most objects per image (each image draws its count uniformly from
  /// [min_objects, max_objects]). Default: 3.
  TORCH_ARG(int64_t, max_objects) = 3;
  /// Smallest semi-axis (fraction). Default: 0.08.
  TORCH_ARG(double, min_radius) = 0.08;
  /// Largest semi-axis (fraction); below 0.5. Default: 0.25.
  TORCH_ARG(double, max_radius) = 0.25;
  /// Lowest object brightness (the background is 0, the brightest object
  /// 1); in (0, 1]. Default: 0.5.
  TORCH_ARG(double, min_intensity) = 0.5;
  /// Standard deviation of the additive Gaussian noise (intensity units).
  /// Default: 0.25.
  TORCH_ARG(double, noise_std) = 0.25;
};

/// One batch of segmentation data.
struct SegmentationBatch {
  torch::Tensor images;  // float [N, 1, *spatial]
  torch::Tensor labels;  // int64 [N, *spatial], 0 background, 1 object
};

/// `batch` phantoms of `spatial_size` ({H, W} for 2D, {D, H, W} for 3D)
/// drawn from `seed`: the same arguments give the same batch, bitwise.
/// Images and labels are on the CPU.
///
/// Example:
///   SegmentationBatch data = phantom_batch(8, {32, 32}, /*seed=*/1);
///   auto loss = segmentation_loss(net->forward(data.images), data.labels);
/// Throws c10::Error naming the value if batch < 1, spatial_size does not
/// have 2 or 3 entries or has one < 1, or an option is out of its range.
SegmentationBatch phantom_batch(
    int64_t batch,
    const std::vector<int64_t>& spatial_size,
    uint64_t seed,
    const PhantomOptions& options = {});

/// Cross-entropy of `logits` [N, C, *spatial] (C >= 2) against int64
/// `labels` [N, *spatial] (values in [0, C)), plus the soft Dice loss
/// 1 - (2 sum(p y) + 1) / (sum(p) + sum(y) + 1) of the foreground, where
/// p = 1 - softmax(logits)[:, 0] and y = (labels != 0), summed over the
/// whole batch. Differentiable in `logits`.
///
/// Example:
///   auto loss = segmentation_loss(net->forward(batch.images), batch.labels);
///   loss.backward();
/// Throws c10::Error naming both shapes if they do not match as above or
/// labels are not int64.
torch::Tensor segmentation_loss(
    const torch::Tensor& logits, const torch::Tensor& labels);

/// Hard foreground Dice in [0, 1] of the prediction argmax(logits, 1) != 0
/// against labels != 0, over the whole batch: 2 |P and Y| / (|P| + |Y|),
/// and 1 when both are empty. Shapes as segmentation_loss; not
/// differentiable.
///
/// Example:
///   double dice = dice_score(net->forward(batch.images), batch.labels);
double dice_score(const torch::Tensor& logits, const torch::Tensor& labels);

}  // namespace remat::models
