// simulate(): the single definition of what a plan costs.
//
// NOTE: [The memory model]
// Values: x_0 is the chain input (input_bytes); x_{i+1} is the output of
// stage i (output_bytes of stage i). g_v, the gradient of x_v, has the size of
// x_v. R_i, the record of stage i, is what a recorded forward leaves alive for
// the backward: saved_bytes of stage i, which CONTAINS the output x_{i+1}
// (x_{i+1} costs nothing extra while R_i lives) and EXCLUDES the input x_i
// (held separately, see kForwardRecord). So profile_chain must measure
// saved_bytes as live bytes after a recorded forward minus live bytes before
// it (input already allocated, output still referenced).
//
// Live bytes = every held x_v (x_0 included: the input is held for the whole
// step) + every record + the gradient in flight. Peak = highest live bytes,
// counting transients inside ops. The runtime's measured activation peak (live
// bytes minus those before forward, parameter gradients preallocated) plus
// input_bytes is what peak_bytes predicts.
//
// A held value is kLoose (dropped by the next forward that reads it), kKept
// (held until the backward of its stage; x_0 is kept forever) or kInRecord
// (x_{i+1} inside R_i). Ops on stage i, with B = live bytes before the op:
//   forward (all kinds): REQUIRES backward of stage i not yet run, x_i held,
//     x_{i+1} not held; the last stage may only be recorded (its output only
//     feeds the loss). Peak B + produced + transient, where produced is
//     saved_bytes and transient record_transient() for kForwardRecord, else
//     output_bytes and forward_tmp_bytes. Time += forward_ms.
//     kForwardNoSave: x_{i+1} becomes kLoose; a kLoose x_i is dropped.
//     kForwardCheckpoint: x_{i+1} becomes kLoose; a kLoose x_i becomes kKept.
//     kForwardRecord: R_i held, x_{i+1} kInRecord; a kLoose x_i becomes kKept.
//     kForwardSelective: as kForwardRecord with the stage's SelectiveCost
//       (REQUIRES one): R_i is selective->saved_bytes, the transient
//       selective->forward_tmp_bytes.
//   kBackward: REQUIRES the backwards run in order L-1, ..., 0 (each once) and
//     R_i held (x_i is then held too). The first backward (stage L-1) first
//     allocates g_L, the gradient of the chain output. Peak
//     B + |g_i| + backward_tmp_bytes (which may be negative, down to -|g_i|).
//     Then R_i and g_{i+1} are freed, g_i is
//     live, and a kKept x_i (i > 0) is dropped: nothing needs it any more.
//     Time += backward_ms. After kForwardSelective the backward's transient
//     is selective->backward_tmp_bytes, what it frees selective->saved_bytes,
//     and its time backward_ms + selective->recompute_ms.
//   End: REQUIRES every backward run. g_0 stays live to the end (counted).
//
// There is no explicit "drop" op: lifetimes follow from the rules above, which
// is what makes a plan executable by the runtime as written.
#include "remat/planner/simulate.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "replay_loop.h"

namespace remat::planner {
namespace {

std::string value_name(int64_t v) {
  return "x_" + std::to_string(v);
}

/// What a forward of a stage adds to the live bytes (produced) and what it
/// needs on top of them while it runs (transient).
struct ForwardBytes {
  int64_t produced = 0;
  int64_t transient = 0;
};

/// The bytes of a forward of kind `kind` (not kBackward) of a stage costing
/// `cost` (NOTE: [The memory model]). REQUIRES: cost.selective for
/// kForwardSelective.
ForwardBytes forward_bytes(const StageCost& cost, OpKind kind) {
  switch (kind) {
    case OpKind::kForwardSelective:
      return {cost.selective->saved_bytes, cost.selective_forward_extra()};
    case OpKind::kForwardRecord:
      return {cost.saved_bytes, cost.record_extra()};
    default:
      return {cost.output_bytes, cost.forward_extra()};
  }
}

}  // namespace

Replay::Replay(const Chain& chain)
    : chain_(&chain),
      holding_(chain.size() + 1, Holding::kAbsent),
      recorded_(chain.size(), kNotRecorded),
      next_backward_(chain.size() - 1),
      current_bytes_(chain.base_bytes()),
      peak_bytes_(chain.base_bytes()),
      last_op_peak_bytes_(chain.base_bytes()) {
  holding_[0] = Holding::kKept;
}

Replay::Holding Replay::holding(int64_t value) const {
  if (value < 0 || value > chain_->size()) {
    throw std::out_of_range(
        "remat::planner::Replay::holding: value " + std::to_string(value) +
        " out of range [0, " + std::to_string(chain_->size()) + "]");
  }
  return holding_[value];
}

bool Replay::recorded(int64_t stage) const {
  if (stage < 0 || stage >= chain_->size()) {
    throw std::out_of_range(
        "remat::planner::Replay::recorded: stage " + std::to_string(stage) +
        " out of range [0, " + std::to_string(chain_->size()) + ")");
  }
  return recorded_[stage] != kNotRecorded;
}

bool Replay::recorded_selectively(int64_t stage) const {
  if (stage < 0 || stage >= chain_->size()) {
    throw std::out_of_range(
        "remat::planner::Replay::recorded_selectively: stage " +
        std::to_string(stage) + " out of range [0, " +
        std::to_string(chain_->size()) + ")");
  }
  return recorded_[stage] == kSelectiveRecord;
}

std::string Replay::apply(const Op& op) {
  const int64_t n = chain_->size();
  if (op.stage < 0 || op.stage >= n) {
    return "stage " + std::to_string(op.stage) + " out of range [0, " +
           std::to_string(n) + ")";
  }
  if (op.kind == OpKind::kBackward) {
    std::string error = backward_error(op.stage);
    if (error.empty()) {
      run_backward(op.stage);
    }
    return error;
  }
  std::string error = forward_error(op);
  if (error.empty()) {
    run_forward(op);
  }
  return error;
}

std::string Replay::backward_error(int64_t i) const {
  if (std::string error = detail::backward_order_error(
          i, next_backward_, recorded_[i] != kNotRecorded);
      !error.empty()) {
    return error;
  }
  if (holding_[i] == Holding::kAbsent) {
    return "backward of stage " + std::to_string(i) + " needs " +
           value_name(i) + ", which is not held";
  }
  return "";
}

void Replay::run_backward(int64_t i) {
  const int64_t n = chain_->size();
  const StageCost& cost = chain_->stage(i);
  int64_t live = current_bytes_;
  if (i == n - 1) {
    live += chain_->value_bytes(n);  // g_L appears with the backward phase
  }
  const bool selective = recorded_[i] == kSelectiveRecord;
  const int64_t grad_in = chain_->value_bytes(i + 1);
  const int64_t grad_out = chain_->value_bytes(i);
  last_op_peak_bytes_ = live + grad_out + cost.backward_extra(selective);
  peak_bytes_ = std::max(peak_bytes_, last_op_peak_bytes_);
  live += grad_out - grad_in -
          (selective ? cost.selective->saved_bytes : cost.saved_bytes);
  recorded_[i] = kNotRecorded;
  holding_[i + 1] = Holding::kAbsent;  // was kInRecord
  if (i > 0 && holding_[i] != Holding::kInRecord) {
    holding_[i] = Holding::kAbsent;
    live -= chain_->value_bytes(i);
  }
  current_bytes_ = live;
  next_backward_ = i - 1;
  time_ms_ += cost.backward_ms;
  if (selective) {
    time_ms_ += cost.selective->recompute_ms;
  }
}

std::string Replay::forward_error(const Op& op) const {
  const int64_t i = op.stage;
  if (i > next_backward_) {
    return "forward of stage " + std::to_string(i) + " after its backward";
  }
  if (holding_[i] == Holding::kAbsent) {
    return "forward of stage " + std::to_string(i) + " needs " + value_name(i) +
           ", which is not held (dropped or never computed)";
  }
  if (holding_[i + 1] != Holding::kAbsent) {
    return "forward of stage " + std::to_string(i) + " would compute " +
           value_name(i + 1) + ", which is already held";
  }
  const bool selective = op.kind == OpKind::kForwardSelective;
  const bool record = op.kind == OpKind::kForwardRecord || selective;
  if (i == chain_->size() - 1 && !record) {
    return "forward of the last stage " + std::to_string(i) +
           " must be kForwardRecord or kForwardSelective (its output only "
           "feeds the loss)";
  }
  if (selective && !chain_->stage(i).selective) {
    return "selective forward of stage " + std::to_string(i) +
           ", which has no selective cost (StageCost::selective is unset)";
  }
  return "";
}

void Replay::run_forward(const Op& op) {
  const int64_t i = op.stage;
  const StageCost& cost = chain_->stage(i);
  const ForwardBytes bytes = forward_bytes(cost, op.kind);
  last_op_peak_bytes_ = current_bytes_ + bytes.produced + bytes.transient;
  peak_bytes_ = std::max(peak_bytes_, last_op_peak_bytes_);
  current_bytes_ += bytes.produced;
  switch (op.kind) {
    case OpKind::kForwardNoSave:
      holding_[i + 1] = Holding::kLoose;
      if (holding_[i] == Holding::kLoose) {
        holding_[i] = Holding::kAbsent;
        current_bytes_ -= chain_->value_bytes(i);
      }
      break;
    case OpKind::kForwardCheckpoint:
      holding_[i + 1] = Holding::kLoose;
      if (holding_[i] == Holding::kLoose) {
        holding_[i] = Holding::kKept;
      }
      break;
    case OpKind::kForwardRecord:
    case OpKind::kForwardSelective:
      holding_[i + 1] = Holding::kInRecord;
      recorded_[i] =
          op.kind == OpKind::kForwardSelective ? kSelectiveRecord : kFullRecord;
      if (holding_[i] == Holding::kLoose) {
        holding_[i] = Holding::kKept;
      }
      break;
    case OpKind::kBackward:
      break;  // run_backward
  }
  time_ms_ += cost.forward_ms;
}

Simulation simulate(const Chain& chain, const Plan& plan) {
  Replay replay(chain);
  return detail::replay_plan(
      plan,
      replay,
      chain.cold_write_ms_per_mib(),
      [&](size_t k) { return replay.apply(plan.ops[k]); },
      [](size_t) {});
}

}  // namespace remat::planner
