// dynamic.cpp: remat::DynamicRemat, the scope: its checks, the saved-tensor
// hooks it pushes and the dispatcher fallback it enables. NOTE: [Dynamic
// rematerialization] in runtime.h says how the runtime works.
#include "remat/dynamic.h"

#include <optional>
#include <utility>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>
#include <torch/library.h>

#include "checkpoint/hook_stack.h"
#include "compat/compat.h"
#include "remat/checkpoint.h"
#include "runtime.h"

namespace remat {
namespace detail {
namespace {

/// The runtime of the scope open on this thread, if any.
thread_local DynamicRuntime* tls_runtime = nullptr;

/// The hooks of one saved tensor: the tracked value, or the tensor itself
/// when it is not tracked.
class DynamicHooks final : public torch::autograd::SavedVariableHooks {
 public:
  explicit DynamicHooks(std::shared_ptr<DynamicRuntime> runtime)
      : runtime_(std::move(runtime)) {}
  ~DynamicHooks() override {
    runtime_->release(*saved_);
  }

  void call_pack_hook(const at::Tensor& tensor) override {
    // Autograd checks saved versions only without hooks: done here, as it
    // would (a recomputation would otherwise hide the write).
    version_counter_ = tensor.unsafeGetTensorImpl()->version_counter();
    saved_version_ = version_of(tensor);
    runtime_->pack(tensor, saved_);
  }
  at::Tensor call_unpack_hook() override {
    if (version_counter_.enabled()) {
      const auto version =
          static_cast<int64_t>(version_counter_.current_version());
      TORCH_CHECK(
          version == saved_version_,
          "remat::DynamicRemat: one of the variables needed for gradient "
          "computation has been modified by an inplace operation: saved at "
          "version ",
          saved_version_,
          ", now at version ",
          version);
    }
    return runtime_->unpack(*saved_);
  }

 private:
  std::shared_ptr<DynamicRuntime> runtime_;
  // Shared with the frame of the call that saved it until that call returns.
  std::shared_ptr<DynamicSaved> saved_ = std::make_shared<DynamicSaved>();
  c10::VariableVersion version_counter_;  // disabled until a pack
  int64_t saved_version_ = 0;
};

class DynamicHookFactory final : public HookFactory {
 public:
  explicit DynamicHookFactory(std::shared_ptr<DynamicRuntime> runtime)
      : runtime_(std::move(runtime)) {}
  std::unique_ptr<torch::autograd::SavedVariableHooks> make_hooks() override {
    return std::make_unique<DynamicHooks>(runtime_);
  }

 private:
  std::shared_ptr<DynamicRuntime> runtime_;
};

/// True inside a kernel (autograd keys excluded): calls made there are the
/// kernel's own, not operators of the scope.
bool below_autograd() {
  return c10::impl::tls_local_dispatch_key_set().excluded_.has(
      c10::DispatchKey::AutogradFunctionality);
}

void intercept_call(
    const c10::OperatorHandle& op,
    c10::DispatchKeySet keys,
    torch::jit::Stack* stack) {
  const c10::DispatchKeySet below =
      keys &
      c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, compat::kDynamicKey);
  if (tls_runtime == nullptr || below_autograd() ||
      !c10::GradMode::is_enabled()) {
    op.redispatchBoxed(below, stack);
    return;
  }
  tls_runtime->record_call(op, below, stack);
}

DynamicRematOptions checked(DynamicRematOptions options) {
  TORCH_CHECK(
      options.budget_bytes() > 0,
      "remat::DynamicRemat: expected budget_bytes > 0, got ",
      options.budget_bytes());
  TORCH_CHECK(
      tls_runtime == nullptr,
      "remat::DynamicRemat: a DynamicRemat scope is already open on this "
      "thread; nested scopes are not supported");
  TORCH_CHECK(
      !hook_stack_active() && !is_recomputing(),
      "remat::DynamicRemat: cannot open inside a checkpoint region or under "
      "other saved-tensor hooks (SavedTensorHooks, SaveOnCpu, ...); open the "
      "scope outside them");
  const compat::AutocastState autocast = compat::AutocastState::capture();
  TORCH_CHECK(
      !autocast.cpu_enabled && !autocast.cuda_enabled,
      "remat::DynamicRemat: autocast is enabled; dynamic rematerialization "
      "does not support mixed precision");
  return options;
}

}  // namespace

/// What an open scope changes on its thread, undone in reverse order.
class DynamicScopeState {
 public:
  explicit DynamicScopeState(const std::shared_ptr<DynamicRuntime>& runtime)
      : hooks_(std::make_shared<DynamicHookFactory>(runtime)),
        include_(c10::DispatchKeySet(compat::kDynamicKey)) {
    tls_runtime = runtime.get();
  }
  ~DynamicScopeState() {
    tls_runtime = nullptr;
  }
  DynamicScopeState(const DynamicScopeState&) = delete;
  DynamicScopeState& operator=(const DynamicScopeState&) = delete;

 private:
  HookStackGuard hooks_;
  c10::impl::IncludeDispatchKeyGuard include_;
};

}  // namespace detail

DynamicRemat::DynamicRemat(DynamicRematOptions options)
    : options_(detail::checked(options)),
      runtime_(
          std::make_shared<detail::DynamicRuntime>(options_.budget_bytes())),
      state_(std::make_unique<detail::DynamicScopeState>(runtime_)) {}

DynamicRemat::~DynamicRemat() {
  state_.reset();
  runtime_->close();
}

DynamicRematStats DynamicRemat::stats() const {
  return runtime_->stats();
}

const DynamicRematOptions& DynamicRemat::options() const {
  return options_;
}

}  // namespace remat

TORCH_LIBRARY_IMPL(_, REMAT_DYNAMIC_DISPATCH_KEY, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<
             &remat::detail::intercept_call>());
}
