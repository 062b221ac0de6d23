// remat/measure/cpu_memory.h — keeping the memory that CPU tensors free inside
// the process, so that a training step does not fault its pages in again.
//
// A step on the CPU allocates and frees the same activations every step. With
// glibc's default settings, blocks of 128 KiB and more (or of the largest size
// freed so far, up to 32 MiB) are mapped from the kernel and unmapped when
// freed, and free memory at the top of the heap is handed back: the next step
// maps it again, and the kernel zeroes every page before the step writes it.
// Keeping freed memory in the process made the `remat` tool's U-Net steps
// 16 % faster, the ResNet's 6 %, and left the GPT's unchanged
// (docs/planned_execution.md, "The C library's allocator"); every benchmark
// of docs/benchmarks.md measures with it. The `remat` tool calls
// keep_freed_cpu_memory() at start; a program of your own may call it first
// thing in main().
//
// The cost: the process keeps the highest memory a step reached (the pages it
// touched) until it exits, as a caching allocator does on a GPU.
#pragma once

#include <string>

namespace remat::measure {

/// Makes glibc's malloc keep freed memory in the process: blocks of up to
/// 1 GiB come from the heap (M_MMAP_THRESHOLD), up to 1 GiB of free memory at
/// the heap's top is kept (M_TRIM_THRESHOLD), and the heap grows 256 MiB at a
/// time (M_TOP_PAD). Process-wide and lasting; affects only allocations made
/// after the call. Returns true if every setting was taken; false on a C
/// library other than glibc (nothing changed) or if glibc refused one. Never
/// throws.
bool keep_freed_cpu_memory();

/// The same settings as the value of the GLIBC_TUNABLES environment variable,
/// for a process you start (glibc reads it at the start of that process):
/// "glibc.malloc.mmap_threshold=...:glibc.malloc.trim_threshold=...:
/// glibc.malloc.top_pad=...".
std::string keep_freed_cpu_memory_tunables();

}  // namespace remat::measure
