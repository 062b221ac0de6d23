// remat/remat.h: the whole remat API (namespace remat).
//
// remat/checkpoint.h          checkpoint, checkpoint_sequential, options
// remat/saved_tensor_hooks.h  SavedTensorHooks, install_engine
// remat/policy.h              CheckpointPolicy, policies (selective)
// remat/compress.h            CompressActivations (saved in bf16/fp16/int8)
// remat/offload.h             SaveOnCpu, SaveToFile (saved to host or a file)
// remat/dynamic.h             DynamicRemat (saved tensors under a byte budget,
//                             recomputed on demand; no stages, no plan)
// remat/memory_meter.h        MemoryMeter, install_tracking_allocator
// remat/measure/step.h        measure_step (one training step's activation
//                             peak and times), zero_gradients
// remat/precision.h           Precision, AutocastGuard (mixed precision)
// remat/profile.h             profile_chain
// remat/stage.h               Stage (one block of any chain), stages_of
// remat/planned_chain.h       PlannedChain, auto_checkpoint, plan_within
// remat/planned_sequential.h  PlannedSequential, auto_checkpoint
// remat/graph.h               GraphStage, profile_graph, PlannedGraph,
//                             auto_checkpoint and plan_within on graphs
// remat/fit.h                 fit_batch, fit_size (largest size under a cap)
// remat/budget.h              Budget (bytes, a percentage, or none)
// remat/planner.h             the torch-free planner (remat::planner)
// remat/distributed.h         ProcessGroup, GradientSync, ShardedStages,
//                             launch_local (when REMAT_WITH_DISTRIBUTED)
// remat/config.h              how this remat was built
#pragma once

#include "remat/budget.h"
#include "remat/checkpoint.h"
#include "remat/compress.h"
#include "remat/config.h"
#include "remat/dynamic.h"
#include "remat/fit.h"
#include "remat/graph.h"
#include "remat/measure/step.h"
#include "remat/memory_meter.h"
#include "remat/offload.h"
#include "remat/planned_chain.h"
#include "remat/planned_sequential.h"
#include "remat/planner.h"
#include "remat/policy.h"
#include "remat/precision.h"
#include "remat/profile.h"
#include "remat/saved_tensor_hooks.h"
#include "remat/stage.h"

#if REMAT_WITH_DISTRIBUTED
#include "remat/distributed.h"
#endif
