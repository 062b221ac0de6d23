// remat/distributed/process_group.h: ProcessGroup, a group of ranks over
// c10d (Gloo, CPU), and what goes with it: options from the environment,
// this rank's slice of a batch, broadcasting parameters.
// Part of remat::distributed (remat/distributed.h; docs/distributed.md).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/arg.h>
#include <torch/types.h>

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
  /// a peer that has died or hangs makes the others fail within it; at
  /// most 100 years. Default: 60 s.
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
/// Throws c10::Error naming the variable if one is unset or empty, or naming
/// it and the value received if it is not an integer (RANK, WORLD_SIZE,
/// MASTER_PORT), if WORLD_SIZE < 1, if RANK is not in [0, WORLD_SIZE), or if
/// MASTER_PORT is not in [1, 65535].
GroupOptions group_options_from_env(GroupOptions defaults = {});

/// True when the environment names a group (WORLD_SIZE is set and not
/// empty), as under torchrun or `remat train --nproc N`.
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
  /// is empty or the timeout is not positive or above 100 years; and naming
  /// master_addr and master_port if rank 0 cannot listen there (the port is
  /// in use) or another rank cannot reach it, or if the ranks do not all
  /// join within the timeout.
  explicit ProcessGroup(const GroupOptions& options);

  int64_t rank() const;
  int64_t world_size() const;
  /// The options the group was joined with.
  const GroupOptions& options() const;

  /// Starts summing `tensor` over all ranks, in place. The tensor must stay
  /// alive and untouched until the returned Work is waited for.
  /// REQUIRES: a dense CPU tensor of the same shape and dtype on every rank.
  /// Throws c10::Error if the tensor is not contiguous. Which dtypes Gloo
  /// sums depends on the LibTorch version (1.13's refuses bfloat16, bool,
  /// int16 and complex: Work::wait then fails with Gloo's message).
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
/// by the world size, and if `global` has no dimension.
torch::Tensor local_slice(
    const torch::Tensor& global, const ProcessGroup& group);

/// Copies rank 0's values of `parameters` into every rank's (blocking), so
/// that every rank starts from the same model.
/// REQUIRES: the same parameters in the same order on every rank.
void broadcast_parameters(
    const std::vector<torch::Tensor>& parameters, ProcessGroup& group);

}  // namespace remat::distributed
