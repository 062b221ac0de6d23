// remat/remat.h: the whole remat API (namespace remat).
//
//   checkpoint, checkpoint_sequential, CheckpointOptions   remat/checkpoint.h
//   SavedTensorHooks, install_engine remat/saved_tensor_hooks.h MemoryMeter
//   remat/memory_meter.h the torch-free planner (namespace remat::planner)
//   remat/planner.h
#pragma once

#include "remat/checkpoint.h"
#include "remat/memory_meter.h"
#include "remat/saved_tensor_hooks.h"
#include "remat/profile.h"
#include "remat/planned_sequential.h"
