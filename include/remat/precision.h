// remat/precision.h: mixed precision, the precision a training step runs in
// and the guard that runs code under autocast in it.
//
// Under Precision::kBFloat16 (or kFloat16 on CUDA) the operators autocast
// lists (matrix products, convolutions, ...) run in the narrower type while
// parameters stay fp32; autocast casts them on use. Checkpointed regions
// replay the autocast state they ran under, so their recomputation is the
// same computation (docs/checkpoint.md, "Mixed precision"). The optimizer is
// unaffected: gradients of fp32 parameters are fp32.
#pragma once

#include <memory>
#include <string>

#include <c10/core/DeviceType.h>
#include <torch/arg.h>

namespace remat {

/// The precision of a training step.
enum class Precision {
  kFloat32,   ///< "fp32": no autocast; everything in the tensors' own types
  kBFloat16,  ///< "bf16": autocast to bfloat16 (CPU and CUDA)
  kFloat16,   ///< "fp16": autocast to IEEE half (CUDA only)
};

/// Parses "fp32", "bf16" or "fp16" (exactly these spellings).
///
/// Example:
///   remat::Precision precision = remat::parse_precision("bf16");
///
/// Throws c10::Error naming the text received and the accepted values.
Precision parse_precision(const std::string& text);

/// "fp32", "bf16" or "fp16": the text parse_precision() accepts.
std::string precision_name(Precision precision);

/// Options of AutocastGuard.
struct AutocastOptions {
  /// Whether autocast keeps the casts of leaf tensors that require grad
  /// (parameters) for reuse until the outermost guard ends. Off, every use
  /// casts again and a cast that autograd saves is freed with the other
  /// saved tensors, so checkpointing frees it and profile_chain() counts it
  /// in its stage. Turn it on only if no planned execution (PlannedSequential,
  /// PlannedChain) runs inside the guard: their forwards without grad would
  /// cache casts that the recomputation reuses without gradient history.
  /// Default: false (torch.autocast's default is true).
  TORCH_ARG(bool, cache_enabled) = false;
};

/// RAII guard: while it is alive, this thread runs operators on
/// `device_type` (c10::kCPU or c10::kCUDA) in `precision`: kBFloat16 or
/// kFloat16 enable autocast for that device type with that dtype; kFloat32
/// disables it. The autocast state of the other device type is left as it
/// is. When the guard ends, normally or by an exception, the autocast state
/// it found is restored, and the outermost of nested guards (or
/// torch.autocast regions) clears the autocast cache, so no cast outlives
/// the parameters' next update.
///
/// Example:
// clang-format off
///   {
///     remat::AutocastGuard bf16(c10::kCPU, remat::Precision::kBFloat16);
///     auto loss = model->forward(x).to(torch::kFloat).pow(2).mean();  // matmuls in bf16
///     loss.backward();                                // parameter gradients in fp32
///   }
///   optimizer.step();
// clang-format on
///
/// Throws c10::Error, naming the value received, if `device_type` is neither
/// CPU nor CUDA, or if `precision` is kFloat16 on CPU (use kBFloat16).
class AutocastGuard {
 public:
  AutocastGuard(
      c10::DeviceType device_type,
      Precision precision,
      AutocastOptions options = {});
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  struct Previous;  // the autocast state found at construction
  std::unique_ptr<Previous> previous_;
};

}  // namespace remat
