// pack_cache.h (private): one stored copy per saved tensor, for saved-tensor
// hooks that copy what they pack (compression, offload).
//
// NOTE: [One copy per saved tensor]
// Autograd often saves one tensor twice (tanh saves its output, the next
// linear saves it as its input). A hook that copied each save separately
// would keep two copies. So the hook remembers what it packed: a tensor packed
// again, unchanged (same TensorImpl, same version), shares the first copy
// while that copy is alive. The weak reference to the TensorImpl keeps its
// address from being reused while remembered.
#pragma once

#include <cstddef>
#include <memory>
#include <unordered_map>
#include <utility>

#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

namespace remat::detail {

// NOTE: [A saved tensor modified in place]
// Autograd refuses a backward that needs a tensor modified in place since it
// was saved (its version counter moved on). A hook that keeps a copy of the
// tensor instead of the tensor loses that check: its copy holds the value at
// the time of the copy, which for SaveToFile's background writer may be
// before or after the change, so the gradients would depend on timing. Such
// hooks keep the tensor's version counter (a small shared object, not the
// storage) and its value at save time, and refuse at unpack, as autograd
// does, if it moved on.

/// A saved tensor's version counter and its value when it was saved.
class SavedVersion {
 public:
  SavedVersion() = default;
  explicit SavedVersion(const at::Tensor& tensor)
      : counter_(tensor.unsafeGetTensorImpl()->version_counter()),
        saved_(counter_.enabled() ? counter_.current_version() : 0) {}

  /// Throws c10::Error, naming `who` and the versions, if the tensor was
  /// modified in place since it was saved.
  void check(const char* who) const {
    if (!counter_.enabled()) {
      return;  // an inference tensor: nothing can modify it under autograd
    }
    const auto now = counter_.current_version();
    TORCH_CHECK(
        now == saved_,
        who,
        ": one of the variables needed for gradient computation has been "
        "modified by an inplace operation since it was saved (version ",
        saved_,
        " when saved, ",
        now,
        " now); plain autograd refuses this backward too: make the operation "
        "that modified it out of place, or clone the tensor before it");
  }

 private:
  c10::VariableVersion counter_{c10::VariableVersion::DISABLED};
  decltype(counter_.current_version()) saved_ = 0;
};

/// Remembers the stored form of each tensor a guard packed. Used on the
/// packing thread only (guards are thread-local), so it has no lock.
template <typename Stored>
class PackCache {
 public:
  /// The stored form of `tensor`: the remembered one if this tensor was
  /// packed before, unchanged, and its stored form is still alive; otherwise
  /// `make(tensor)` (a std::shared_ptr<Stored>), remembered from now on.
  template <typename Make>
  std::shared_ptr<Stored> find_or_make(const at::Tensor& tensor, Make&& make) {
    const c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
    const int64_t version = tensor._version();
    auto found = entries_.find(impl);
    if (found != entries_.end()) {
      auto alive = found->second.stored.lock();
      if (alive && found->second.version == version &&
          found->second.original.lock().get() == impl) {
        return alive;
      }
    }
    std::shared_ptr<Stored> stored = std::forward<Make>(make)(tensor);
    entries_.insert_or_assign(
        impl,
        Entry{
            c10::weak_intrusive_ptr<c10::TensorImpl>(tensor.getIntrusivePtr()),
            version,
            stored});
    forget_dead();
    return stored;
  }

 private:
  struct Entry {
    c10::weak_intrusive_ptr<c10::TensorImpl> original;
    int64_t version;
    std::weak_ptr<Stored> stored;
  };

  /// Drops entries whose stored form has died, whenever the map has doubled
  /// since the last sweep, so a guard that lives for a whole training run
  /// does not grow without bound.
  void forget_dead() {
    if (entries_.size() < 2 * swept_size_ + 64) {
      return;
    }
    for (auto it = entries_.begin(); it != entries_.end();) {
      it = it->second.stored.expired() ? entries_.erase(it) : std::next(it);
    }
    swept_size_ = entries_.size();
  }

  std::unordered_map<const c10::TensorImpl*, Entry> entries_;
  std::size_t swept_size_ = 0;
};

/// A tensor that repeats elements of its storage (a dimension of stride 0
/// and size above 1: expand, broadcasting): moving or compressing it would
/// copy every repetition, more bytes than the storage it keeps alive.
inline bool repeats_elements(const at::Tensor& tensor) {
  return at::has_internal_overlap(tensor) == at::MemOverlap::Yes;
}

/// A parameter or a view of one: alive anyway, so copying it only adds.
/// Every leaf that requires grad counts as a parameter.
inline bool is_parameter_like(const at::Tensor& tensor) {
  if (tensor.is_leaf() && tensor.requires_grad()) {
    return true;
  }
  if (tensor.is_view()) {
    const at::TensorBase& base = tensor._base();
    return base.is_leaf() && base.requires_grad();
  }
  return false;
}

}  // namespace remat::detail
