// graph_stages.h (private): what profile_graph and PlannedGraph share about
// a std::vector<GraphStage>: its checked structure and its stages as calls.
#pragma once

#include <cstdint>
#include <vector>

#include "plan_executor.h"
#include "remat/graph.h"
#include "remat/planner/graph.h"

namespace remat::detail {

/// The structure of `stages` (their inputs) as a planner::Graph with unit
/// costs. Throws c10::Error, naming `who` and the stage, if `stages` is
/// empty, a stage has no forward, or its inputs are refused by
/// planner::Graph (reads nothing, reads a stage that is not an earlier one,
/// or an output nothing reads).
planner::Graph graph_structure(
    const char* who, const std::vector<GraphStage>& stages);

/// Stage `index` as a call on its distinct input values
/// (structure.input_values(index)), which it maps to its arguments in the
/// order of GraphStage::inputs.
StageCall call_of(
    const GraphStage& stage, const planner::Graph& structure, int64_t index);

/// Stages that hold only the modules of `stages` (no forward): what
/// model_state_of and modules_of read.
std::vector<Stage> module_holders(const std::vector<GraphStage>& stages);

}  // namespace remat::detail
