// recompute_context.cpp: capture and replay of RNG, autocast and module-buffer
// state around recomputation. See NOTE: [Recompute and RNG] and NOTE:
// [Recompute and module state] in recompute_context.h.
#include "recompute_context.h"

#include <algorithm>

#include <ATen/Context.h>
#include <ATen/Functions.h>
#include <ATen/autocast_mode.h>
#include <torch/nn/module.h>

#include "remat/checkpoint.h"

namespace remat {
namespace detail {
namespace {

thread_local int recompute_depth = 0;

at::Generator mutable_generator(c10::Device device) {
  // defaultGenerator returns a const handle; a copy shares the generator.
  return at::globalContext().defaultGenerator(device);
}

}  // namespace

BufferWrites::BufferWrites(
    const std::vector<std::shared_ptr<torch::nn::Module>>& modules) {
  std::vector<const torch::nn::Module*> seen;
  for (const auto& module : modules) {
    if (!module) {
      continue;
    }
    for (const auto& sub : module->modules(/*include_self=*/true)) {
      if (std::find(seen.begin(), seen.end(), sub.get()) != seen.end()) {
        continue;
      }
      seen.push_back(sub.get());
      Watched watched{sub, {}};
      for (const auto& buffer : sub->buffers(/*recurse=*/false)) {
        watched.versions.emplace_back(buffer, buffer._version());
      }
      if (!watched.versions.empty()) {
        watched_.push_back(std::move(watched));
      }
    }
  }
}

std::vector<std::shared_ptr<torch::nn::Module>> BufferWrites::written() const {
  std::vector<std::shared_ptr<torch::nn::Module>> written;
  for (const Watched& watched : watched_) {
    for (const auto& [buffer, version] : watched.versions) {
      if (buffer._version() != version) {
        written.push_back(watched.module);
        break;
      }
    }
  }
  return written;
}

int64_t own_buffer_bytes(
    const std::vector<std::shared_ptr<torch::nn::Module>>& modules) {
  int64_t bytes = 0;
  for (const auto& module : modules) {
    for (const auto& buffer : module->buffers(/*recurse=*/false)) {
      bytes += static_cast<int64_t>(buffer.nbytes());
    }
  }
  return bytes;
}

ModuleMode::ModuleMode(
    const std::vector<std::shared_ptr<torch::nn::Module>>& modules) {
  for (const auto& module : modules) {
    if (!module) {
      continue;
    }
    for (const auto& each : module->modules(/*include_self=*/true)) {
      training_.emplace_back(each, each->is_training());
    }
    for (const at::Tensor& parameter : module->parameters()) {
      versions_.emplace_back(parameter, version_of(parameter));
    }
  }
}

void ModuleMode::check_parameters(
    const char* who, const std::string& whose) const {
  for (const auto& [parameter, version] : versions_) {
    TORCH_CHECK(
        version_of(parameter) == version,
        who,
        ": a parameter of ",
        whose,
        " was modified in place since the forward (an optimizer step or "
        "another update before backward); it is recomputed during backward, "
        "which would read the new values: update parameters after backward");
  }
}

ModuleMode::Replay::Replay(const ModuleMode& mode) {
  // modules() lists a module before its submodules, so setting each in
  // order leaves every module with its own recorded flag.
  for (const auto& [module, training] : mode.training_) {
    ambient_.emplace_back(module, module->is_training());
  }
  set(mode.training_);
}

ModuleMode::Replay::~Replay() {
  set(ambient_);
}

void ModuleMode::Replay::set(const Flags& flags) {
  for (const auto& [module, training] : flags) {
    if (module->is_training() != training) {
      module->train(training);
    }
  }
}

void RecomputeContext::note_buffer_writes(const BufferWrites& writes) {
  written_ = writes.written();
}

void RecomputeContext::check_parameters(
    const char* who, const std::string& whose) const {
  if (module_mode_) {
    module_mode_->check_parameters(who, whose);
  }
}

RecomputeContext::RecomputeContext(
    const torch::autograd::variable_list& inputs,
    bool preserve_rng,
    const std::vector<std::shared_ptr<torch::nn::Module>>& modules)
    : autocast_(compat::AutocastState::capture()) {
  if (!modules.empty()) {
    module_mode_ = ModuleMode(modules);
  }
  if (!preserve_rng) {
    return;
  }
  std::vector<c10::Device> devices{c10::Device(c10::kCPU)};
  for (const auto& input : inputs) {
    if (input.defined() && input.is_cuda() &&
        std::find(devices.begin(), devices.end(), input.device()) ==
            devices.end()) {
      devices.push_back(input.device());
    }
  }
  for (const auto& device : devices) {
    rng_states_.push_back(capture(mutable_generator(device)));
  }
}

RecomputeContext::GeneratorState RecomputeContext::capture(
    const at::Generator& generator) {
  at::Generator handle = generator;
  std::lock_guard<std::mutex> lock(handle.mutex());
  GeneratorState saved{handle, std::nullopt, {}, {}, {}};
  if (handle.device().is_cpu()) {
    auto* cpu = handle.get<at::CPUGeneratorImpl>();
    saved.cpu_engine = cpu->engine();
    saved.cpu_float_sample = cpu->next_float_normal_sample();
    saved.cpu_double_sample = cpu->next_double_normal_sample();
    return saved;
  }
  const at::Tensor state = handle.get_state().contiguous();
  const auto* begin = state.data_ptr<uint8_t>();
  saved.state_bytes.assign(begin, begin + state.numel());
  return saved;
}

void RecomputeContext::restore(GeneratorState& saved) {
  std::lock_guard<std::mutex> lock(saved.generator.mutex());
  if (saved.cpu_engine) {
    auto* cpu = saved.generator.get<at::CPUGeneratorImpl>();
    cpu->set_engine(*saved.cpu_engine);
    cpu->set_next_float_normal_sample(saved.cpu_float_sample);
    cpu->set_next_double_normal_sample(saved.cpu_double_sample);
    return;
  }
  // from_blob wraps the bytes without allocating.
  saved.generator.set_state(at::from_blob(
      saved.state_bytes.data(),
      {static_cast<int64_t>(saved.state_bytes.size())},
      at::kByte));
}

RecomputeGuard::RecomputeGuard(
    const RecomputeContext& replay,
    const std::vector<std::shared_ptr<torch::nn::Module>>& modules)
    : ambient_autocast_(compat::AutocastState::capture()) {
  // A constructor that throws runs no destructor: everything that can fail
  // (the buffer backups allocate as much as the buffers, an out-of-memory
  // error is a c10::Error) comes before the first change of the thread's or
  // the process's state (RNG, autocast, is_recomputing()). If it throws,
  // the backups are only freed (no buffer was written yet) and a module mode
  // already replayed is put back by its own destructor.
  {
    c10::NoGradGuard no_grad;
    if (replay.written_) {  // NOTE: [Recompute and module state]
      for (const auto& module : *replay.written_) {
        for (auto& buffer : module->buffers(/*recurse=*/false)) {
          buffer_backups_.emplace_back(buffer, buffer.clone());
        }
      }
    } else {
      for (const auto& module : modules) {
        if (!module) {
          continue;  // a parameter-free stage
        }
        for (auto& buffer : module->buffers(/*recurse=*/true)) {
          buffer_backups_.emplace_back(buffer, buffer.clone());
        }
      }
    }
  }
  std::vector<RecomputeContext::GeneratorState> replayed(
      replay.rng_states_.begin(), replay.rng_states_.end());
  ambient_rng_.reserve(replayed.size());
  for (const auto& saved : replayed) {
    ambient_rng_.push_back(RecomputeContext::capture(saved.generator));
  }
  if (replay.module_mode_) {
    module_mode_.emplace(*replay.module_mode_);
  }
  for (auto& saved : replayed) {
    RecomputeContext::restore(saved);
  }
  replay.autocast_.apply();
  // The recomputation is an autocast region of its own, as torch.autocast's
  // context manager around PyTorch's recomputation is: counted in autocast's
  // nesting depth, so that when it runs outside every autocast region
  // (backward after the AutocastGuard ended) the casts it cached are cleared
  // when it ends. Left in the cache they would outlive the step and be
  // reused, stale, by the next step's forward after optimizer.step().
  at::autocast::increment_nesting();
  ++recompute_depth;
}

RecomputeGuard::~RecomputeGuard() {
  --recompute_depth;
  {
    c10::NoGradGuard no_grad;
    for (auto& [buffer, backup] : buffer_backups_) {
      // variable_data() does not bump the version counter: a buffer saved for
      // backward (BatchNorm in eval mode) must not look modified in place.
      buffer.variable_data().copy_(backup);
    }
  }
  if (at::autocast::decrement_nesting() == 0) {
    at::autocast::clear_cache();
  }
  ambient_autocast_.apply();
  for (auto& saved : ambient_rng_) {
    RecomputeContext::restore(saved);
  }
}

UncachedAutocast::UncachedAutocast()
    : was_enabled_(at::autocast::is_autocast_cache_enabled()) {
  at::autocast::set_autocast_cache_enabled(false);
}

UncachedAutocast::~UncachedAutocast() {
  at::autocast::set_autocast_cache_enabled(was_enabled_);
}

torch::autograd::variable_list detach_inputs(
    const torch::autograd::variable_list& inputs) {
  torch::autograd::variable_list detached;
  detached.reserve(inputs.size());
  for (const auto& input : inputs) {
    if (!input.defined()) {
      detached.push_back(input);
      continue;
    }
    auto leaf = input.detach();
    leaf.set_requires_grad(input.requires_grad());
    detached.push_back(std::move(leaf));
  }
  return detached;
}

}  // namespace detail

bool is_recomputing() {
  return detail::recompute_depth > 0;
}

}  // namespace remat
