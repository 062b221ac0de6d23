// hook_stack.h (private): the thread-local stack of C++ saved-variable hooks
// consulted by remat's autograd engine.
//
// Each entry is a factory: the engine asks the top entry for a fresh
// `SavedVariableHooks` object for every tensor autograd saves. Public
// `SavedTensorHooks` guards and checkpoint frames both push entries here.
// Invariant: pushes and pops on a thread are strictly nested (RAII only).
#pragma once

#include <memory>

#include <torch/csrc/autograd/saved_variable_hooks.h>

namespace remat::detail {

/// Makes the per-saved-tensor hook object for one stack entry.
class HookFactory {
 public:
  virtual ~HookFactory() = default;
  virtual std::unique_ptr<torch::autograd::SavedVariableHooks> make_hooks() = 0;
};

/// Pushes `factory` on this thread's stack for the guard's lifetime.
/// Installs remat's engine first (throws if another engine is installed).
class HookStackGuard {
 public:
  explicit HookStackGuard(std::shared_ptr<HookFactory> factory);
  ~HookStackGuard();
  HookStackGuard(const HookStackGuard&) = delete;
  HookStackGuard& operator=(const HookStackGuard&) = delete;

 private:
  HookFactory* pushed_;
};

/// True while this thread has an entry on the stack (a SavedTensorHooks
/// guard, a checkpoint region, an offload guard, a dynamic scope).
bool hook_stack_active();

}  // namespace remat::detail
