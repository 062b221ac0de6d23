// segmentation_data.cpp — phantom generation, segmentation loss and Dice
// (see segmentation_data.h).
//
// Draw order per image, all from one generator seeded with the seed: the
// object count; per object its radii, brightness and center (one uniform
// block) and its orientation; then the noise. Coordinates
// are in voxels, voxel i spanning [i, i + 1) with its center at i + 0.5.
#include <models/segmentation_data.h>

#include <models/text_data.h>

#include <algorithm>
#include <cmath>

namespace remat::models {
namespace {

constexpr double kPi = 3.14159265358979323846;

/// A uniformly random rotation, double [dims, dims], its columns the
/// object's axes: an angle in 2D, a unit quaternion in 3D.
torch::Tensor random_rotation(int64_t dims, at::Generator& generator) {
  const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
  if (dims == 2) {
    const double angle =
        2.0 * kPi * torch::rand({1}, generator, f64).item<double>();
    const double cosine = std::cos(angle);
    const double sine = std::sin(angle);
    return torch::tensor({cosine, -sine, sine, cosine}, f64).view({2, 2});
  }
  auto quaternion = torch::randn({4}, generator, f64);
  quaternion = quaternion / quaternion.norm().clamp_min(1e-12);
  auto component = quaternion.accessor<double, 1>();
  const double qw = component[0], qx = component[1], qy = component[2],
               qz = component[3];
  return torch::tensor(
             {1 - 2 * (qy * qy + qz * qz),
              2 * (qx * qy - qw * qz),
              2 * (qx * qz + qw * qy),
              2 * (qx * qy + qw * qz),
              1 - 2 * (qx * qx + qz * qz),
              2 * (qy * qz - qw * qx),
              2 * (qx * qz - qw * qy),
              2 * (qy * qz + qw * qx),
              1 - 2 * (qx * qx + qy * qy)},
             f64)
      .view({3, 3});
}

void check_phantom_arguments(
    int64_t batch,
    const std::vector<int64_t>& spatial_size,
    const PhantomOptions& options) {
  const char* where = "remat::models::phantom_batch";
  TORCH_CHECK(batch >= 1, where, ": expected batch >= 1, got ", batch);
  TORCH_CHECK(
      spatial_size.size() == 2 || spatial_size.size() == 3,
      where,
      ": expected 2 or 3 spatial sizes, got ",
      spatial_size.size(),
      " (",
      c10::IntArrayRef(spatial_size),
      ")");
  for (int64_t size : spatial_size) {
    TORCH_CHECK(
        size >= 1,
        where,
        ": expected spatial sizes >= 1, got ",
        c10::IntArrayRef(spatial_size));
  }
  TORCH_CHECK(
      options.min_objects() >= 1 &&
          options.max_objects() >= options.min_objects(),
      where,
      ": expected 1 <= min_objects <= max_objects, got ",
      options.min_objects(),
      " and ",
      options.max_objects());
  TORCH_CHECK(
      options.min_radius() > 0.0 &&
          options.max_radius() >= options.min_radius() &&
          options.max_radius() < 0.5,
      where,
      ": expected 0 < min_radius <= max_radius < 0.5, got ",
      options.min_radius(),
      " and ",
      options.max_radius());
  TORCH_CHECK(
      options.min_intensity() > 0.0 && options.min_intensity() <= 1.0,
      where,
      ": expected min_intensity in (0, 1], got ",
      options.min_intensity());
  TORCH_CHECK(
      options.noise_std() >= 0.0,
      where,
      ": expected noise_std >= 0, got ",
      options.noise_std());
}

void check_logits_and_labels(
    const char* where,
    const torch::Tensor& logits,
    const torch::Tensor& labels) {
  TORCH_CHECK(
      logits.defined() && labels.defined(),
      where,
      ": expected logits and labels, got an undefined tensor");
  TORCH_CHECK(
      logits.dim() >= 3 && logits.size(1) >= 2 &&
          labels.scalar_type() == torch::kLong &&
          labels.dim() == logits.dim() - 1 &&
          labels.size(0) == logits.size(0) &&
          labels.sizes().slice(1) == logits.sizes().slice(2),
      where,
      ": expected logits [N, C >= 2, *spatial] and int64 labels "
      "[N, *spatial], got ",
      logits.sizes(),
      " and ",
      labels.scalar_type(),
      " ",
      labels.sizes());
}

}  // namespace

SegmentationBatch phantom_batch(
    int64_t batch,
    const std::vector<int64_t>& spatial_size,
    uint64_t seed,
    const PhantomOptions& options) {
  check_phantom_arguments(batch, spatial_size, options);
  const auto dims = static_cast<int64_t>(spatial_size.size());
  const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
  at::Generator generator = make_cpu_generator(seed);

  std::vector<torch::Tensor> axes;
  for (int64_t size : spatial_size) {
    axes.push_back(torch::arange(size, f64) + 0.5);
  }
  const torch::Tensor voxel_centers =
      torch::stack(torch::meshgrid(axes, "ij"), -1);  // [*spatial, dims]
  const double min_side = static_cast<double>(
      *std::min_element(spatial_size.begin(), spatial_size.end()));

  std::vector<int64_t> image_shape = {batch, 1};
  image_shape.insert(
      image_shape.end(), spatial_size.begin(), spatial_size.end());
  std::vector<int64_t> label_shape = {batch};
  label_shape.insert(
      label_shape.end(), spatial_size.begin(), spatial_size.end());
  SegmentationBatch result{
      torch::empty(image_shape, torch::kFloat),
      torch::empty(label_shape, torch::kLong)};

  const int64_t count_choices =
      options.max_objects() - options.min_objects() + 1;
  for (int64_t image = 0; image < batch; ++image) {
    auto brightness = torch::zeros(spatial_size, f64);
    const double count_draw = torch::rand({1}, generator, f64).item<double>();
    const int64_t objects =
        options.min_objects() +
        std::min(
            count_choices - 1,
            static_cast<int64_t>(count_draw * count_choices));
    for (int64_t object = 0; object < objects; ++object) {
      // [radii (dims), brightness, centers (dims)]
      auto draws = torch::rand({2 * dims + 1}, generator, f64);
      auto draw = draws.accessor<double, 1>();
      const torch::Tensor rotation = random_rotation(dims, generator);
      std::vector<double> radii_voxels(dims);
      std::vector<double> center(dims);
      for (int64_t axis = 0; axis < dims; ++axis) {
        radii_voxels[axis] =
            min_side *
            (options.min_radius() +
             (options.max_radius() - options.min_radius()) * draw[axis]);
      }
      const double largest_radius =
          *std::max_element(radii_voxels.begin(), radii_voxels.end());
      const double object_brightness =
          options.min_intensity() +
          (1.0 - options.min_intensity()) * draw[dims];
      for (int64_t axis = 0; axis < dims; ++axis) {
        // A voxel center, at least the largest radius from the borders when
        // the image allows it, so that the object lies (mostly) inside.
        const int64_t size = spatial_size[axis];
        const int64_t margin =
            std::min(static_cast<int64_t>(largest_radius), (size - 1) / 2);
        const int64_t choices = size - 2 * margin;
        const int64_t index =
            margin + std::min(
                         choices - 1,
                         static_cast<int64_t>(draw[dims + 1 + axis] * choices));
        center[axis] = static_cast<double>(index) + 0.5;
      }
      const auto local =
          (voxel_centers - torch::tensor(center, f64)).matmul(rotation);
      const auto inside =
          (local / torch::tensor(radii_voxels, f64)).square().sum(-1).le(1.0);
      brightness = torch::maximum(
          brightness, inside.to(torch::kDouble) * object_brightness);
    }
    result.labels[image].copy_(brightness.gt(0.0));
    const auto noise =
        torch::randn(spatial_size, generator, f64) * options.noise_std();
    result.images[image][0].copy_(brightness + noise);
  }
  return result;
}

torch::Tensor segmentation_loss(
    const torch::Tensor& logits, const torch::Tensor& labels) {
  check_logits_and_labels("remat::models::segmentation_loss", logits, labels);
  const auto cross_entropy =
      torch::nn::functional::cross_entropy(logits, labels);
  const auto foreground_probability =
      1.0 - torch::softmax(logits, 1).select(1, 0);
  const auto foreground = labels.ne(0).to(logits.scalar_type());
  const auto overlap = (foreground_probability * foreground).sum();
  const auto soft_dice = (2.0 * overlap + 1.0) / (foreground_probability.sum() +
                                                  foreground.sum() + 1.0);
  return cross_entropy + (1.0 - soft_dice);
}

double dice_score(const torch::Tensor& logits, const torch::Tensor& labels) {
  check_logits_and_labels("remat::models::dice_score", logits, labels);
  torch::NoGradGuard no_grad;
  const auto predicted = logits.argmax(1).ne(0);
  const auto truth = labels.ne(0);
  const double overlap = predicted.logical_and(truth).sum().item<double>();
  const double total =
      predicted.sum().item<double>() + truth.sum().item<double>();
  return total == 0.0 ? 1.0 : 2.0 * overlap / total;
}

}  // namespace remat::models
