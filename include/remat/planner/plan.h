// remat/planner/plan.h: a plan is a typed sequence of operations on a chain.
//
// Plan first, execute second: solvers produce a Plan, simulate() checks and
// costs it, the LibTorch runtime carries it out. A Plan knows nothing of the
// chain it is for; simulate() rejects ops whose stage is out of range.
//
// Text form (stable; Plan::to_string and plan_from_string):
// clang-format off
//   plan  := "" | op (" " op)*
//   op    := kind index
//   kind  := "N" (kForwardNoSave) | "C" (kForwardCheckpoint)
//          | "R" (kForwardRecord) | "S" (kForwardSelective)
//          | "B" (kBackward)
//   index := "0" | [1-9][0-9]*          (a stage index, fits int64)
// Example:
//   "C0 N1 R2 B2 R0 R1 B1 B0"
// clang-format on
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace remat::planner {

/// The four operations of the rotor model, plus a selective forward
/// (docs/planner.md, "Ops and text form").
enum class OpKind {
  /// Run stage i without recording; keep only its output x_{i+1}. Its input
  /// x_i is dropped unless something else holds it (a checkpoint, a record,
  /// or it is the chain input).
  kForwardNoSave,
  /// Like kForwardNoSave, and additionally keep the input x_i as a checkpoint
  /// until the backward of stage i.
  kForwardCheckpoint,
  /// Run stage i recording what its backward needs (saved_bytes, which
  /// contains the output x_{i+1}); the input x_i is kept until the backward.
  kForwardRecord,
  /// Like kForwardRecord, but record only what the stage's per-op policy
  /// keeps (StageCost::selective: selective->saved_bytes); its backward
  /// first recomputes the rest. Only for stages that have a SelectiveCost.
  kForwardSelective,
  /// Run the backward of stage i: consumes its record (full or selective)
  /// and the gradient of x_{i+1}, produces the gradient of x_i.
  kBackward,
};

/// One operation of a plan.
struct Op {
  /// What to do.
  OpKind kind = OpKind::kForwardNoSave;
  /// Which stage, 0-based.
  int64_t stage = 0;
};

bool operator==(const Op& lhs, const Op& rhs);
bool operator!=(const Op& lhs, const Op& rhs);

/// A sequence of operations; see the text grammar at the top of this header.
///
/// Example:
// clang-format off
///   Plan plan = solve_store_all(chain);
///   std::cout << plan.to_string();  // "R0 R1 B1 B0" for two stages
// clang-format on
struct Plan {
  /// The operations, executed in order.
  std::vector<Op> ops;
  /// The one-line text form: ops separated by single spaces, each a kind
  /// letter (N, C, R, S, B) followed by the stage index. Empty plan: "".
  std::string to_string() const;
};

bool operator==(const Plan& lhs, const Plan& rhs);
bool operator!=(const Plan& lhs, const Plan& rhs);

/// The letter of `kind` in the text form: 'N', 'C', 'R', 'S' or 'B'.
char op_kind_letter(OpKind kind);
/// The name of `kind` in JSON: "forward_no_save", "forward_checkpoint",
/// "forward_record", "forward_selective" or "backward".
const char* op_kind_name(OpKind kind);

/// Parses the text form written by Plan::to_string. Inverse of to_string:
/// plan_from_string(p.to_string()) == p.
/// Throws std::invalid_argument naming the character offset and the bad token
/// if `text` does not follow the grammar at the top of this header.
///
/// Example:
// clang-format off
///   Plan plan = plan_from_string("R0 R1 B1 B0");
// clang-format on
Plan plan_from_string(std::string_view text);

}  // namespace remat::planner
