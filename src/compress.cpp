// compress.cpp: CompressActivations, saved-tensor hooks that store activations
// in a narrower type (see remat/compress.h).
#include "remat/compress.h"

#include <any>
#include <memory>
#include <unordered_map>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace remat {
namespace {

/// A saved tensor as stored: compressed (with what restores it) or as is.
struct Packed {
  at::Tensor stored;
  c10::ScalarType original = at::kFloat;
  bool compressed = false;
  double scale = 1;  // kInt8: original = stored * scale
};

/// A parameter or a view of one: alive anyway, compressing it only adds.
bool is_parameter_like(const at::Tensor& tensor) {
  if (tensor.is_leaf() && tensor.requires_grad()) {
    return true;
  }
  if (tensor.is_view()) {
    const at::TensorBase& base = tensor._base();
    return base.is_leaf() && base.requires_grad();
  }
  return false;
}

bool compressible(const at::Tensor& tensor, const CompressOptions& options) {
  return tensor.defined() && tensor.is_floating_point() &&
         tensor.element_size() > 2 &&
         static_cast<int64_t>(tensor.nbytes()) >= options.min_bytes() &&
         !is_parameter_like(tensor);
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

/// NOTE: [One copy per saved tensor]
/// Autograd often saves one tensor twice (tanh saves its output, the next
/// linear saves it as its input). Compressing each save separately would
/// keep two copies, together as large as the original. So the guard
/// remembers what it packed: a tensor packed again, unchanged (same
/// TensorImpl, same version), shares the first copy. The weak reference to
/// the TensorImpl keeps its address from being reused while remembered.
class PackCache {
 public:
  explicit PackCache(CompressOptions options) : options_(options) {}

  std::shared_ptr<const Packed> pack(const at::Tensor& tensor) {
    if (!compressible(tensor, options_)) {
      return std::make_shared<const Packed>(remat::pack(tensor, options_));
    }
    const c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
    const int64_t version = tensor._version();
    auto found = entries_.find(impl);
    if (found != entries_.end()) {
      auto alive = found->second.packed.lock();
      if (alive && found->second.version == version &&
          found->second.original.lock().get() == impl) {
        return alive;
      }
    }
    auto packed = std::make_shared<const Packed>(remat::pack(tensor, options_));
    entries_.insert_or_assign(
        impl,
        Entry{
            c10::weak_intrusive_ptr<c10::TensorImpl>(tensor.getIntrusivePtr()),
            version,
            packed});
    return packed;
  }

 private:
  struct Entry {
    c10::weak_intrusive_ptr<c10::TensorImpl> original;
    int64_t version;
    std::weak_ptr<const Packed> packed;
  };
  CompressOptions options_;
  std::unordered_map<const c10::TensorImpl*, Entry> entries_;
};

}  // namespace

CompressActivations::CompressActivations(CompressOptions options) {
  TORCH_CHECK(
      options.min_bytes() >= 0,
      "remat::CompressActivations: expected min_bytes >= 0, got ",
      options.min_bytes());
  auto cache = std::make_shared<PackCache>(options);
  hooks_ = std::make_unique<SavedTensorHooks>(
      [cache](const at::Tensor& tensor) -> std::any {
        return cache->pack(tensor);
      },
      [](const std::any& stored) {
        return unpack(
            *std::any_cast<const std::shared_ptr<const Packed>&>(stored));
      });
}

}  // namespace remat
