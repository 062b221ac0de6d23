// precision.cpp: Precision parsing and AutocastGuard (see remat/precision.h).
//
// The guard does what torch.autocast's context manager does on entry and
// exit: it captures the thread's whole autocast state (compat::AutocastState,
// which absorbs the setters that differ between LibTorch versions), changes
// the device type's flag and dtype and the cache flag, and counts itself in
// autocast's nesting depth; on exit the depth reaching zero clears the cast
// cache, then the captured state is applied again. All validation happens
// before any state changes, so a throwing constructor leaves nothing behind.
#include "remat/precision.h"

#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>

#include "compat/compat.h"

namespace remat {

struct AutocastGuard::Previous {
  compat::AutocastState state;
};

Precision parse_precision(const std::string& text) {
  if (text == "fp32") {
    return Precision::kFloat32;
  }
  if (text == "bf16") {
    return Precision::kBFloat16;
  }
  if (text == "fp16") {
    return Precision::kFloat16;
  }
  TORCH_CHECK(
      false,
      "remat::parse_precision: expected fp32, bf16 or fp16, got '",
      text,
      "'");
}

std::string precision_name(Precision precision) {
  switch (precision) {
    case Precision::kFloat32:
      return "fp32";
    case Precision::kBFloat16:
      return "bf16";
    case Precision::kFloat16:
      return "fp16";
  }
  TORCH_INTERNAL_ASSERT(
      false, "unknown remat::Precision ", static_cast<int>(precision));
}

AutocastGuard::AutocastGuard(
    c10::DeviceType device_type, Precision precision, AutocastOptions options) {
  const bool cpu = device_type == c10::DeviceType::CPU;
  TORCH_CHECK(
      cpu || device_type == c10::DeviceType::CUDA,
      "remat::AutocastGuard: expected device type cpu or cuda, got ",
      device_type);
  TORCH_CHECK(
      !(cpu && precision == Precision::kFloat16),
      "remat::AutocastGuard: autocast on cpu supports fp32 and bf16, got ",
      precision_name(precision),
      " (fp16 autocast is CUDA only)");
  const bool enabled = precision != Precision::kFloat32;
  const c10::ScalarType dtype =
      precision == Precision::kFloat16 ? c10::kHalf : c10::kBFloat16;

  previous_ = std::make_unique<Previous>();
  previous_->state = compat::AutocastState::capture();
  compat::AutocastState state = previous_->state;
  if (cpu) {
    state.cpu_enabled = enabled;
    if (enabled) {
      state.cpu_dtype = dtype;
    }
  } else {
    state.cuda_enabled = enabled;
    if (enabled) {
      state.cuda_dtype = dtype;
    }
  }
  state.cache_enabled = options.cache_enabled();
  state.apply();
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (at::autocast::decrement_nesting() == 0) {
    at::autocast::clear_cache();
  }
  previous_->state.apply();
}

}  // namespace remat
