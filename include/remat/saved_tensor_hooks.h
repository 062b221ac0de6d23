// remat/saved_tensor_hooks.h: C++ saved-tensor hooks, the twin of Python's
// `torch.autograd.graph.saved_tensors_hooks`.
//
// Every tensor that autograd saves for backward while a `SavedTensorHooks`
// guard is alive on the current thread is handed to the guard's pack hook;
// whatever the pack hook returns is stored in place of the tensor, and the
// unpack hook turns it back into a tensor when backward needs it. Guards nest
// (the innermost wins) and are thread-local.
//
// How: LibTorch keeps only Python hooks in its ambient hook stack, but every
// saved variable asks the autograd engine for default hooks through a virtual
// method. remat installs an engine subclass (once per process, on first use)
// that answers from a thread-local stack of C++ hooks. Only one engine can be
// installed per process: if another one is already there (Python's, when
// LibTorch is loaded from Python), installation fails with a clear error. The
// reentrant checkpoint mode does not need the engine and works regardless.
#pragma once

#include <any>
#include <functional>
#include <memory>

#include <ATen/core/Tensor.h>

namespace remat {
namespace detail {
class HookStackGuard;
}  // namespace detail

/// Installs remat's autograd engine (idempotent, thread-safe). Called
/// automatically by `SavedTensorHooks` and non-reentrant `checkpoint`; call it
/// at start-up to choose the moment yourself.
/// Throws c10::Error if another autograd engine (for example PyTorch's Python
/// engine) is already installed in this process.
void install_engine();

/// True if remat's engine is the process's default autograd engine.
bool engine_installed();

/// RAII guard: while alive, saved tensors of autograd ops run on this thread
/// go through `pack` at save time and `unpack` at backward time.
///
/// Example (CPU offload of every saved tensor):
// clang-format off
///
///   remat::SavedTensorHooks offload(
///       [](const torch::Tensor& t) -> std::any {
///         return t.detach().to(torch::kCPU);
///       },
///       [](const std::any& p) { return std::any_cast<torch::Tensor>(p); });
///   auto loss = model->forward(x).sum();   // saved tensors packed
///   // guard may end here; unpack runs during backward
///   loss.backward();
// clang-format on
///
/// Contract: `pack` runs with grad mode off and must not modify its argument
/// in place; `unpack` may run several times (backward with retain_graph), on
/// another thread (CUDA backward), and must return a tensor with the saved
/// tensor's shape, dtype and device. Hooks are copied into every saved
/// variable's state, so captured state must outlive backward. What `pack`
/// stores should hold no autograd graph: storing its argument itself (or
/// t.to(kCPU) of a CPU tensor, which is t) makes an output saved by its own
/// op (exp, sigmoid) hold its own node, so a forward whose backward never
/// runs is never freed; store t.detach() (autograd gives unpack's result its
/// graph back). Guards must be destroyed in reverse order of construction on
/// their thread; another order ends the process (std::terminate).
/// Throws c10::Error (from install_engine) if another engine is installed.
class SavedTensorHooks {
 public:
  using PackHook = std::function<std::any(const at::Tensor&)>;
  using UnpackHook = std::function<at::Tensor(const std::any&)>;

  SavedTensorHooks(PackHook pack, UnpackHook unpack);
  ~SavedTensorHooks();
  SavedTensorHooks(const SavedTensorHooks&) = delete;
  SavedTensorHooks& operator=(const SavedTensorHooks&) = delete;

 private:
  std::unique_ptr<detail::HookStackGuard> guard_;
};

}  // namespace remat
