// remat/distributed.h: data-parallel training over c10d (Gloo, CPU).
//
// Every process (a "rank") holds a full copy of the model, runs forward and
// backward on its own slice of the global batch, and averages the parameter
// gradients with the other ranks before the optimizer step, so that every
// rank takes the same step as one process on the whole batch would (when the
// loss is a mean over the batch and the slices are equal).
//
//  - ProcessGroup: joins a group of `world_size` ranks. Rank 0 hosts a
//    c10d::TCPStore at master_addr:master_port for the rendezvous; the
//    collectives run on c10d's Gloo backend over TCP. Options come from the
//    environment torchrun sets (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
//    or are given explicitly.
//  - GradientSync: hooks on the parameters copy each gradient into a flat
//    bucket buffer as backward produces it and start the bucket's allreduce
//    as soon as the bucket is complete, overlapping communication with the
//    rest of backward; finish() completes the step.
//  - ShardedStages: sharded (FSDP / ZeRO-3 style) training of a chain of
//    stages: each rank keeps a shard of every stage's parameters, of their
//    gradients and (through its optimizer) of the optimizer state; a stage's
//    parameters are all-gathered for each of its forwards and for its
//    backward only, and its gradients are reduce-scattered into the shards.
//  - launch_local: runs N workers of one program on this machine (what
//    `remat train --nproc N` does).
//
// Every rank must make the same calls in the same order (one group, one
// GradientSync or ShardedStages per model, the same model and the same
// checkpointing). Not supported yet: CUDA tensors and NCCL, sparse gradients,
// several groups sharing a port. See docs/distributed.md.
#pragma once

#include "remat/distributed/gradient_sync.h"
#include "remat/distributed/launch.h"
#include "remat/distributed/process_group.h"
#include "remat/distributed/sharded_stages.h"
