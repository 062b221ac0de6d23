// recompute_check.cpp: see NOTE: [Recompute checks] in recompute_check.h.
#include "recompute_check.h"

#include <cstring>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

namespace remat::detail {

TensorRecord::TensorRecord(const at::Tensor& tensor, DeterminismCheck check)
    : sizes_(tensor.sizes().vec()),
      dtype_(tensor.scalar_type()),
      device_(tensor.device()) {
  if (check == DeterminismCheck::kValues) {
    c10::NoGradGuard no_grad;
    values_ = tensor.detach().clone();
  }
}

void TensorRecord::check(
    const at::Tensor& recomputed,
    DeterminismCheck check,
    const char* what,
    int64_t index) const {
  if (check == DeterminismCheck::kNone) {
    return;
  }
  TORCH_CHECK(
      recomputed.sizes().vec() == sizes_ &&
          recomputed.scalar_type() == dtype_ && recomputed.device() == device_,
      "remat::checkpoint: recomputation differs from the forward pass at ",
      what,
      " #",
      index,
      ": forward had shape ",
      c10::IntArrayRef(sizes_),
      ", dtype ",
      dtype_,
      ", device ",
      device_,
      "; recomputation got shape ",
      recomputed.sizes(),
      ", dtype ",
      recomputed.scalar_type(),
      ", device ",
      recomputed.device(),
      ". The checkpointed function must do the same work on both runs");
  if (check == DeterminismCheck::kValues) {
    TORCH_CHECK(
        bitwise_equal(values_, recomputed),
        "remat::checkpoint: recomputation differs from the forward pass at ",
        what,
        " #",
        index,
        " (shape ",
        recomputed.sizes(),
        "): the values are not bitwise equal. The checkpointed function is "
        "not deterministic (an RNG it uses is not replayed, or a "
        "nondeterministic kernel)");
  }
}

bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) {
    return false;
  }
  c10::NoGradGuard no_grad;
  // Resolved: the bytes of a conjugate or negative view are not its values.
  auto a_cpu =
      a.detach().to(at::kCPU).resolve_conj().resolve_neg().contiguous();
  auto b_cpu =
      b.detach().to(at::kCPU).resolve_conj().resolve_neg().contiguous();
  // An empty tensor may have no storage: memcmp must not see its null pointer.
  return a_cpu.nbytes() == 0 ||
         std::memcmp(a_cpu.data_ptr(), b_cpu.data_ptr(), a_cpu.nbytes()) == 0;
}

void check_outputs(const torch::autograd::variable_list& outputs) {
  TORCH_CHECK(
      !outputs.empty(),
      "remat::checkpoint: expected the function to return at least one "
      "tensor, got none");
  for (size_t i = 0; i < outputs.size(); ++i) {
    TORCH_CHECK(
        outputs[i].defined(),
        "remat::checkpoint: expected the function to return defined tensors, "
        "got an undefined tensor at output #",
        i);
  }
}

void check_recomputed_outputs(
    const torch::autograd::variable_list& outputs,
    const std::vector<TensorRecord>& forward_outputs,
    DeterminismCheck check) {
  TORCH_CHECK(
      outputs.size() == forward_outputs.size(),
      "remat::checkpoint: the function returned ",
      forward_outputs.size(),
      " outputs in forward but ",
      outputs.size(),
      " when recomputed");
  check_outputs(outputs);
  for (size_t i = 0; i < outputs.size(); ++i) {
    forward_outputs[i].check(
        outputs[i], check, "output", static_cast<int64_t>(i));
  }
}

}  // namespace remat::detail
