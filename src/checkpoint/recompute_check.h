// recompute_check.h (private): what a checkpoint remembers of each tensor of
// the forward pass in order to check its recomputation.
//
// NOTE: [Recompute checks]
// A recomputation must produce the same tensors as the forward it replaces,
// or gradients are silently wrong. Under DeterminismCheck::kMetadata remat
// compares the count, shape, dtype and device of every tensor (non-reentrant:
// every saved tensor, in save order; reentrant: every output); under kValues it
// also compares the bytes, which requires keeping a copy of each tensor until
// backward. The first mismatch raises an error naming the tensor's position.
#pragma once

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

#include "remat/checkpoint.h"

namespace remat::detail {

/// What the forward pass produced at one position.
class TensorRecord {
 public:
  /// Records `tensor` as `check` requires (metadata, and a copy for kValues).
  TensorRecord(const at::Tensor& tensor, DeterminismCheck check);

  /// Throws c10::Error naming `what` and `index` if `recomputed` differs.
  void check(
      const at::Tensor& recomputed,
      DeterminismCheck check,
      const char* what,
      int64_t index) const;

 private:
  std::vector<int64_t> sizes_;
  c10::ScalarType dtype_;
  c10::Device device_;
  at::Tensor values_;  // defined only under kValues
};

/// True if `a` and `b` hold the same bytes (same shape and dtype required).
bool bitwise_equal(const at::Tensor& a, const at::Tensor& b);

/// Checks the outputs of a checkpointed function: at least one, all defined.
void check_outputs(const torch::autograd::variable_list& outputs);

/// Checks a recomputation's outputs against the forward's: same count (always),
/// all defined, and each as `check` requires.
void check_recomputed_outputs(
    const torch::autograd::variable_list& outputs,
    const std::vector<TensorRecord>& forward_outputs,
    DeterminismCheck check);

}  // namespace remat::detail
