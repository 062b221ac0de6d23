// remat/distributed/gradient_sync.h: GradientSync, data-parallel gradient
// averaging in buckets, overlapped with backward.
// Part of remat::distributed (remat/distributed.h; docs/distributed.md).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <torch/arg.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>

#include "remat/distributed/process_group.h"

namespace remat::distributed {

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
/// torch::autograd::grad() (which does not accumulate) are not seen. Which
/// parameters are averaged (those that require grad) is fixed at
/// construction: finish() throws c10::Error, naming the parameter's index
/// and shape, after one was frozen or unfrozen (its collectives are waited
/// for first; param.grad() is then left as it was).
class GradientSync {
 public:
  /// Registers one hook per parameter that requires grad (the others are
  /// skipped) and lays out the buckets. Throws c10::Error if a parameter is
  /// not a dense CPU tensor or the bucket size is not positive, and on every
  /// rank if the ranks' parameters (count, shapes, dtypes, which require
  /// grad) differ (a collective, through the store: every rank must
  /// construct it).
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

}  // namespace remat::distributed
