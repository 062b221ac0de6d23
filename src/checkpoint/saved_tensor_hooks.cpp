// saved_tensor_hooks.cpp: remat's autograd engine and the thread-local hook
// stack behind `SavedTensorHooks` and non-reentrant `checkpoint`.
//
// NOTE: [Engine swap]
// `SavedVariable` asks
// `Engine::get_default_engine().get_default_saved_variable_hooks()` for hooks
// whenever a tensor is saved. The base engine answers nullptr; ours answers
// from the thread-local stack below. `set_default_engine_stub` makes ours the
// default engine. The swap happens once, under std::call_once, and is refused
// if the default engine is neither the base engine nor ours (Python's engine
// installs itself the same way, and the two cannot coexist).
#include "remat/saved_tensor_hooks.h"

#include <mutex>
#include <vector>

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/engine.h>

#include "hook_stack.h"
#include "selective/selective.h"

namespace remat {
namespace detail {
namespace {

using torch::autograd::Engine;
using torch::autograd::SavedVariableHooks;

/// The stack of hook factories of this thread; entries are owned by guards.
std::vector<std::shared_ptr<HookFactory>>& thread_hook_stack() {
  thread_local std::vector<std::shared_ptr<HookFactory>> stack;
  return stack;
}

class RematEngine final : public Engine {
 public:
  RematEngine() = default;
  ~RematEngine() override {
    stop();  // required of Engine subclasses before destruction
  }

  std::unique_ptr<SavedVariableHooks> get_default_saved_variable_hooks()
      override {
    auto& stack = thread_hook_stack();
    if (stack.empty()) {
      return nullptr;
    }
    // Copy the entry: make_hooks() may itself save tensors and push entries.
    std::shared_ptr<HookFactory> top = stack.back();
    return top->make_hooks();
  }
};

Engine& remat_engine() {
  static RematEngine engine;
  return engine;
}

std::once_flag install_once;
bool install_succeeded = false;

}  // namespace

HookStackGuard::HookStackGuard(std::shared_ptr<HookFactory> factory)
    : pushed_(factory.get()) {
  install_engine();
  thread_hook_stack().push_back(std::move(factory));
}

HookStackGuard::~HookStackGuard() {
  auto& stack = thread_hook_stack();
  TORCH_INTERNAL_ASSERT(
      !stack.empty() && stack.back().get() == pushed_,
      "remat: saved-tensor hook guards destroyed out of order");
  stack.pop_back();
}

bool hook_stack_active() {
  return !thread_hook_stack().empty();
}

}  // namespace detail

void install_engine() {
  using torch::autograd::Engine;
  std::call_once(detail::install_once, [] {
    Engine& current = Engine::get_default_engine();
    if (&current != &Engine::get_base_engine()) {
      return;  // another engine: install_succeeded stays false
    }
    torch::autograd::set_default_engine_stub(&detail::remat_engine);
    detail::install_succeeded = true;
  });
  TORCH_CHECK(
      detail::install_succeeded,
      "remat::install_engine: another autograd engine is already installed in "
      "this process (for example PyTorch's Python engine), so C++ saved-tensor "
      "hooks and non-reentrant checkpointing are unavailable; use "
      "remat::Mode::kReentrant instead");
}

bool engine_installed() {
  return &torch::autograd::Engine::get_default_engine() ==
         &detail::remat_engine();
}

namespace {

/// Hooks of one saved tensor under a user `SavedTensorHooks` guard.
class UserHooks final : public torch::autograd::SavedVariableHooks {
 public:
  UserHooks(
      std::shared_ptr<const SavedTensorHooks::PackHook> pack,
      std::shared_ptr<const SavedTensorHooks::UnpackHook> unpack)
      : pack_(std::move(pack)), unpack_(std::move(unpack)) {}

  // A hook's own operators are not operators of an enclosing region with a
  // policy: they depend on the hook's state (an offload guard packs a tensor
  // saved twice once, NOTE: [One copy per saved tensor]), and a kept call
  // does not run its pack hooks in the recomputation, so the calls the
  // region sees around them would differ between the forward and the
  // recomputation. Suspended as a nested checkpoint region suspends it
  // (NOTE: [Selective checkpointing]); a region the hook itself runs
  // intercepts its own operators as usual.
  void call_pack_hook(const at::Tensor& tensor) override {
    const detail::SelectiveScope suspend_selective(nullptr, nullptr);
    packed_ = (*pack_)(tensor);
  }
  at::Tensor call_unpack_hook() override {
    const detail::SelectiveScope suspend_selective(nullptr, nullptr);
    return (*unpack_)(packed_);
  }

 private:
  std::shared_ptr<const SavedTensorHooks::PackHook> pack_;
  std::shared_ptr<const SavedTensorHooks::UnpackHook> unpack_;
  std::any packed_;
};

class UserHookFactory final : public detail::HookFactory {
 public:
  UserHookFactory(
      SavedTensorHooks::PackHook pack, SavedTensorHooks::UnpackHook unpack)
      : pack_(std::make_shared<const SavedTensorHooks::PackHook>(
            std::move(pack))),
        unpack_(std::make_shared<const SavedTensorHooks::UnpackHook>(
            std::move(unpack))) {}

  std::unique_ptr<torch::autograd::SavedVariableHooks> make_hooks() override {
    return std::make_unique<UserHooks>(pack_, unpack_);
  }

 private:
  std::shared_ptr<const SavedTensorHooks::PackHook> pack_;
  std::shared_ptr<const SavedTensorHooks::UnpackHook> unpack_;
};

std::shared_ptr<detail::HookFactory> make_user_factory(
    SavedTensorHooks::PackHook pack, SavedTensorHooks::UnpackHook unpack) {
  TORCH_CHECK(pack, "remat::SavedTensorHooks: expected a pack hook, got none");
  TORCH_CHECK(
      unpack, "remat::SavedTensorHooks: expected an unpack hook, got none");
  return std::make_shared<UserHookFactory>(std::move(pack), std::move(unpack));
}

}  // namespace

SavedTensorHooks::SavedTensorHooks(PackHook pack, UnpackHook unpack)
    : guard_(std::make_unique<detail::HookStackGuard>(
          make_user_factory(std::move(pack), std::move(unpack)))) {}

SavedTensorHooks::~SavedTensorHooks() = default;

}  // namespace remat
