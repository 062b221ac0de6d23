// sharded_units.cpp: the units of a chain of stages for ShardedStages and
// sharded_chain(): which stage modules are units, how large each one's flat
// buffer is, and what a rank holds of them (NOTE: [Sharded units] in
// sharded_stages.cpp).
#include "sharded_units.h"

#include <algorithm>
#include <string>
#include <utility>

#include <c10/util/Exception.h>
#include <torch/torch.h>

namespace remat::distributed {
namespace detail {
namespace {

/// Checks the parameters of the module of stage `stage`, a new unit.
void check_unit_parameters(
    const std::vector<torch::Tensor>& parameters, size_t stage) {
  for (size_t k = 0; k < parameters.size(); ++k) {
    const torch::Tensor& p = parameters[k];
    TORCH_CHECK(
        p.device().is_cpu() && p.layout() == torch::kStrided &&
            p.is_floating_point() &&
            p.scalar_type() == parameters.front().scalar_type(),
        "remat::distributed::ShardedStages: expected the parameters of stage ",
        stage,
        "'s module that require grad to be dense CPU tensors of one "
        "floating-point dtype (",
        parameters.front().toString(),
        "), got ",
        p.toString(),
        " at index ",
        k);
  }
}

/// Adds the frozen parameters of the module of stage `stage` to `units`,
/// each once.
void add_frozen_parameters(
    const torch::nn::Module& module, size_t stage, Units& units) {
  for (const torch::Tensor& p : module.parameters()) {
    if (p.requires_grad()) {
      continue;
    }
    const bool known = std::any_of(
        units.frozen.begin(), units.frozen.end(), [&](const auto& frozen) {
          return frozen.first.is_same(p);
        });
    if (!known) {
      units.frozen.emplace_back(p, static_cast<int64_t>(stage));
      units.frozen_bytes += p.numel() * static_cast<int64_t>(p.element_size());
    }
  }
}

}  // namespace

std::vector<torch::Tensor> sharded_parameters(const torch::nn::Module& module) {
  std::vector<torch::Tensor> parameters;
  for (const torch::Tensor& p : module.parameters()) {
    if (p.requires_grad()) {
      parameters.push_back(p);
    }
  }
  return parameters;
}

Units find_units(const std::vector<Stage>& stages) {
  TORCH_CHECK(
      !stages.empty(),
      "remat::distributed::ShardedStages: expected at least one stage, got "
      "none");
  Units units;
  std::vector<std::vector<torch::Tensor>> parameters_of_unit;
  for (size_t i = 0; i < stages.size(); ++i) {
    TORCH_CHECK(
        static_cast<bool>(stages[i].forward),
        "remat::distributed::ShardedStages: expected every stage to have a "
        "forward, stage ",
        i,
        " has none");
    const auto& module = stages[i].module;
    if (module) {
      add_frozen_parameters(*module, i, units);
    }
    std::vector<torch::Tensor> parameters;
    if (module) {
      parameters = sharded_parameters(*module);
    }
    if (parameters.empty()) {
      units.unit_of_stage.push_back(-1);
      continue;
    }
    const auto known =
        std::find(units.modules.begin(), units.modules.end(), module);
    if (known != units.modules.end()) {
      units.unit_of_stage.push_back(known - units.modules.begin());
      continue;
    }
    check_unit_parameters(parameters, i);
    for (const auto& earlier : parameters_of_unit) {
      for (const torch::Tensor& p : parameters) {
        for (const torch::Tensor& q : earlier) {
          TORCH_CHECK(
              !p.is_same(q),
              "remat::distributed::ShardedStages: a parameter of shape ",
              p.sizes(),
              " belongs to the module of stage ",
              i,
              " and to an earlier stage's module; expected each parameter "
              "in one stage module (tied weights are not supported)");
        }
      }
    }
    units.unit_of_stage.push_back(static_cast<int64_t>(units.modules.size()));
    units.modules.push_back(module);
    parameters_of_unit.push_back(std::move(parameters));
  }
  return units;
}

int64_t padded_elements(
    const std::vector<torch::Tensor>& parameters, int64_t world_size) {
  int64_t total = 0;
  for (const torch::Tensor& p : parameters) {
    total += p.numel();
  }
  return (total + world_size - 1) / world_size * world_size;
}

int64_t resident_bytes_of_unit(int64_t unit_bytes, int64_t world_size) {
  return 2 * (unit_bytes / world_size);
}

planner::Chain with_unit_bytes(
    const planner::Chain& chain,
    const Units& units,
    int64_t world_size,
    const char* who) {
  TORCH_CHECK(
      chain.size() == static_cast<int64_t>(units.unit_of_stage.size()),
      who,
      ": expected a chain of ",
      units.unit_of_stage.size(),
      " stages (one per stage), got ",
      chain.size());
  std::vector<int64_t> unit_bytes;
  int64_t resident = units.frozen_bytes;
  for (const auto& module : units.modules) {
    const std::vector<torch::Tensor> parameters = sharded_parameters(*module);
    const int64_t bytes =
        padded_elements(parameters, world_size) *
        static_cast<int64_t>(parameters.front().element_size());
    unit_bytes.push_back(bytes);
    resident += resident_bytes_of_unit(bytes, world_size);
  }
  std::vector<planner::StageCost> stages = chain.stages();
  for (size_t i = 0; i < stages.size(); ++i) {
    const int64_t unit = units.unit_of_stage[i];
    stages[i].gathered_bytes = unit < 0 ? 0 : unit_bytes[unit];
  }
  return planner::Chain(std::move(stages), chain.input_bytes(), resident)
      .with_cold_write_ms_per_mib(chain.cold_write_ms_per_mib());
}

}  // namespace detail

planner::Chain sharded_chain(
    const planner::Chain& chain,
    const std::vector<Stage>& stages,
    int64_t world_size) {
  TORCH_CHECK(
      world_size >= 1,
      "remat::distributed::sharded_chain: expected a world size >= 1, got ",
      world_size);
  return detail::with_unit_bytes(
      chain,
      detail::find_units(stages),
      world_size,
      "remat::distributed::sharded_chain");
}

}  // namespace remat::distributed
