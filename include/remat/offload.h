// remat/offload.h: saved activations moved out of the memory they were made
// in until backward needs them, to host memory (SaveOnCpu) or to a file
// (SaveToFile).
//
// Both are saved-tensor hooks (remat/saved_tensor_hooks.h) behind an RAII
// guard: every tensor autograd saves on this thread while the guard lives is
// moved out at save time and brought back during backward. Backward asks for
// saved tensors roughly in the reverse order of saving, so when one is asked
// for, the next `prefetch` ones are fetched in the background, and their
// copies overlap backward's compute. Exact: the tensors come back bit for bit
// with their shape and dtype (and their strides where they are dense; a
// non-dense tensor comes back as a contiguous copy of its values, a
// conjugate or negative view as its resolved values), so gradients equal the
// plain run's.
//
// Never moved: parameters and views of parameters (every leaf that requires
// grad; alive anyway), tensors that repeat elements of their storage (a
// stride-0 dimension: expand, broadcasting; a copy would hold every
// repetition), tensors under `min_bytes`, and tensors a guard does not
// handle (SaveOnCpu moves CUDA tensors, SaveToFile CPU tensors). A tensor
// saved twice is moved once. Inside a checkpointed region the region's own
// hooks take precedence, so the two combine: a guard around a model whose
// blocks are checkpointed offloads what is saved outside the regions (the
// regions' inputs included), and recomputation stays in memory.
//
// Moved tensors live as long as autograd holds them (until the backward that
// uses them, or until the graph is freed), even after the guard is gone.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <torch/arg.h>

#include "remat/saved_tensor_hooks.h"

namespace remat {
namespace detail {
class Offloader;
}  // namespace detail

/// What an offload guard has done since it was made (a snapshot).
struct OffloadStats {
  int64_t tensors_moved = 0;    ///< distinct saved tensors handed to the
                                ///< store (SaveToFile: the write_failures
                                ///< among them stayed in memory)
  int64_t bytes_moved = 0;      ///< their bytes
  int64_t tensors_left = 0;     ///< saves left in place (see the top)
  int64_t fetches = 0;          ///< tensors brought back (demand + prefetch)
  int64_t prefetch_hits = 0;    ///< unpacks that found their fetch started
  int64_t write_failures = 0;   ///< SaveToFile: writes that failed; those
                                ///< tensors stayed in memory instead
  int64_t peak_file_bytes = 0;  ///< SaveToFile: largest extent of the file
                                ///< handed out to writes (failed ones
                                ///< included: what was asked of the disk)
};

/// Options of SaveOnCpu.
struct SaveOnCpuOptions {
  /// Copy into page-locked (pinned) host memory, which copies asynchronously
  /// and faster. Default: true.
  TORCH_ARG(bool, pin_memory) = true;
  /// Saved tensors fetched ahead of the one backward asks for. Default: 2.
  TORCH_ARG(int64_t, prefetch) = 2;
  /// Tensors with fewer bytes stay on the device. Default: 0 (all move).
  TORCH_ARG(int64_t, min_bytes) = 0;
};

/// RAII guard, the twin of `torch.autograd.graph.save_on_cpu`: saved CUDA
/// tensors of this thread go to host memory, copied on a side stream of
/// their device, and come back to the device on that stream during backward,
/// prefetched. CPU tensors stay where they are (a CPU-only run saves as
/// usual and counts them in `tensors_left`).
///
/// Example:
// clang-format off
///   {
///     remat::SaveOnCpu offload;                 // device activations to host
///     loss = model->forward(x).sum();
///   }
///   loss.backward();                            // fetched back, ahead of use
// clang-format on
///
/// Throws c10::Error if prefetch < 0 or min_bytes < 0, or (from
/// install_engine) if another autograd engine is installed; from backward,
/// as plain autograd, if a saved tensor was modified in place since it was
/// saved.
class SaveOnCpu {
 public:
  explicit SaveOnCpu(SaveOnCpuOptions options = {});
  ~SaveOnCpu();
  SaveOnCpu(const SaveOnCpu&) = delete;
  SaveOnCpu& operator=(const SaveOnCpu&) = delete;

  /// What this guard has moved and fetched so far.
  OffloadStats stats() const;

 private:
  std::shared_ptr<detail::Offloader> offloader_;
  std::unique_ptr<SavedTensorHooks> hooks_;
};

/// Options of SaveToFile.
struct SaveToFileOptions {
  /// Folder of the spill file. Default: "" ($TMPDIR if set, else /var/tmp).
  /// The file is unnamed (or unlinked at once): nothing is left behind.
  TORCH_ARG(std::string, directory) = "";
  /// Saved tensors read ahead of the one backward asks for. Default: 2.
  TORCH_ARG(int64_t, prefetch) = 2;
  /// Tensors with fewer bytes stay in memory. Default: 64 KiB.
  TORCH_ARG(int64_t, min_bytes) = 64 * 1024;
  /// Bytes handed to the writer and not yet written; a save that would pass
  /// this waits for the writer, which bounds the memory still held by
  /// pending writes. Default: 256 MiB.
  TORCH_ARG(int64_t, max_pending_bytes) = int64_t{256} << 20;
};

/// RAII guard: saved CPU tensors of this thread are written to a file by a
/// background thread, and read back by it during backward, prefetched; the
/// memory they held is free in between. File space is reused once every
/// tensor the guard moved has been released (after each backward), and the
/// file goes when the guard and its last moved tensor are gone. A write that
/// fails (a full disk) keeps that tensor in memory and counts it in
/// `write_failures`; a read that fails throws from backward.
///
/// Example:
// clang-format off
///   {
///     remat::SaveToFile spill(remat::SaveToFileOptions().directory("/scratch"));
///     loss = model->forward(x).sum();           // activations go to the file
///   }
///   loss.backward();                            // read back, ahead of use
// clang-format on
///
/// Throws c10::Error if an option is negative (max_pending_bytes must be
/// positive), if the file cannot be created in `directory` (naming it and
/// the reason), or (from install_engine) if another autograd engine is
/// installed; from backward, as plain autograd, if a saved tensor was
/// modified in place since it was saved.
class SaveToFile {
 public:
  explicit SaveToFile(SaveToFileOptions options = {});
  ~SaveToFile();
  SaveToFile(const SaveToFile&) = delete;
  SaveToFile& operator=(const SaveToFile&) = delete;

  /// What this guard has written and read so far.
  OffloadStats stats() const;

 private:
  std::shared_ptr<detail::Offloader> offloader_;
  std::unique_ptr<SavedTensorHooks> hooks_;
};

}  // namespace remat
