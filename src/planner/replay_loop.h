// replay_loop.h (private): what simulate() on chains (simulate.cpp) and on
// graphs (graph_simulate.cpp) share: the loop that replays a plan op by op
// into a Simulation, and the rules of backward order.
#pragma once

#include <cstdint>
#include <string>

#include "remat/planner/plan.h"
#include "remat/planner/simulate.h"

namespace remat::planner::detail {

/// "" or the rule a backward of stage `i` breaks: backwards run once each,
/// in order `next_backward`, `next_backward` - 1, ..., 0 (-1: all have
/// run), each on a recorded stage.
inline std::string backward_order_error(
    int64_t i, int64_t next_backward, bool recorded) {
  if (next_backward < 0) {
    return "backward of stage " + std::to_string(i) +
           " after every backward has run";
  }
  if (i != next_backward) {
    return "backward of stage " + std::to_string(i) +
           " out of order, expected the backward of stage " +
           std::to_string(next_backward);
  }
  if (!recorded) {
    return "backward of stage " + std::to_string(i) + ", which is not recorded";
  }
  return "";
}

/// Replays `plan`: apply(k) applies op k to `replay` and returns "" or the
/// broken rule; on_op(k) runs after each applied op. `replay` reports
/// current_bytes(), last_op_peak_bytes(), peak_bytes(), time_ms(),
/// finished() and next_backward_stage(). `cold_write_ms_per_mib`: the
/// chain's or graph's, for Simulation::step_ms.
template <typename Replay, typename Apply, typename OnOp>
Simulation replay_plan(
    const Plan& plan,
    const Replay& replay,
    double cold_write_ms_per_mib,
    Apply apply,
    OnOp on_op) {
  Simulation result;
  const auto totals = [&] {
    result.peak_bytes = replay.peak_bytes();
    result.time_ms = replay.time_ms();
    result.step_ms =
        result.time_ms + cold_write_ms_per_mib *
                             static_cast<double>(result.peak_bytes) /
                             static_cast<double>(int64_t{1} << 20);
  };
  result.live_after_bytes.reserve(plan.ops.size());
  result.op_peak_bytes.reserve(plan.ops.size());
  for (size_t k = 0; k < plan.ops.size(); ++k) {
    const Op& op = plan.ops[k];
    const std::string error = apply(k);
    if (!error.empty()) {
      result.error = "op " + std::to_string(k) + " (" +
                     op_kind_letter(op.kind) + std::to_string(op.stage) +
                     "): " + error;
      totals();
      return result;
    }
    result.live_after_bytes.push_back(replay.current_bytes());
    result.op_peak_bytes.push_back(replay.last_op_peak_bytes());
    on_op(k);
  }
  totals();
  if (!replay.finished()) {
    result.error = "the plan ends before the backward of stage " +
                   std::to_string(replay.next_backward_stage());
    return result;
  }
  result.valid = true;
  return result;
}

}  // namespace remat::planner::detail
