// compat.h — the one place where remat absorbs differences between LibTorch
// versions (private header; never included from include/remat/).
//
// Supported: LibTorch 1.13.1 (Debian 12), 2.6.0 (Debian 13, CPU and CUDA
// 12.4), 2.14.1 (Debian unstable; C++20) and PyTorch 2.x LibTorch (CPU or
// CUDA). Every other source file uses only what this header exposes, so a
// new LibTorch version means editing one section here and nothing else.
//
// Sections (keep each small; add new ones at the end with the same banner):
//   1. Version test
//   2. CPU allocator interface  (allocate() constness, copy_data())
//   3. CUDA caching-allocator statistics (compiled only with CUDA LibTorch)
//   4. Autocast state
//   5. Autograd node ownership  (std::shared_ptr or c10::intrusive_ptr)
//   6. The dispatch key of selective checkpointing
//   7. c10d: the rendezvous store and the Gloo process group
//   8. The dispatch key of dynamic rematerialization
#pragma once

#include <c10/core/Allocator.h>
#include <torch/version.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

// ===== 1. Version test
// ========================================================

/// True when the LibTorch being compiled against is at least major.minor.
#define REMAT_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||        \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// ===== 2. CPU allocator interface ============================================
//
// 1.13 - 2.2: `DataPtr allocate(size_t) const` is the only pure virtual.
// 2.3+:       `DataPtr allocate(size_t)` (not const) and a pure virtual
//             `copy_data(dest, src, count) const`.
// Wrapping allocators derive from compat::WrappingAllocator and implement
// allocate_bytes(); copy_data is forwarded to the wrapped allocator.

namespace remat::compat {

/// Base of an allocator that forwards to another allocator.
class WrappingAllocator : public c10::Allocator {
 public:
  explicit WrappingAllocator(c10::Allocator* wrapped) : wrapped_(wrapped) {}

#if REMAT_TORCH_AT_LEAST(2, 3)
  c10::DataPtr allocate(size_t nbytes) override {
    return allocate_bytes(nbytes);
  }
  void copy_data(
      void* dest, const void* src, std::size_t count) const override {
    wrapped_->copy_data(dest, src, count);
  }
#else
  c10::DataPtr allocate(size_t nbytes) const override {
    return allocate_bytes(nbytes);
  }
#endif

  /// The allocator this one forwards to.
  c10::Allocator* wrapped() const {
    return wrapped_;
  }

 protected:
  /// Allocates nbytes; what allocate() does in every LibTorch version.
  virtual c10::DataPtr allocate_bytes(size_t nbytes) const = 0;

 private:
  c10::Allocator* wrapped_;
};

}  // namespace remat::compat

// ===== 3. CUDA caching-allocator statistics
// ===================================
//
// Compiled only when the build defines REMAT_WITH_CUDA (the CMake sets it when
// the Torch package was built with CUDA) and the header exists; chosen at run
// time by the caller. DeviceStats moved between namespaces over 2.x, so only
// `auto` and the aggregate index (StatType::AGGREGATE == 0 in every version)
// are relied upon.

#if defined(REMAT_WITH_CUDA) && __has_include(<c10/cuda/CUDACachingAllocator.h>)
#define REMAT_HAS_CUDA 1
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

namespace remat::compat {

/// Allocated bytes of the CUDA caching allocator on one device.
struct CudaAllocatedBytes {
  int64_t current_bytes = 0;
  int64_t peak_bytes = 0;  // since process start or the last peak reset
};

inline CudaAllocatedBytes cuda_allocated_bytes(c10::DeviceIndex device) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
  const auto& aggregate = stats.allocated_bytes[0];  // StatType::AGGREGATE
  return {aggregate.current, aggregate.peak};
}

inline void cuda_reset_peak(c10::DeviceIndex device) {
  c10::cuda::CUDACachingAllocator::resetPeakStats(device);
}

inline int64_t cuda_device_count() {
  return static_cast<int64_t>(c10::cuda::device_count());
}

inline c10::DeviceIndex cuda_current_device() {
  return c10::cuda::current_device();
}

}  // namespace remat::compat
#else
#define REMAT_HAS_CUDA 0
#endif

// ===== 4. Autocast state
// ======================================================
//
// 1.13 - 2.3: per-backend functions (is_enabled / is_cpu_enabled,
//             get_autocast_gpu_dtype / get_autocast_cpu_dtype, ...).
// 2.4+:       device-type-indexed functions (is_autocast_enabled(DeviceType),
//             get_autocast_dtype(DeviceType), ...); the old ones are
//             deprecated.
// 1.13 - 2.14 (checked): clear_cache(), increment_nesting() and
//             decrement_nesting() are the same; they are used directly.
// Checkpoint recomputation captures and re-applies the whole state
// (NOTE: [Recompute and RNG] in recompute_context.h); AutocastGuard
// (precision.cpp) changes it through the same two calls.

#include <ATen/autocast_mode.h>

namespace remat::compat {

/// The thread's autocast state for CPU and CUDA.
struct AutocastState {
  bool cpu_enabled = false;
  bool cuda_enabled = false;
  c10::ScalarType cpu_dtype = c10::kBFloat16;
  c10::ScalarType cuda_dtype = c10::kHalf;
  bool cache_enabled = true;

  static AutocastState capture() {
    AutocastState state;
#if REMAT_TORCH_AT_LEAST(2, 4)
    state.cpu_enabled = at::autocast::is_autocast_enabled(c10::DeviceType::CPU);
    state.cuda_enabled =
        at::autocast::is_autocast_enabled(c10::DeviceType::CUDA);
    state.cpu_dtype = at::autocast::get_autocast_dtype(c10::DeviceType::CPU);
    state.cuda_dtype = at::autocast::get_autocast_dtype(c10::DeviceType::CUDA);
#else
    state.cpu_enabled = at::autocast::is_cpu_enabled();
    state.cuda_enabled = at::autocast::is_enabled();
    state.cpu_dtype = at::autocast::get_autocast_cpu_dtype();
    state.cuda_dtype = at::autocast::get_autocast_gpu_dtype();
#endif
    state.cache_enabled = at::autocast::is_autocast_cache_enabled();
    return state;
  }

  void apply() const {
#if REMAT_TORCH_AT_LEAST(2, 4)
    at::autocast::set_autocast_enabled(c10::DeviceType::CPU, cpu_enabled);
    at::autocast::set_autocast_enabled(c10::DeviceType::CUDA, cuda_enabled);
    at::autocast::set_autocast_dtype(c10::DeviceType::CPU, cpu_dtype);
    at::autocast::set_autocast_dtype(c10::DeviceType::CUDA, cuda_dtype);
#else
    at::autocast::set_cpu_enabled(cpu_enabled);
    at::autocast::set_enabled(cuda_enabled);
    at::autocast::set_autocast_cpu_dtype(cpu_dtype);
    at::autocast::set_autocast_gpu_dtype(cuda_dtype);
#endif
    at::autocast::set_autocast_cache_enabled(cache_enabled);
  }
};

}  // namespace remat::compat

// ===== 5. Autograd node ownership
// =============================================
//
// 1.13 - 2.6 (checked): nodes are held by std::shared_ptr<Node>; a custom node
//                       is created with torch::autograd::deleteNode as its
//                       deleter (it frees a long graph without deep recursion).
// 2.14 (checked):       Node derives from c10::intrusive_ptr_target; nodes are
//                       held by c10::intrusive_ptr<Node> and deleteNode is
//                       gone.
// Decided from the types themselves, not from a version number, so the
// release in between that made the change is handled too.

#include <memory>
#include <type_traits>
#include <utility>

#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/function.h>

namespace remat::compat {

/// The pointer that owns an autograd node in this LibTorch (what Edge holds).
using NodePtr = decltype(torch::autograd::Edge::function);

/// True where nodes are intrusively reference-counted.
inline constexpr bool kNodesAreIntrusive =
    std::is_base_of_v<c10::intrusive_ptr_target, torch::autograd::Node>;

static_assert(
    kNodesAreIntrusive ||
        std::is_same_v<NodePtr, std::shared_ptr<torch::autograd::Node>>,
    "remat: unknown ownership of torch::autograd::Node");

/// Creates a custom autograd node of type T (derived from Node).
template <class T, class... Args>
NodePtr make_node(Args&&... args) {
  static_assert(std::is_base_of_v<torch::autograd::Node, T>);
  if constexpr (kNodesAreIntrusive) {
    return c10::make_intrusive<T>(std::forward<Args>(args)...);
  } else {
    // deleteNode is found by argument-dependent lookup (Node's namespace), so
    // the name is looked up only where this branch is compiled.
    return NodePtr(
        new T(std::forward<Args>(args)...), [](T* node) { deleteNode(node); });
  }
}

}  // namespace remat::compat

// ===== 6. The dispatch key of selective checkpointing
// =========================
//
// Selective checkpointing (NOTE: [Selective checkpointing] in selective.h)
// needs a dispatch key above autograd that LibTorch itself registers no
// fallback for, enabled per thread with an include guard. Every dispatch key
// below autograd has a fallback of LibTorch's own (Python, functorch,
// functionalization, named tensors, conjugation, ADInplaceOrView, ...), and
// a backend key (PrivateUse1-3) changes which kernels run (composite kernels
// replace backend ones), so the key is TESTING_ONLY_GenericMode:
// 1.13, 2.14 (checked): present, above autograd and autocast, no fallback
//                       registered by LibTorch; the selective tests pass.
// 2.6 (headers only):   present in the same place; not run here (the CUDA
//                       build links but cannot run without a GPU).
// A second registration for it (another library using the key) makes
// registration fail at load time with the dispatcher's own error.

#include <c10/core/DispatchKey.h>

/// The key's name as a token, for TORCH_LIBRARY_IMPL.
#define REMAT_SELECTIVE_DISPATCH_KEY TESTING_ONLY_GenericMode

namespace remat::compat {

inline constexpr c10::DispatchKey kSelectiveKey =
    c10::DispatchKey::REMAT_SELECTIVE_DISPATCH_KEY;

}  // namespace remat::compat

// ===== 7. c10d: the rendezvous store and the Gloo process group
// ===============
//
// What src/distributed/process_group.cpp uses, and how it differs:
// 1.13, 2.6 (headers), 2.14 (checked): TCPStore(host, TCPStoreOptions) with
//       the fields port, isServer, numWorkers, waitWorkers and timeout;
//       ProcessGroupGloo(store, rank, size, Options) with Options::create(
//       timeout) and ::devices; createDeviceForHostname(host) and
//       createDefaultDevice() (2.14 adds a defaulted lazyInit argument);
//       allreduce/broadcast/barrier returning c10::intrusive_ptr<c10d::Work>
//       and Work::wait(timeout); ReduceOp::SUM (Gloo has no AVG in any of
//       them). ProcessGroupGloo derives from ProcessGroup in 1.13 and from
//       Backend in 2.x; remat only names ProcessGroupGloo, so that is moot.
// 2.x:  TCPStoreOptions::useLibUV, true by default, selects a libuv server
//       that Debian's LibTorch is built without; remat asks for the classic
//       socket server where the field exists (decided from the type).
// The headers need USE_C10D_GLOO, which the Torch package's targets define
// for their users (1.13 and 2.14 checked), and Gloo's own headers
// (Debian: libgloo-dev). Hooks on parameters use Tensor::register_hook on a
// leaf (called before accumulation, its result replacing the gradient) and
// remove_hook, the same in every version.

namespace remat::compat {

template <class StoreOptions, class = void>
struct HasUseLibUV : std::false_type {};
template <class StoreOptions>
struct HasUseLibUV<
    StoreOptions,
    std::void_t<decltype(std::declval<StoreOptions&>().useLibUV)>>
    : std::true_type {};

/// Asks TCPStore for its classic socket server, in every version.
template <class StoreOptions>
void use_socket_store(StoreOptions& options) {
  if constexpr (HasUseLibUV<StoreOptions>::value) {
    options.useLibUV = false;
  }
}

}  // namespace remat::compat

// ===== 8. The dispatch key of dynamic rematerialization
// =======================
//
// Dynamic rematerialization (NOTE: [Dynamic rematerialization] in
// dynamic/runtime.h) records every operator call of its scope through a boxed
// fallback of its own, for the reasons given in section 6, on the one other
// key with the same properties: TESTING_ONLY_GenericWrapper.
// 1.13, 2.6, 2.14 (headers checked): present, just below
//       TESTING_ONLY_GenericMode, above autograd and autocast; LibTorch's
//       library registers nothing for it (only ATen's own tests use it, with
//       wrapper tensors). Tensors never carry it, so it is reached only while
//       a thread-local include guard enables it.

/// The key's name as a token, for TORCH_LIBRARY_IMPL.
#define REMAT_DYNAMIC_DISPATCH_KEY TESTING_ONLY_GenericWrapper

namespace remat::compat {

inline constexpr c10::DispatchKey kDynamicKey =
    c10::DispatchKey::REMAT_DYNAMIC_DISPATCH_KEY;

}  // namespace remat::compat
