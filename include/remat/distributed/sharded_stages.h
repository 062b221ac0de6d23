// remat/distributed/sharded_stages.h: ShardedStages, sharded (FSDP / ZeRO-3
// style) training of a chain of stages, and sharded_chain() for planning one
// rank's share.
// Part of remat::distributed (remat/distributed.h; docs/distributed.md).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>

#include "remat/distributed/process_group.h"
#include "remat/planner/chain.h"
#include "remat/stage.h"

namespace remat::distributed {

/// Sharded training of a chain of stages over a group (FSDP / ZeRO-3 style).
///
/// The parameters that require grad of each distinct stage module (a "unit")
/// are flattened into
/// one buffer, padded to a multiple of the world size; rank r keeps the r-th
/// of world_size equal slices of it as a leaf tensor, its shard, which is
/// what the optimizer updates. The module's parameters stay the module's
/// tensors (same objects, shapes and names) but hold no memory between uses:
/// the stages() returned here gather a unit's parameters from all ranks
/// before each forward of its stage and free them after it (unless the
/// stage's backward is under way), gather them again when the stage's
/// backward starts, and when it ends reduce-scatter the parameters' full
/// gradients, adding this rank's slice of their average over the ranks to
/// the shard's gradient. So a rank holds, besides activations, its shards
/// and their gradients (resident_bytes()) and the full parameters of the
/// stage running (twice that, with their gradients, in its backward):
/// sharded_chain() gives the planner exactly that (docs/distributed.md).
///
/// Example:
// clang-format off
///   auto unsharded = remat::profile_chain(model, sample);  // before sharding
///   remat::distributed::ShardedStages sharded(remat::stages_of(model), group);
///   auto chain = sharded.sharded_chain(unsharded);
///   remat::PlannedChain net(sharded.stages(), remat::plan_within(chain, budget));
///   torch::optim::AdamW optimizer(sharded.shards());
///   for (...) {
///     optimizer.zero_grad();
///     loss_of(net->forward(local_inputs)).backward();
///     sharded.finish();     // shard.grad() now holds its part of the average
///     optimizer.step();
///   }
// clang-format on
///
/// Works with remat::checkpoint in both modes (over sequential()),
/// PlannedSequential (over sequential()) and PlannedChain (over stages()):
/// a recomputation gathers the parameters it needs like a first forward.
/// With one process (world size 1) it trains exactly as the unsharded model.
///
/// Contract: construct it on every rank, with the same stages (modules,
/// parameter shapes and dtypes, in the same order) and the same initial
/// values on every rank (broadcast_parameters first, if in doubt); from then
/// on read and write parameter values through shards() or
/// with_full_parameters(), not through the modules (whose parameters hold no
/// memory outside a stage's forward and backward; reading them is undefined
/// behaviour and may crash). The modules' parameters' .grad() are used
/// internally and undefined between steps. One step: one backward() through
/// the stages, then finish(), then the optimizer step on shards(). Module
/// buffers are not sharded (each rank keeps its own, as with GradientSync).
/// Stage inputs must not be modified in place by the stage.
///
/// Frozen parameters (those that do not require grad at construction, as in
/// fine-tuning) are not sharded: each rank keeps them whole in their modules
/// (counted in resident_bytes()), they get no gradient and are not in
/// shards(), so the optimizer never steps them, as with the unsharded model.
/// Which parameters are frozen is fixed at construction: finish() throws
/// c10::Error, naming the parameter's shape and stage, if a parameter was
/// frozen or unfrozen since (after the step's reductions, which every rank
/// takes part in, so the others finish; the shards' gradients then hold the
/// refused step's: clear them before the next).
class ShardedStages {
 public:
  /// Shards the parameters that require grad of the stages' modules (stages
  /// without a module or without such parameters are left as they are).
  /// Copies this rank's slice of each unit into its shard and frees the
  /// modules' memory of those parameters. Throws c10::Error (nothing
  /// changed) if `stages` is empty or a stage has no forward, a module's
  /// parameters that require grad are not all dense CPU tensors of one
  /// floating-point dtype, a parameter (to shard or frozen) holds no
  /// memory (its module is sharded already by another ShardedStages), a
  /// parameter belongs to the modules of two different units (naming the
  /// parameter), or, on every rank, if the ranks' stages differ in units,
  /// parameter shapes or dtypes, or in which parameters are frozen (a
  /// collective: every rank must construct it).
  ShardedStages(std::vector<Stage> stages, ProcessGroup group);
  /// Gathers the parameters back into the modules (a collective: every rank
  /// must destroy its ShardedStages at the same point; if the group has
  /// failed, the modules are left without parameter memory).
  ~ShardedStages();
  ShardedStages(const ShardedStages&) = delete;
  ShardedStages& operator=(const ShardedStages&) = delete;

  /// The stages to run: the given stages, each wrapped as described above.
  const std::vector<Stage>& stages() const;
  /// stages() as a Sequential of one module per stage (whose child is the
  /// stage's module), for PlannedSequential and checkpoint_sequential.
  torch::nn::Sequential sequential() const;
  /// This rank's shard of each unit (1-D leaves requiring grad), in stage
  /// order: what the optimizer updates.
  std::vector<torch::Tensor> shards() const;

  /// Bytes of stage i's parameters while gathered (its unit's padded flat
  /// buffer; 0 for a stage without parameters to shard), for every stage.
  std::vector<int64_t> gathered_bytes() const;
  /// Bytes this rank holds for the whole step: its shards and their
  /// gradients, and the frozen parameters.
  int64_t resident_bytes() const;
  /// `chain` (profiled on the unsharded stages, same count) with each
  /// stage's gathered_bytes and the chain's resident_bytes set, so that
  /// planner budgets cover parameters and activations together. Throws
  /// c10::Error if the stage counts differ.
  planner::Chain sharded_chain(const planner::Chain& chain) const;

  /// Completes the step: reduce-scatters the gradients of units whose
  /// backward had no end marker (a stage whose input is not floating point,
  /// such as token ids) and frees every gathered parameter. Then the shards'
  /// gradients hold this step's average (added to what they held before).
  /// Throws c10::Error as Work::wait if a collective fails.
  void finish();
  /// Gathers every unit's parameters into its module, runs `use` (reading or
  /// writing the modules' parameters, e.g. torch::save, or running the
  /// stages' forwards: they stay gathered until `use` returns), copies this
  /// rank's slice of what `use` left back into the shards, and frees them
  /// again. Calls nest (`use` may call it again): the parameters stay
  /// gathered until the outermost call returns. A collective: every rank
  /// must call it.
  void with_full_parameters(const std::function<void()>& use);

  /// Parameter gathers (one per unit and forward or backward) and gradient
  /// reductions (one per unit and backward) of the last finished step.
  struct Counts {
    int64_t gathers = 0;
    int64_t reductions = 0;
  };
  Counts last_step_counts() const;

  struct State;  // shared with the stage wrappers

 private:
  std::shared_ptr<State> state_;
};

/// The chain a ShardedStages over `stages` on `world_size` ranks would give
/// (ShardedStages::sharded_chain), without a group: for planning and
/// explaining a sharded run from one process. Throws c10::Error as the
/// ShardedStages constructor does, if world_size < 1, or if the chain's
/// stage count differs from stages.size().
planner::Chain sharded_chain(
    const planner::Chain& chain,
    const std::vector<Stage>& stages,
    int64_t world_size);

}  // namespace remat::distributed
