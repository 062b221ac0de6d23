// remat/planner.h: the torch-free planner (namespace remat::planner).
//
// Chain (measured stage costs) -> solver -> Plan (typed ops) -> simulate()
// (validity, peak bytes, time) -> explain() (the report). No LibTorch; C++17
// standard library only. See docs/planner.md.
#pragma once

#include "remat/planner/chain.h"
#include "remat/planner/explain.h"
#include "remat/planner/graph.h"
#include "remat/planner/json.h"
#include "remat/planner/plan.h"
#include "remat/planner/simulate.h"
#include "remat/planner/solvers.h"
#include "remat/planner/statistics.h"
#include "remat/planner/strategy.h"
#include "remat/planner/units.h"
