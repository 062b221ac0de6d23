// policy.cpp: the ready-made per-op policies of remat::policies.
#include "remat/policy.h"

#include <algorithm>
#include <memory>
#include <unordered_set>

#include <c10/util/Exception.h>

namespace remat {

bool is_save(CheckpointPolicy policy) {
  return policy == CheckpointPolicy::kMustSave ||
         policy == CheckpointPolicy::kPreferSave;
}

namespace policies {
namespace {

bool is_must(CheckpointPolicy policy) {
  return policy == CheckpointPolicy::kMustSave ||
         policy == CheckpointPolicy::kMustRecompute;
}

using NameSet = std::unordered_set<std::string>;

std::shared_ptr<const NameSet> checked_names(
    const char* function, std::vector<std::string> names) {
  for (const std::string& name : names) {
    TORCH_CHECK(
        !name.empty() && name.find("::") != std::string::npos &&
            name.find("::") > 0 && name.find("::") + 2 < name.size(),
        "remat::policies::",
        function,
        ": expected operator names with a namespace such as \"aten::mm\", "
        "got '",
        name,
        "'");
    // OpContext::op_name carries no overload: "aten::mm.out" never matches.
    TORCH_CHECK(
        name.find('.') == std::string::npos,
        "remat::policies::",
        function,
        ": expected operator names without an overload (the policy sees "
        "\"aten::mm\" for every overload of mm), got '",
        name,
        "'");
  }
  return std::make_shared<const NameSet>(names.begin(), names.end());
}

/// `named` for the operators in `names`, `others` for the rest.
Policy by_name(
    std::shared_ptr<const NameSet> names,
    CheckpointPolicy named,
    CheckpointPolicy others) {
  return [names = std::move(names), named, others](const OpContext& context) {
    return names->count(context.op_name) != 0 ? named : others;
  };
}

}  // namespace

// aten::matmul is left out on purpose: the bmm/mm it calls are kept instead,
// so the copies matmul makes of its inputs are recomputed, not kept.
std::vector<std::string> compute_intensive_ops() {
  return {
      "aten::mm",
      "aten::addmm",
      "aten::bmm",
      "aten::baddbmm",
      "aten::linear",
      "aten::convolution",
      "aten::_convolution",
      "aten::cudnn_convolution",
      "aten::mkldnn_convolution",
      "aten::_scaled_dot_product_attention",
      "aten::_scaled_dot_product_flash_attention",
      "aten::_scaled_dot_product_efficient_attention",
      "aten::_scaled_dot_product_cudnn_attention",
      "aten::_flash_attention_forward",
      "aten::_efficient_attention_forward",
  };
}

Policy save_compute_intensive() {
  return by_name(
      checked_names("save_compute_intensive", compute_intensive_ops()),
      CheckpointPolicy::kPreferSave,
      CheckpointPolicy::kPreferRecompute);
}

Policy save_ops(std::vector<std::string> names) {
  return by_name(
      checked_names("save_ops", std::move(names)),
      CheckpointPolicy::kMustSave,
      CheckpointPolicy::kPreferRecompute);
}

Policy recompute_ops(std::vector<std::string> names) {
  return by_name(
      checked_names("recompute_ops", std::move(names)),
      CheckpointPolicy::kMustRecompute,
      CheckpointPolicy::kPreferSave);
}

Policy save_all() {
  return [](const OpContext&) { return CheckpointPolicy::kPreferSave; };
}

Policy recompute_all() {
  return [](const OpContext&) { return CheckpointPolicy::kPreferRecompute; };
}

Policy combine(std::vector<Policy> policies) {
  TORCH_CHECK(
      !policies.empty(),
      "remat::policies::combine: expected at least one policy, got none");
  for (size_t i = 0; i < policies.size(); ++i) {
    TORCH_CHECK(
        static_cast<bool>(policies[i]),
        "remat::policies::combine: expected policies, got an empty one at "
        "position ",
        i);
  }
  return [policies = std::move(policies)](const OpContext& context) {
    CheckpointPolicy answer = CheckpointPolicy::kPreferRecompute;
    for (const Policy& policy : policies) {
      answer = policy(context);
      if (is_must(answer)) {
        return answer;
      }
    }
    return answer;  // the last policy's
  };
}

}  // namespace policies
}  // namespace remat
