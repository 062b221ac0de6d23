// remat/policy.h: selective checkpointing, the per-op policy of a region.
//
// A checkpointed region normally recomputes everything in backward. With a
// policy (CheckpointOptions::policy) remat asks, for every operator the
// region runs, whether to keep its outputs from the forward or recompute
// them. Kept operators are not executed again during recomputation: their
// forward outputs are used in their place, so an expensive matmul is paid
// once while the cheap elementwise work around it is recomputed. Gradients
// are those of the plain run (bitwise on CPU) under every policy.
//
// Operators are seen as autograd sees them: the aten operators a region's
// LibTorch calls dispatch to ("aten::mm", "aten::addmm", "aten::_softmax"),
// composite operators ("aten::matmul", "aten::linear") together with the
// operators they decompose into, and operators users register with
// TORCH_LIBRARY. See docs/checkpoint.md, "Selective checkpointing".
//
// Always recomputed, whatever the policy answers (the policy is not asked):
// operators that draw random numbers (dropout; RNG replay makes their
// recomputation identical), operators that modify an input in place or
// return a view of one, and operators that return anything but tensors.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace remat {

/// What a policy decides for one operator call. The Must/Prefer pairs have
/// the same effect when executed; they differ in how policies::combine
/// resolves disagreements.
enum class CheckpointPolicy {
  kMustSave,         ///< keep the outputs; never recompute this call
  kPreferSave,       ///< keep the outputs unless a Must answer says otherwise
  kMustRecompute,    ///< recompute; never keep
  kPreferRecompute,  ///< recompute unless a Must answer says otherwise
};

/// True for kMustSave and kPreferSave.
bool is_save(CheckpointPolicy policy);

/// What a policy is told about one operator call.
struct OpContext {
  /// Schema name without overload: "aten::mm", "aten::_softmax", "myns::op".
  std::string op_name;
  /// False in the forward pass; true when the region is recomputed in
  /// backward. A policy must answer the same save/recompute for the same
  /// call in both (remat checks it).
  bool is_recompute = false;
  /// Bytes of the call's tensor outputs (as measured in the forward).
  int64_t output_bytes = 0;
};

/// A per-op policy. Called on the thread that runs the region.
using Policy = std::function<CheckpointPolicy(const OpContext&)>;

/// Ready-made policies.
///
/// Example:
// clang-format off
///   auto opts = remat::CheckpointOptions().policy(
///       remat::policies::save_compute_intensive());
///   auto y = remat::checkpoint([&](const torch::Tensor& x) { return block->forward(x); }, x, opts);
// clang-format on
namespace policies {

/// Keeps the outputs of matrix products, convolutions and attention kernels
/// (aten::mm, addmm, bmm, baddbmm, linear, convolution and their cuDNN /
/// MKL-DNN forms, the scaled-dot-product attention kernels; the full list is
/// compute_intensive_ops()); recomputes everything else (kPreferSave /
/// kPreferRecompute). aten::matmul itself is not listed: the mm/bmm it runs
/// are.
Policy save_compute_intensive();

/// The operator names save_compute_intensive() keeps.
std::vector<std::string> compute_intensive_ops();

/// kMustSave for the named operators ("aten::mm", ...), kPreferRecompute for
/// all others. Names are of operators, every overload included. Throws
/// c10::Error if a name is empty, lacks a namespace ("mm" instead of
/// "aten::mm") or names an overload ("aten::mm.out").
Policy save_ops(std::vector<std::string> names);

/// kMustRecompute for the named operators, kPreferSave for all others.
/// Throws as save_ops does.
Policy recompute_ops(std::vector<std::string> names);

/// Keeps every operator it may (kPreferSave).
Policy save_all();

/// Recomputes everything (kPreferRecompute): the same as no policy.
Policy recompute_all();

/// Overrides first, a base policy last: asks the policies in order and
/// returns the first Must answer; without one, the last policy's answer.
/// Throws c10::Error if the list is empty or holds an empty policy.
///
/// Example (keep matmul outputs and the softmax, but recompute aten::bmm):
// clang-format off
///   auto p = combine({save_ops({"aten::_softmax"}), recompute_ops({"aten::bmm"}),
///                     save_compute_intensive()});
// clang-format on
Policy combine(std::vector<Policy> policies);

}  // namespace policies
}  // namespace remat
