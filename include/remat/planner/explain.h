// remat/planner/explain.h: a plan on a chain, as a table people read.
#pragma once

#include <ostream>
#include <string>

#include "remat/planner/chain.h"
#include "remat/planner/plan.h"

namespace remat::planner {

/// A readable report of `plan` on `chain`, in three parts:
///  1. one row per stage: its forward and backward time, output and saved
///     bytes, how often it runs forward, and what the plan keeps of it;
///  2. one row per op, in plan order: "live after" (bytes live once the op
///     is done) and "peak in op" (highest live bytes inside it), each as
///     exact bytes and in binary units; these are simulate()'s
///     Simulation::live_after_bytes and Simulation::op_peak_bytes;
///  3. the predicted peak and time next to storing everything.
/// An invalid plan is reported ("invalid plan: <simulate()'s error>"), not
/// thrown. Never throws except std::bad_alloc.
///
/// Example:
// clang-format off
///   std::cout << remat::planner::explain(chain, solve_sqrt(chain));
// clang-format on
std::string explain(const Chain& chain, const Plan& plan);

/// The same report written to `out`.
void explain(std::ostream& out, const Chain& chain, const Plan& plan);

}  // namespace remat::planner
