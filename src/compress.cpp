// compress.cpp: CompressActivations, saved-tensor hooks that store activations
// in a narrower type (see remat/compress.h).
#include "remat/compress.h"

#include <any>
#include <memory>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "pack_cache.h"

namespace remat {
namespace {

/// A saved tensor as stored: compressed (with what restores it) or as is.
struct Packed {
  at::Tensor stored;
  c10::ScalarType original = at::kFloat;
  bool compressed = false;
  double scale = 1;  // kInt8: original = stored * scale
};

bool compressible(const at::Tensor& tensor, const CompressOptions& options) {
  return tensor.defined() && tensor.is_floating_point() &&
         tensor.element_size() > 2 &&
         static_cast<int64_t>(tensor.nbytes()) >= options.min_bytes() &&
         !detail::is_parameter_like(tensor);
}

Packed pack(const at::Tensor& tensor, const CompressOptions& options) {
  Packed packed;
  if (!compressible(tensor, options)) {
    packed.stored = tensor;
    return packed;
  }
  packed.original = tensor.scalar_type();
  packed.compressed = true;
  switch (options.type()) {
    case CompressedType::kBFloat16:
      packed.stored = tensor.to(at::kBFloat16);
      break;
    case CompressedType::kFloat16:
      packed.stored = tensor.to(at::kHalf);
      break;
    case CompressedType::kInt8: {
      const double max_abs =
          tensor.numel() == 0 ? 0.0 : tensor.abs().max().item<double>();
      packed.scale = max_abs > 0 ? max_abs / 127.0 : 1.0;
      packed.stored =
          tensor.div(packed.scale).round_().clamp_(-127, 127).to(at::kChar);
      break;
    }
  }
  return packed;
}

at::Tensor unpack(const Packed& packed) {
  if (!packed.compressed) {
    return packed.stored;
  }
  at::Tensor restored = packed.stored.to(packed.original);
  if (packed.scale != 1.0) {
    restored.mul_(packed.scale);
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
          return std::make_shared<const Packed>(pack(t, options));
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
