// remat/distributed.h: data-parallel training over c10d (Gloo, CPU).
//
// Every process (a "rank") holds a full copy of the model, runs forward and
// backward on its own slice of the global batch, and averages the parameter
// gradients with the other ranks before the optimizer step, so that every
// rank takes the same step as one process on the whole batch would (when the
// loss is a mean over the batch and the slices are equal).
//
//  - ProcessGroup: joins a group of `world_size` ranks. Rank 0 hosts a
//    c10d::TCPStore at master_addr:master_port for the rendezvous; the
//    collectives run on c10d's Gloo backend over TCP. Options come from the
//    environment torchrun sets (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
//    or are given explicitly.
//  - GradientSync: hooks on the parameters copy each gradient into a flat
//    bucket buffer as backward produces it and start the bucket's allreduce
//    as soon as the bucket is complete, overlapping communication with the
//    rest of backward; finish() completes the step.
//  - ShardedStages: sharded (FSDP / ZeRO-3 style) training of a chain of
//    stages: each rank keeps a shard of every stage's parameters, of their
//    gradients and (through its optimizer) of the optimizer state; a stage's
//    parameters are all-gathered for each of its forwards and for its
//    backward only, and its gradients are reduce-scattered into the shards.
//  - launch_local: runs N workers of one program on this machine (what
//    `remat train --nproc N` does).
//
// Every rank must make the same calls in the same order (one group, one
// GradientSync or ShardedStages per model, the same model and the same
// checkpointing). Not supported yet: CUDA tensors and NCCL, sparse gradients,
// several groups sharing a port. See docs/distributed.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/arg.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>

#include "remat/planner/chain.h"
#include "remat/stage.h"

namespace remat::distributed {

/// How a process joins a group.
struct GroupOptions {
  /// This process's rank, in [0, world_size). Default: 0.
  TORCH_ARG(int64_t, rank) = 0;
  /// Number of processes in the group, at least 1. Default: 1.
  TORCH_ARG(int64_t, world_size) = 1;
  /// Address (or host name) of rank 0, which hosts the rendezvous store.
  /// Default: "127.0.0.1".
  TORCH_ARG(std::string, master_addr) = "127.0.0.1";
  /// TCP port of the rendezvous store on rank 0, in [1, 65535].
  /// Default: 29500 (torchrun's).
  TORCH_ARG(int64_t, master_port) = 29500;
  /// Limit for the rendezvous (all ranks joining) and for every collective;
  /// a peer that has died or hangs makes the others fail within it.
  /// Default: 60 s.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::seconds(60);
  /// Host name or address this rank's Gloo connections bind to. Default:
  /// empty: the loopback address when master_addr is a loopback address
  /// ("127.0.0.1", "localhost"), else this host's name as it resolves.
  TORCH_ARG(std::string, bind_addr) = "";
};

/// `defaults` with rank, world size, master address and port read from the
/// environment variables RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (as
/// torchrun sets them); the timeout and bind address are kept.
///
/// Example:
///   remat::distributed::ProcessGroup group(
///       remat::distributed::group_options_from_env());
///
/// Throws c10::Error naming the variable if one is unset, or naming it and
/// the value received if it is not an integer (RANK, WORLD_SIZE,
/// MASTER_PORT), if WORLD_SIZE < 1, if RANK is not in [0, WORLD_SIZE), or if
/// MASTER_PORT is not in [1, 65535].
GroupOptions group_options_from_env(GroupOptions defaults = {});

/// True when the environment names a group (WORLD_SIZE is set), as under
/// torchrun or `remat train --nproc N`.
bool environment_names_a_group();

/// A free TCP port on the loopback interface, for a group on one machine.
/// Another process may take it before it is used. Throws c10::Error if no
/// socket can be bound.
int64_t find_free_port();

/// An asynchronous collective; wait() completes it.
class Work {
 public:
  Work();
  ~Work();
  Work(Work&&) noexcept;
  Work& operator=(Work&&) noexcept;

  /// Blocks until the collective is done. Throws c10::Error naming the
  /// operation, this rank and the cause if it failed (a peer exited or is
  /// unreachable) or did not finish within the group's timeout.
  /// REQUIRES: valid().
  void wait();
  /// Whether this refers to a collective not yet waited for.
  bool valid() const;

 private:
  friend class ProcessGroup;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// One rank's membership of a group (Gloo over TCP). Copies share the same
/// membership; the connections close when the last copy goes.
class ProcessGroup {
 public:
  /// Joins the group: rank 0 starts the rendezvous store and waits for the
  /// others; every rank then connects to every other. If SIGPIPE has its
  /// default action (ending the process), it is set to be ignored, so that
  /// a peer that dies makes collectives fail with an error instead.
  ///
  /// Example:
  ///   ProcessGroup group(GroupOptions().rank(1).world_size(2)
  ///                          .master_addr("10.0.0.1").master_port(29500));
  ///
  /// Throws c10::Error naming the value received if world_size < 1, rank is
  /// not in [0, world_size), master_port is not in [1, 65535], master_addr
  /// is empty or the timeout is not positive; and naming master_addr and
  /// master_port if rank 0 cannot listen there (the port is in use) or
  /// another rank cannot reach it, or if the ranks do not all join within
  /// the timeout.
  explicit ProcessGroup(const GroupOptions& options);

  int64_t rank() const;
  int64_t world_size() const;
  /// The options the group was joined with.
  const GroupOptions& options() const;

  /// Starts summing `tensor` over all ranks, in place. The tensor must stay
  /// alive and untouched until the returned Work is waited for.
  /// REQUIRES: a dense CPU tensor of the same shape and dtype on every rank.
  Work allreduce_sum(const torch::Tensor& tensor);
  /// Starts summing `tensor` over all ranks into rank `root`'s `tensor`; the
  /// other ranks' `tensor` is left unspecified. The tensor must stay alive
  /// and untouched until the returned Work is waited for.
  /// REQUIRES: a dense CPU tensor of the same shape and dtype on every rank.
  Work reduce_sum(const torch::Tensor& tensor, int64_t root);
  /// Copies rank `root`'s `tensor` into every rank's `tensor` (blocking).
  /// REQUIRES: a dense CPU tensor of the same shape and dtype on every rank.
  void broadcast(const torch::Tensor& tensor, int64_t root = 0);
  /// Returns once every rank has called it. Throws c10::Error as Work::wait.
  void barrier();

  /// Rank 0's `value`, on every rank (through the rendezvous store).
  /// Throws c10::Error if rank 0's value does not arrive within the timeout.
  std::string share(const std::string& value);
  /// Throws c10::Error on every rank other than 0 whose `value` differs from
  /// rank 0's, naming `what`, this rank and both values (shortened).
  ///
  /// Example:
  ///   group.check_same("the plan", plan.to_string());
  void check_same(const std::string& what, const std::string& value);

 private:
  friend class Work;
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

/// This rank's part of a global batch: the rows [rank * n, (rank + 1) * n)
/// of `global` along dimension 0, n = global.size(0) / world_size (a view).
/// With a loss that is a mean over the batch, the average of the ranks'
/// gradients is then the gradient of the whole batch.
///
/// Example:
///   torch::Tensor inputs = remat::distributed::local_slice(batch, group);
///
/// Throws c10::Error naming both numbers if global.size(0) does not divide
/// by the world size.
torch::Tensor local_slice(
    const torch::Tensor& global, const ProcessGroup& group);

/// Copies rank 0's values of `parameters` into every rank's (blocking), so
/// that every rank starts from the same model.
/// REQUIRES: the same parameters in the same order on every rank.
void broadcast_parameters(
    const std::vector<torch::Tensor>& parameters, ProcessGroup& group);

/// Options of GradientSync.
struct GradientSyncOptions {
  /// Gradient bytes per bucket: parameters are packed, in reverse order,
  /// into buckets of about this size (a parameter larger than it gets a
  /// bucket of its own). Smaller buckets start communicating earlier in
  /// backward; larger ones need fewer messages. Default: 25 MiB.
  TORCH_ARG(int64_t, bucket_bytes) = int64_t{25} << 20;
};

/// Averages parameter gradients over a group, bucketed and overlapped with
/// backward.
///
/// Example:
///   remat::distributed::GradientSync sync(model->parameters(), group);
///   for (...) {
///     optimizer.zero_grad();
///     model->forward(local_inputs).mean().backward();
///     sync.finish();        // param.grad() now holds the average
///     optimizer.step();
///   }
///
/// Contract of one step: call backward() (one or more times) on a loss, then
/// finish() exactly once. During backward, each parameter's gradient goes to
/// its bucket instead of param.grad(), which autograd leaves as it was
/// (allocating it as zeros if it was undefined). finish() adds the average
/// over the ranks of the gradients of this step to param.grad(), as autograd
/// would accumulate a gradient: param.grad() = before + average. A parameter
/// that got no gradient on a rank counts as zeros there; after finish()
/// every parameter that requires grad has a defined param.grad().
///
/// Works with remat::checkpoint in both modes, PlannedSequential and
/// PlannedChain: their recomputation produces each parameter's gradient once
/// per backward, inside the region's or stage's own backward, which the
/// hooks see like any other.
///
/// REQUIRES: the same parameters (shapes, dtypes, order) on every rank; CPU
/// dense tensors; each parameter gets at most one gradient per step (a
/// parameter used by several reentrant checkpoint regions, whose inner
/// backwards each deliver a gradient, or two backward() calls per step, are
/// refused: finish() between them). Gradients through
/// torch::autograd::grad() (which does not accumulate) are not seen.
class GradientSync {
 public:
  /// Registers one hook per parameter that requires grad (the others are
  /// skipped) and lays out the buckets. Throws c10::Error if a parameter is
  /// not a dense CPU tensor or the bucket size is not positive.
  GradientSync(
      std::vector<torch::Tensor> parameters,
      ProcessGroup group,
      GradientSyncOptions options = {});
  /// Removes the hooks. Collectives still in flight are not waited for.
  ~GradientSync();
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;

  /// Starts the buckets not yet started (in bucket order, zeros for the
  /// parameters without a gradient), waits for every bucket and adds the
  /// averages to the parameters' gradients. Then the next step may begin.
  /// Throws c10::Error as Work::wait if a collective fails or times out; the
  /// step is abandoned either way (the next backward starts afresh).
  void finish();

  /// Number of buckets.
  int64_t bucket_count() const;
  /// Buckets whose allreduce started from a hook during the last completed
  /// step's backward (the rest started in finish()): a measure of overlap.
  int64_t buckets_started_in_backward() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// Sharded training of a chain of stages over a group (FSDP / ZeRO-3 style).
///
/// The parameters of each distinct stage module (a "unit") are flattened into
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
///   remat::distributed::ShardedStages sharded(remat::stages_of(model), group);
///   auto chain = sharded.sharded_chain(remat::profile_chain(model, sample));
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
/// memory outside a stage's forward and backward; reading them throws or
/// reads nothing). The modules' parameters' .grad() are used internally and
/// undefined between steps. One step: one backward() through the stages,
/// then finish(), then the optimizer step on shards(). Module buffers are
/// not sharded (each rank keeps its own, as with GradientSync). Stage
/// inputs must not be modified in place by the stage.
class ShardedStages {
 public:
  /// Shards the parameters of the stages' modules (stages without a module
  /// or without parameters are left as they are). Copies this rank's slice
  /// of each unit into its shard and frees the modules' parameter memory.
  /// Throws c10::Error (nothing changed) if `stages` is empty or a stage has
  /// no forward, a module's parameters are not all dense CPU tensors of one
  /// floating-point dtype, or a parameter belongs to the modules of two
  /// different units (naming the parameter).
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
  /// buffer; 0 for a stage without parameters), for every stage.
  std::vector<int64_t> gathered_bytes() const;
  /// Bytes this rank holds for the whole step: its shards and their
  /// gradients.
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
  /// writing the modules' parameters, e.g. torch::save), copies this rank's
  /// slice of what `use` left back into the shards, and frees them again. A
  /// collective: every rank must call it.
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

/// What launch_local runs.
struct LocalLaunchOptions {
  /// Number of workers (ranks 0 .. nproc-1). Default: 1.
  TORCH_ARG(int64_t, nproc) = 1;
  /// The program every worker runs. Default: "/proc/self/exe" (this one).
  TORCH_ARG(std::string, executable) = "/proc/self/exe";
  /// The workers' argv, argv[0] included. Default: none (argv[0] is then the
  /// executable).
  TORCH_ARG(std::vector<std::string>, arguments) = {};
  /// The rendezvous port; 0 picks a free one (find_free_port). Default: 0.
  TORCH_ARG(int64_t, master_port) = 0;
};

/// How a local launch ended.
struct LaunchResult {
  /// 0 if every worker exited with 0; else the first failing worker's exit
  /// status (128 + signal number if a signal ended it).
  int exit_code = 0;
  /// The first worker that failed; -1 if none.
  int64_t failed_rank = -1;
  /// "rank 1 exited with status 1", "rank 0 was killed by signal 9" or "the
  /// launcher received signal 2 (Interrupt); every worker was stopped"; empty
  /// when all succeeded.
  std::string message;
};

/// Starts `nproc` copies of the executable with RANK, WORLD_SIZE,
/// MASTER_ADDR=127.0.0.1, MASTER_PORT and REMAT_LAUNCHER_PID (this process)
/// set (the rest of the environment is inherited) and waits for them. As soon
/// as one fails, the others are sent SIGTERM (SIGKILL 5 s later) and the
/// failure is returned. No worker outlives the launcher: while it waits,
/// SIGINT, SIGTERM and SIGHUP sent to this process stop every worker the same
/// way and the launch returns 128 + the signal's number (the previous
/// handlers are restored before it returns); if this process dies otherwise
/// (SIGKILL, a crash), the kernel sends each worker SIGTERM.
///
/// Example:
///   auto result = launch_local(LocalLaunchOptions().nproc(2).arguments(
///       {"remat", "train", "--steps", "10"}));
///
/// Throws c10::Error if nproc < 1 or a worker cannot be started (workers
/// already started are killed first).
LaunchResult launch_local(const LocalLaunchOptions& options);

}  // namespace remat::distributed
