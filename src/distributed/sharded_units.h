// sharded_units.h (private): the units of a chain of stages (NOTE: [Sharded
// units] in sharded_stages.cpp), shared by ShardedStages and sharded_chain().
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

#include "remat/distributed/sharded_stages.h"
#include "remat/planner/chain.h"
#include "remat/stage.h"

namespace remat::distributed::detail {

/// The units of a chain of stages (NOTE: [Sharded units]).
struct Units {
  std::vector<std::shared_ptr<torch::nn::Module>> modules;  // one per unit
  std::vector<int64_t> unit_of_stage;  // -1: a stage without a unit
  /// The frozen parameters of the stage modules (NOTE: [Frozen
  /// parameters]), each once, with the first stage whose module has it.
  std::vector<std::pair<torch::Tensor, int64_t>> frozen;
  int64_t frozen_bytes = 0;  ///< their total: each rank holds them whole
};

/// The parameters of `module` a unit shards: those that require grad, in
/// parameters() order.
std::vector<torch::Tensor> sharded_parameters(const torch::nn::Module& module);

/// Finds the units of `stages`, checking them (see ShardedStages'
/// constructor). Throws c10::Error if there are no stages, a stage has no
/// forward, a unit's parameters are not dense CPU tensors of one
/// floating-point dtype, or two units share a parameter.
Units find_units(const std::vector<Stage>& stages);

/// Elements of a unit's flat buffer: its parameters' total, rounded up to a
/// multiple of the world size.
int64_t padded_elements(
    const std::vector<torch::Tensor>& parameters, int64_t world_size);

/// What one rank holds through the step of a unit of `unit_bytes` (its
/// gathered size): its shard and the shard's gradient.
int64_t resident_bytes_of_unit(int64_t unit_bytes, int64_t world_size);

/// The chain of `chain` with gathered and resident bytes for `units`.
/// Throws c10::Error, naming `who`, unless the chain has one stage per
/// stage of the units.
planner::Chain with_unit_bytes(
    const planner::Chain& chain,
    const Units& units,
    int64_t world_size,
    const char* who);

}  // namespace remat::distributed::detail
