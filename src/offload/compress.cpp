// compress.cpp: CompressActivations, saved-tensor hooks that store activations
// in a narrower type (see remat/compress.h).
#include "remat/compress.h"

#include <any>
#include <cmath>
#include <limits>
#include <memory>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "pack_cache.h"

namespace remat {
namespace {

/// A saved tensor as stored: compressed (with what restores it) or as is.
struct Packed {
  at::Tensor stored;
  detail::SavedVersion version;  // NOTE: [A saved tensor modified in place]
  c10::ScalarType original = at::kFloat;
  bool compressed = false;
  double scale = 1;  // kInt8: original = stored * scale
  // kInt8: the largest finite magnitude, when stored * scale could round
  // past the type's largest finite value (fp32's extremes); 0 otherwise.
  double clamp_abs = 0;
  // kInt8 with non-finite elements (NOTE: [Values a narrow type cannot
  // hold]): their positions in row-major order and their values, restored
  // exactly; `stored` is then contiguous.
  at::Tensor special_at;
  at::Tensor special_values;
};

// NOTE: [Values a narrow type cannot hold]
// Compression rounds; it must never turn a finite value into inf or NaN, nor
// lose an inf or a NaN, since either changes gradients far beyond rounding
// (one -inf from log(0) made int8's scale inf and every restored element
// NaN). So:
//  - bf16 and fp16 hold inf and NaN as they are; a tensor whose largest
//    finite magnitude is above the type's largest finite value (fp16: 65504)
//    is stored as it is.
//  - int8 scales by the largest finite magnitude and keeps the non-finite
//    elements aside, by position, when they are few (a sparse list); when
//    more than one element in 64 is non-finite, or the scale is below the
//    smallest normal value of the tensor's type (so that dividing by it
//    overflows), the tensor is stored as it is.
// Elements below the narrow type's smallest normal value (fp32 denormals in
// fp16, and tiny elements next to large ones in int8) round towards 0, as
// any rounding does.

/// The largest finite magnitude in `tensor` (0 if none), and whether it has
/// non-finite elements. Reductions only, no full-size temporary, unless it
/// has non-finite elements.
struct Magnitude {
  double max_finite_abs = 0;
  bool has_special = false;
};
Magnitude magnitude(const at::Tensor& tensor) {
  Magnitude result;
  if (tensor.numel() == 0) {
    return result;
  }
  const auto [low, high] = at::aminmax(tensor);
  const double low_value = low.item<double>();
  const double high_value = high.item<double>();
  if (std::isfinite(low_value) && std::isfinite(high_value)) {
    result.max_finite_abs = std::max(std::abs(low_value), std::abs(high_value));
    return result;
  }
  result.has_special = true;
  const at::Tensor finite_abs =
      tensor.abs().masked_fill_(at::logical_not(at::isfinite(tensor)), 0);
  result.max_finite_abs = finite_abs.max().item<double>();
  return result;
}

/// The largest finite value of `type`.
double largest_finite(CompressedType type) {
  switch (type) {
    case CompressedType::kBFloat16:
      return static_cast<double>(std::numeric_limits<c10::BFloat16>::max());
    case CompressedType::kFloat16:
      return static_cast<double>(std::numeric_limits<c10::Half>::max());
    case CompressedType::kInt8:
      break;
  }
  return std::numeric_limits<double>::infinity();
}

bool compressible(const at::Tensor& tensor, const CompressOptions& options) {
  return tensor.defined() && tensor.is_floating_point() &&
         tensor.element_size() > 2 &&
         static_cast<int64_t>(tensor.nbytes()) >= options.min_bytes() &&
         !detail::is_parameter_like(tensor) &&
         !detail::repeats_elements(tensor);
}

Packed as_is(const at::Tensor& tensor) {
  Packed packed;
  // Detached: an output saved by its own node must not hold that node.
  packed.stored = tensor.detach();
  return packed;
}

/// int8 with a per-tensor scale (NOTE: [Values a narrow type cannot hold]).
Packed pack_int8(const at::Tensor& tensor, const Magnitude& magnitude) {
  Packed packed;
  packed.original = tensor.scalar_type();
  packed.compressed = true;
  if (magnitude.has_special) {
    const at::Tensor special =
        at::logical_not(at::isfinite(tensor)).reshape(-1);
    const int64_t count = special.sum().item<int64_t>();
    if (count * 64 > tensor.numel()) {
      return as_is(tensor);
    }
    packed.special_at = special.nonzero().squeeze(1);
    packed.special_values =
        tensor.reshape(-1).index_select(0, packed.special_at);
  }
  const double smallest_normal =
      tensor.scalar_type() == at::kDouble
          ? std::numeric_limits<double>::min()
          : static_cast<double>(std::numeric_limits<float>::min());
  if (magnitude.max_finite_abs > 0) {
    packed.scale = magnitude.max_finite_abs / 127.0;
    if (packed.scale < smallest_normal) {
      return as_is(tensor);
    }
  }
  const double largest_of_type =
      tensor.scalar_type() == at::kDouble
          ? std::numeric_limits<double>::max()
          : static_cast<double>(std::numeric_limits<float>::max());
  if (magnitude.max_finite_abs > largest_of_type / 2) {
    packed.clamp_abs = magnitude.max_finite_abs;
  }
  at::Tensor scaled = tensor.div(packed.scale);
  if (magnitude.has_special) {
    scaled.nan_to_num_(0, 0, 0);
  }
  packed.stored = scaled.round_().clamp_(-127, 127).to(at::kChar);
  if (magnitude.has_special) {
    packed.stored = packed.stored.contiguous();
  }
  return packed;
}

Packed pack(const at::Tensor& tensor, const CompressOptions& options) {
  if (!compressible(tensor, options)) {
    return as_is(tensor);
  }
  const Magnitude magnitude_of_tensor = magnitude(tensor);
  if (options.type() == CompressedType::kInt8) {
    return pack_int8(tensor, magnitude_of_tensor);
  }
  if (magnitude_of_tensor.max_finite_abs > largest_finite(options.type())) {
    return as_is(tensor);
  }
  Packed packed;
  packed.original = tensor.scalar_type();
  packed.compressed = true;
  packed.stored = tensor.to(
      options.type() == CompressedType::kFloat16 ? at::kHalf : at::kBFloat16);
  return packed;
}

at::Tensor unpack(const Packed& packed) {
  packed.version.check("remat::CompressActivations");
  if (!packed.compressed) {
    return packed.stored;
  }
  at::Tensor restored = packed.stored.to(packed.original);
  if (packed.scale != 1.0) {
    restored.mul_(packed.scale);
  }
  if (packed.clamp_abs > 0) {
    restored.clamp_(-packed.clamp_abs, packed.clamp_abs);
  }
  if (packed.special_at.defined()) {
    restored.view(-1).index_put_({packed.special_at}, packed.special_values);
  }
  return restored;
}

}  // namespace

CompressActivations::CompressActivations(CompressOptions options) {
  TORCH_CHECK(
      options.min_bytes() >= 0,
      "remat::CompressActivations: expected min_bytes >= 0, got ",
      options.min_bytes());
  // NOTE: [One copy per saved tensor] (pack_cache.h)
  auto cache = std::make_shared<detail::PackCache<const Packed>>();
  hooks_ = std::make_unique<SavedTensorHooks>(
      [cache, options](const at::Tensor& tensor) -> std::any {
        auto make = [&options](const at::Tensor& t) {
          Packed packed = pack(t, options);
          packed.version = detail::SavedVersion(t);
          return std::make_shared<const Packed>(std::move(packed));
        };
        return compressible(tensor, options) ? cache->find_or_make(tensor, make)
                                             : make(tensor);
      },
      [](const std::any& stored) {
        return unpack(
            *std::any_cast<const std::shared_ptr<const Packed>&>(stored));
      });
}

}  // namespace remat
