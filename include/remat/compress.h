// remat/compress.h: compressed activations, saved tensors stored in a
// narrower type until backward needs them.
//
// While a CompressActivations guard is alive on a thread, every
// floating-point tensor autograd saves there (outside checkpointed regions,
// whose own hooks take precedence) is stored in bf16, fp16 or int8 with a
// per-tensor scale, and restored to its original dtype when backward unpacks
// it. This is LOSSY: backward sees the rounded values, so gradients differ
// from the plain run's (docs/checkpoint.md shows the measured effect on a
// training loss). Parameters and views of parameters are never compressed
// (they are alive anyway), nor are tensors that repeat elements of their
// storage (a stride-0 dimension: expand; a copy would hold every
// repetition), nor tensors already 16 bits wide or less, nor
// non-floating-point ones. Rounding never makes a finite value infinite nor
// loses an inf or a NaN: those are restored exactly, and a tensor the type
// cannot hold that way (fp16 beyond +-65504; int8 with more than 1 element
// in 64 non-finite, or with a largest magnitude near the smallest normal
// value) is stored as it is (docs/checkpoint.md, "Compressed activations").
#pragma once

#include <cstdint>
#include <memory>

#include <torch/arg.h>

#include "remat/saved_tensor_hooks.h"

namespace remat {

/// The stored form of a compressed saved tensor.
enum class CompressedType {
  kBFloat16,  ///< bfloat16: fp32's range, 8 bits of mantissa (half the bytes)
  kFloat16,   ///< IEEE half: 11 bits of mantissa, range +-65504 (half)
  kInt8,      ///< int8 times one fp32 scale per tensor: max|x| / 127 (a
              ///< quarter of fp32's bytes)
};

/// Options of CompressActivations.
struct CompressOptions {
  /// The stored type. Default: kBFloat16.
  TORCH_ARG(CompressedType, type) = CompressedType::kBFloat16;
  /// Tensors with fewer bytes are stored as they are. Default: 0 (all).
  TORCH_ARG(int64_t, min_bytes) = 0;
};

/// RAII guard: saved floating-point activations on this thread are stored
/// compressed until backward (see the top of this header).
///
/// Example:
// clang-format off
///   {
///     remat::CompressActivations bf16;                 // kBFloat16
///     loss = model->forward(x).pow(2).mean();          // activations saved in bf16
///   }
///   loss.backward();                                   // restored to fp32 on unpack
// clang-format on
///
/// Throws c10::Error if min_bytes < 0, or (from install_engine) if another
/// autograd engine is installed; from backward, as plain autograd, if a saved
/// tensor was modified in place since it was saved.
class CompressActivations {
 public:
  explicit CompressActivations(CompressOptions options = {});

 private:
  std::unique_ptr<SavedTensorHooks> hooks_;
};

}  // namespace remat
