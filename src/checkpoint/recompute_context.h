// recompute_context.h (private): what a recomputation must reproduce, and the
// guard that reproduces it.
//
// NOTE: [Recompute and RNG]
// A checkpointed region runs twice: once in forward, once in backward. For the
// two runs to be the same computation (dropout masks included), the second
// must start from the RNG state the first started from. `RecomputeContext`
// captures, at forward time, the CPU generator's state and the state of the
// CUDA generator of every device among the region's inputs, plus the autocast
// state. `RecomputeGuard` installs them for the recomputation and restores the
// ambient RNG and autocast state afterwards, even on error, so user code after
// backward sees the RNG stream as if no recomputation had happened.
//
// NOTE: [Recompute and module state]
// Recomputing a region that runs BatchNorm in training mode would update its
// running statistics a second time. `RecomputeGuard` copies the buffers of the
// modules named in CheckpointOptions::preserve_buffers_of before the
// recomputation and copies them back afterwards (even on error). Where the
// first forward was watched (BufferWrites, as the plan executor does for
// each stage), only the buffers of the submodules whose buffers that forward
// wrote are copied: a BatchNorm's statistics, not a model's constant causal
// mask of seq_len^2 bytes, which a copy at every recomputation would add to
// the peak for nothing. A submodule counts as written when the version
// counter of any of its own buffers moved (num_batches_tracked moves with a
// BatchNorm's statistics); all of its own buffers are then copied.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>

#include "compat/compat.h"

namespace remat::detail {

/// The submodules of `modules` (recursively, each once) with the version of
/// each of their own buffers at construction; written() names those with a
/// buffer whose version has moved since (NOTE: [Recompute and module state]).
class BufferWrites {
 public:
  explicit BufferWrites(
      const std::vector<std::shared_ptr<torch::nn::Module>>& modules);
  std::vector<std::shared_ptr<torch::nn::Module>> written() const;

 private:
  struct Watched {
    std::shared_ptr<torch::nn::Module> module;
    std::vector<std::pair<at::Tensor, int64_t>> versions;
  };
  std::vector<Watched> watched_;
};

/// The value of `tensor`'s version counter; 0 for a tensor without one (an
/// inference tensor, which has nothing to recompute).
inline int64_t version_of(const at::Tensor& tensor) {
  const c10::VariableVersion& counter =
      tensor.unsafeGetTensorImpl()->version_counter();
  return counter.enabled() ? static_cast<int64_t>(counter.current_version())
                           : 0;
}

/// The bytes of the own (non-recursive) buffers of `modules`.
int64_t own_buffer_bytes(
    const std::vector<std::shared_ptr<torch::nn::Module>>& modules);

// NOTE: [Recompute and module mode]
// A recomputation must compute what the first forward computed. Besides the
// RNG, autocast and buffers, two things a caller may change between forward
// and backward are not state LibTorch replays: the training flags of the
// region's modules and their submodules (model->eval() to log a validation
// loss before backward: a Dropout or BatchNorm recomputed in the other mode
// gives another output, and silently wrong gradients), and the parameters'
// values (an optimizer step or an EMA update in place before backward: plain
// autograd computes from what it saved, a recomputation would read the new
// values). A ModuleMode records both at the first forward; a recomputation
// runs under the recorded flags (restoring the caller's afterwards) and
// refuses parameters changed in place since.
class ModuleMode {
 public:
  /// Records the training flags of `modules` and all their submodules, and
  /// the versions of their parameters (null entries are skipped).
  explicit ModuleMode(
      const std::vector<std::shared_ptr<torch::nn::Module>>& modules);

  /// Throws c10::Error, naming `who` and `whose` ("stage 3's module"), if a
  /// parameter was modified in place since the record.
  void check_parameters(const char* who, const std::string& whose) const;

  /// RAII: the recorded training flags while alive, the caller's after.
  class Replay {
   public:
    explicit Replay(const ModuleMode& mode);
    ~Replay();
    Replay(const Replay&) = delete;
    Replay& operator=(const Replay&) = delete;

   private:
    using Flags =
        std::vector<std::pair<std::shared_ptr<torch::nn::Module>, bool>>;
    static void set(const Flags& flags);
    Flags ambient_;
  };

 private:
  std::vector<std::pair<std::shared_ptr<torch::nn::Module>, bool>> training_;
  std::vector<std::pair<at::Tensor, int64_t>> versions_;
};

/// The state a recomputation replays, captured at forward time.
class RecomputeContext {
 public:
  /// Captures RNG state (if `preserve_rng`) for CPU and the CUDA devices of
  /// `inputs`, the autocast state, and the module mode of `modules` (none if
  /// empty; NOTE: [Recompute and module mode]).
  RecomputeContext(
      const torch::autograd::variable_list& inputs,
      bool preserve_rng,
      const std::vector<std::shared_ptr<torch::nn::Module>>& modules = {});

  /// After the first forward: its recomputations copy only the buffers of
  /// `writes.written()` (NOTE: [Recompute and module state]).
  void note_buffer_writes(const BufferWrites& writes);

  /// Throws c10::Error as ModuleMode::check_parameters if a parameter of the
  /// noted modules was modified in place since; nothing without a mode.
  void check_parameters(const char* who, const std::string& whose) const;

 private:
  friend class RecomputeGuard;
  // States are kept as plain memory, never as tensors, and are captured and
  // restored without making one: a tensor would be counted by the tracking
  // allocator (5 KiB per CPU generator, get_state()'s transient) and show as
  // a peak the memory model does not have, at the first forward of a planned
  // stage or at a recomputation (NOTE: [Plan execution] in
  // plan_executor.cpp). The CPU generator's engine is copied as it is; other
  // generators (CUDA: 16 bytes of seed and offset) go through get_state().
  struct GeneratorState {
    at::Generator generator;
    std::optional<at::mt19937> cpu_engine;  // CPU generators
    decltype(std::declval<at::CPUGeneratorImpl&>()
                 .next_float_normal_sample()) cpu_float_sample;
    decltype(std::declval<at::CPUGeneratorImpl&>()
                 .next_double_normal_sample()) cpu_double_sample;
    std::vector<uint8_t> state_bytes;  // other generators
  };
  static GeneratorState capture(const at::Generator& generator);
  static void restore(GeneratorState& saved);
  std::vector<GeneratorState> rng_states_;
  compat::AutocastState autocast_;
  // Set by note_buffer_writes: the submodules whose own buffers are copied.
  std::optional<std::vector<std::shared_ptr<torch::nn::Module>>> written_;
  // The module mode of the constructor's modules, if any.
  std::optional<ModuleMode> module_mode_;
};

/// RAII: for the lifetime of the guard, this thread recomputes a region:
/// RNG and autocast state as in `replay`, grad mode on, is_recomputing()
/// true, buffers of `modules` saved (and restored at the end; null entries
/// are skipped), the training flags of replay's module mode if it has one
/// (the caller's restored at the end). Counts as an autocast region (autocast's
/// nesting depth): if it is the outermost one, the cast cache is cleared when
/// it ends.
class RecomputeGuard {
 public:
  RecomputeGuard(
      const RecomputeContext& replay,
      const std::vector<std::shared_ptr<torch::nn::Module>>& modules);
  ~RecomputeGuard();
  RecomputeGuard(const RecomputeGuard&) = delete;
  RecomputeGuard& operator=(const RecomputeGuard&) = delete;

 private:
  std::vector<RecomputeContext::GeneratorState> ambient_rng_;
  compat::AutocastState ambient_autocast_;
  c10::AutoGradMode grad_mode_{true};
  std::vector<std::pair<at::Tensor, at::Tensor>> buffer_backups_;
  std::optional<ModuleMode::Replay> module_mode_;
};

/// RAII: autocast's cast cache is off for the guard's lifetime (the rest of
/// the autocast state is untouched). For a region's first forward when it
/// runs with grad mode off: a cast cached there has no gradient history, and
/// a recomputation under the same autocast region would reuse it, so the
/// parameters behind it would get no gradient (LibTorch 1.13, checked).
class UncachedAutocast {
 public:
  UncachedAutocast();
  ~UncachedAutocast();
  UncachedAutocast(const UncachedAutocast&) = delete;
  UncachedAutocast& operator=(const UncachedAutocast&) = delete;

 private:
  bool was_enabled_;
};

/// Detached copies of `inputs` with each one's requires_grad preserved: the
/// leaves a recomputation starts from.
torch::autograd::variable_list detach_inputs(
    const torch::autograd::variable_list& inputs);

}  // namespace remat::detail
