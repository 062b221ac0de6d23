// remat/planner/json.h: JSON for chains and plans, with round-trip.
//
// clang-format off
// Chain: {"input_bytes": 100, "stages": [{"forward_ms": 1.5,
//   "backward_ms": 3, "output_bytes": 100, "saved_bytes": 150,
//   "forward_tmp_bytes": 0, "backward_tmp_bytes": 0,
//   "record_tmp_bytes": 0, "selective": {"saved_bytes": 100,
//   "forward_tmp_bytes": 0, "backward_tmp_bytes": 50,
//   "recompute_ms": 0.5}}, ...]}  (record_tmp_bytes and selective are
//   optional; inside selective every field is required)
// Graph: a chain's format without resident_bytes, each stage with
//   "inputs": [-1, 0, ...] (what it reads: -1 the graph input, else an
//   earlier stage; required).
// Plan:  {"ops": [{"kind": "forward_record", "stage": 0},
//   {"kind": "backward", "stage": 0}]}
// clang-format on
// Kinds: "forward_no_save", "forward_checkpoint", "forward_record",
// "forward_selective", "backward". Every field but record_tmp_bytes and
// selective is required (absent: unset; the recorded forward's transient is
// then forward_tmp_bytes, and the stage has no selective way to run); unknown
// fields are rejected (they are usually typos). Byte sizes and stages are JSON
// integers, non-negative except backward_tmp_bytes (see StageCost); times are
// numbers. The JSON library is an implementation detail (not in this header).
#pragma once

#include <string>
#include <string_view>

#include "remat/planner/chain.h"
#include "remat/planner/graph.h"
#include "remat/planner/plan.h"

namespace remat::planner {

/// Writes `chain` as JSON (format at the top of this header). Times round-trip
/// exactly: chain_from_json(to_json(c)) == c.
std::string to_json(const Chain& chain);

/// Reads a chain written by to_json (or by hand).
/// Throws std::invalid_argument naming the JSON path and the bad value
/// (e.g. "stages[2].saved_bytes: expected a non-negative integer, got -5")
/// for malformed JSON, a missing, unknown, repeated or mistyped field, or any
/// value Chain's constructor rejects. Never throws anything else.
///
/// Example:
// clang-format off
///   Chain chain = chain_from_json(R"({"input_bytes": 8, "stages": [...]})");
// clang-format on
Chain chain_from_json(std::string_view json);

/// Writes `graph` as JSON (format at the top of this header).
/// graph_from_json(to_json(g)) == g.
std::string to_json(const Graph& graph);
/// Reads a graph written by to_json. Throws std::invalid_argument as
/// chain_from_json, naming the JSON path and the bad value, and with
/// Graph's constructor's message for a structure it refuses (a stage that
/// reads a later stage, reads nothing, or feeds nothing).
Graph graph_from_json(std::string_view json);
/// Writes `plan` as JSON (format at the top of this header).
/// plan_from_json(to_json(p)) == p.
std::string to_json(const Plan& plan);

/// Reads a plan written by to_json. Throws std::invalid_argument naming the
/// JSON path and the bad value for malformed JSON, a missing, unknown,
/// repeated or mistyped field, an unknown kind or a negative stage. Stage
/// ranges are checked by simulate(), not here. Never throws anything else.
Plan plan_from_json(std::string_view json);

}  // namespace remat::planner
