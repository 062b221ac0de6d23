// remat/planner/chain.h: the cost model of a sequential network (a chain).
//
// A chain is stages 0..L-1; stage i maps value x_i to x_{i+1}. x_0 is the chain
// input (input_bytes), x_{i+1} is the output of stage i (output_bytes of stage
// i). A Chain is immutable and validated once at construction, so solvers and
// simulate() never see negative, non-finite or overflowing costs.
// How these numbers are used: docs/planner.md ("The memory model").
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace remat::planner {

/// Costs of running a stage selectively (kForwardSelective): its forward
/// keeps only what a per-op policy marks for saving (remat/policy.h, e.g. the
/// matmul outputs) and its backward first recomputes the rest. What
/// `remat::profile_chain` measures when it is given a policy. Byte fields
/// have the meaning of StageCost's fields of the same name.
struct SelectiveCost {
  /// Bytes a selective forward leaves alive until the stage's backward:
  /// CONTAINS the output x_{i+1}, EXCLUDES the input x_i. >= 0.
  int64_t saved_bytes = 0;
  /// Transient extra bytes inside the selective forward, on top of the bytes
  /// held before it plus saved_bytes. >= 0. Default: 0.
  int64_t forward_tmp_bytes = 0;
  /// Transient extra bytes inside the backward (the recomputed tensors
  /// included), on top of the bytes held before it plus the gradient g_i it
  /// produces. >= -|x_i|, as StageCost::backward_tmp_bytes. Default: 0.
  int64_t backward_tmp_bytes = 0;
  /// Time the backward spends recomputing what the forward did not keep, in
  /// milliseconds, on top of StageCost::backward_ms. Finite and >= 0: a
  /// selective stage is never faster than a recorded one (which is what lets
  /// the solver treat recording everything as the fastest plan). Default: 0.
  double recompute_ms = 0;
};

/// Measured costs of one stage of a chain (what `remat::profile_chain`
/// measures). All byte fields are >= 0; times are finite and >= 0.
///
/// Example:
// clang-format off
///   StageCost linear{/*forward_ms=*/0.2, /*backward_ms=*/0.4,
///                    /*output_bytes=*/4096, /*saved_bytes=*/4096};
// clang-format on
struct StageCost {
  /// Forward time of the stage with nothing recorded, in milliseconds.
  double forward_ms = 0;
  /// Backward time of the stage given its recorded tensors, in milliseconds.
  double backward_ms = 0;
  /// Size of the stage output x_{i+1} in bytes (also the size of its
  /// gradient). Keeping it as a checkpoint costs this much.
  int64_t output_bytes = 0;
  /// Bytes a recorded forward (kForwardRecord) leaves alive until the stage's
  /// backward: everything autograd keeps for the backward, INCLUDING the stage
  /// output and EXCLUDING the stage input (which the model holds separately).
  /// Measured as live bytes after a recorded forward minus live bytes before
  /// it. Usually >= output_bytes.
  int64_t saved_bytes = 0;
  /// Transient extra bytes inside a forward that records nothing
  /// (kForwardNoSave, kForwardCheckpoint), on top of the bytes held before the
  /// forward plus the output it produces. Default: 0.
  int64_t forward_tmp_bytes = 0;
  /// Transient extra bytes inside the backward, on top of the bytes held before
  /// the backward plus the gradient g_i it produces. May be negative, down to
  /// -|x_i| (the size of g_i): a backward that frees part of what it held
  /// (its record, the incoming gradient) before g_i exists peaks below
  /// before + |g_i|, though never below before. Default: 0.
  int64_t backward_tmp_bytes = 0;
  /// Transient extra bytes inside a recorded forward (kForwardRecord), on top
  /// of the bytes held before the forward plus saved_bytes. It differs from
  /// forward_tmp_bytes when recording changes what a forward allocates (a
  /// dropout's no-grad forward frees its mask before returning; a recorded
  /// one keeps it in saved_bytes). Unset (default): forward_tmp_bytes.
  std::optional<int64_t> record_tmp_bytes = std::nullopt;
  /// The costs of the third way to run the stage, kForwardSelective; unset
  /// (default): the stage has none, and a plan may not run it selectively.
  /// Its forward takes forward_ms, its backward backward_ms +
  /// selective->recompute_ms.
  std::optional<SelectiveCost> selective = std::nullopt;
  /// Bytes that exist only while an op of this stage runs, besides its
  /// activations: under sharded training (remat/distributed.h) the stage's
  /// parameters, all-gathered from their shards before each of its forwards
  /// and before its backward and freed after them. Its backward also holds
  /// their full gradients, as many bytes again, until they are
  /// reduce-scattered. Default: 0 (parameters are not part of the model).
  int64_t gathered_bytes = 0;

  /// The transient of a recorded forward: record_tmp_bytes if set, else
  /// forward_tmp_bytes.
  int64_t record_transient() const {
    return record_tmp_bytes.value_or(forward_tmp_bytes);
  }

  // What the memory model adds to "bytes held before the op + bytes the op
  // leaves" at the peak of each op on this stage: the op's transient plus
  // what it gathers (docs/planner.md, "The memory model").
  /// kForwardNoSave, kForwardCheckpoint: forward_tmp_bytes + gathered_bytes.
  int64_t forward_extra() const {
    return forward_tmp_bytes + gathered_bytes;
  }
  /// kForwardRecord: record_transient() + gathered_bytes.
  int64_t record_extra() const {
    return record_transient() + gathered_bytes;
  }
  /// kForwardSelective: selective->forward_tmp_bytes + gathered_bytes.
  /// REQUIRES: selective.
  int64_t selective_forward_extra() const {
    return selective->forward_tmp_bytes + gathered_bytes;
  }
  /// kBackward after a full (`selective` false) or selective record: its
  /// backward_tmp_bytes + 2 * gathered_bytes (parameters and their full
  /// gradients). REQUIRES: selective is set if `selective` is true.
  int64_t backward_extra(bool selective_record) const {
    return (selective_record ? selective->backward_tmp_bytes
                             : backward_tmp_bytes) +
           2 * gathered_bytes;
  }
};

/// Memory a training step holds from its start to its end outside the
/// activation model: the model's parameters (and buffers), their gradients
/// and the optimizer's state. No plan changes it, so simulate()'s peaks
/// leave it out; total budgets (remat::Budget::total) subtract it, and
/// reports show it next to the activations. Bytes already counted in
/// Chain::resident_bytes (sharded training) are not counted again here.
struct ModelState {
  int64_t parameter_bytes = 0;  ///< parameters and buffers; >= 0
  int64_t gradient_bytes = 0;   ///< gradients of trainable parameters; >= 0
  int64_t optimizer_bytes = 0;  ///< the optimizer's state; >= 0
  int64_t total_bytes() const {
    return parameter_bytes + gradient_bytes + optimizer_bytes;
  }
};

/// A validated, immutable chain of stage costs.
///
/// Example:
// clang-format off
///   Chain chain({StageCost{1, 2, 100, 150}, StageCost{1, 2, 100, 100}},
///               /*input_bytes=*/100);
///   int64_t n = chain.size();  // 2
// clang-format on
class Chain {
 public:
  /// Throws std::invalid_argument, naming the stage index and the field, if
  /// `stages` is empty, any byte field or `input_bytes` is negative (except
  /// backward_tmp_bytes, which must be >= -|x_i|), any time
  /// is negative or not finite, or the byte sizes summed over the chain
  /// (2 * input_bytes + sum of 2 * output_bytes + saved_bytes +
  /// forward_tmp_bytes + backward_tmp_bytes + record_tmp_bytes + the
  /// selective byte fields + 3 * gathered_bytes + resident_bytes) exceed
  /// INT64_MAX / 4, or the summed times are not finite. The selective fields
  /// are checked as the fields of the same name.
  ///
  /// `resident_bytes`: bytes held for the whole step besides the input and
  /// the activations, counted in every peak so that a byte budget covers
  /// them too: under sharded training, this rank's parameter shards and
  /// their gradients. >= 0. Default: 0 (the budget covers activations only).
  ///
  /// `model_state`: the step's parameters, gradients and optimizer state
  /// (ModelState); each field >= 0, their sum within the same byte limit.
  /// Default: none known (all 0).
  Chain(
      std::vector<StageCost> stages,
      int64_t input_bytes,
      int64_t resident_bytes = 0,
      ModelState model_state = {});

  /// Number of stages L (>= 1).
  int64_t size() const {
    return static_cast<int64_t>(stages_.size());
  }
  /// Costs of stage `index`. Throws std::out_of_range unless
  /// 0 <= index < size().
  const StageCost& stage(int64_t index) const;
  /// All stages, in order.
  const std::vector<StageCost>& stages() const {
    return stages_;
  }
  /// Size of the chain input x_0 in bytes.
  int64_t input_bytes() const {
    return input_bytes_;
  }
  /// Bytes held for the whole step besides the input and the activations
  /// (see the constructor). Every peak simulate() reports includes them.
  int64_t resident_bytes() const {
    return resident_bytes_;
  }
  /// The step's parameters, gradients and optimizer state (see the
  /// constructor); outside every peak simulate() reports.
  const ModelState& model_state() const {
    return model_state_;
  }
  /// A copy of this chain with `state` as its model state. Throws as the
  /// constructor.
  Chain with_model_state(const ModelState& state) const;
  /// Milliseconds a training step spends writing one MiB into memory that
  /// is not in cache, beyond writing it into memory that is: the machine's
  /// cost of first touching the step's working set, which simulate() charges
  /// once per step for every byte of the peak (Simulation::step_ms). What
  /// `remat::profile_chain` measures on a CPU; 0 on other devices and by
  /// default (docs/planner.md, "Time").
  double cold_write_ms_per_mib() const {
    return cold_write_ms_per_mib_;
  }
  /// A copy of this chain with `ms_per_mib` as cold_write_ms_per_mib().
  /// Throws std::invalid_argument, naming the value, unless it is finite and
  /// >= 0.
  Chain with_cold_write_ms_per_mib(double ms_per_mib) const;
  /// The bytes every plan holds from start to end: input_bytes() +
  /// resident_bytes().
  int64_t base_bytes() const {
    return input_bytes_ + resident_bytes_;
  }
  /// Size in bytes of value x_index (and of its gradient): input_bytes() for
  /// index 0, else stage(index - 1).output_bytes. Throws std::out_of_range
  /// unless 0 <= index <= size().
  int64_t value_bytes(int64_t index) const;

 private:
  std::vector<StageCost> stages_;
  int64_t input_bytes_;
  int64_t resident_bytes_;
  ModelState model_state_;
  double cold_write_ms_per_mib_ = 0;
};

bool operator==(const SelectiveCost& lhs, const SelectiveCost& rhs);
bool operator!=(const SelectiveCost& lhs, const SelectiveCost& rhs);
bool operator==(const StageCost& lhs, const StageCost& rhs);
bool operator!=(const StageCost& lhs, const StageCost& rhs);
bool operator==(const ModelState& lhs, const ModelState& rhs);
bool operator!=(const ModelState& lhs, const ModelState& rhs);
/// Chains are equal when their input and resident sizes, model states,
/// cold-write costs and all stage costs are equal.
bool operator==(const Chain& lhs, const Chain& rhs);
bool operator!=(const Chain& lhs, const Chain& rhs);

}  // namespace remat::planner
