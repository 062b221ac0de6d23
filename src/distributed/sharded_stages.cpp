// sharded_stages.cpp: sharded (FSDP / ZeRO-3 style) training of a chain of
// stages (remat/distributed.h, ShardedStages).
//
// NOTE: [Sharded units]
// A unit is one distinct stage module with parameters that require grad.
// Those parameters (the others: NOTE: [Frozen parameters]) are laid out, in
// the module's parameters() order, in one flat buffer of
// `padded` elements (the total rounded up to a multiple of the world size);
// rank r owns the slice [r * S, (r + 1) * S), S = padded / world_size, as
// its shard (a leaf the optimizer updates). The flat buffer is one storage;
// every module parameter is set (Tensor::set_data) to a view of it, so the
// parameters stay leaves with their names, shapes and version counters.
// Between uses the storage holds no memory: releasing it gives its data
// pointer back to the allocator and sets its size to 0; gathering allocates
// a new block for the same storage object and fills it (this rank's slice
// from the shard, the others by one broadcast per rank, in place, so that
// nothing else of the buffer's size is allocated). Because the storage
// object stays the same, every tensor autograd saved during a forward that
// views the parameters (a transposed weight, say) sees the values again as
// soon as the unit is gathered for the backward, without the forward having
// kept the memory alive.
//
// NOTE: [Frozen parameters]
// Parameters that do not require grad when ShardedStages is constructed are
// not part of any unit: each rank keeps them whole in their modules, as
// plain data parallelism does, and counts them in resident_bytes(). They get
// no gradient and are not in shards(), so the optimizer never steps them
// (weight decay and momentum included), as with the unsharded model. A
// module whose parameters are all frozen is no unit. The set is fixed at
// construction: finish() refuses a step after a parameter was frozen (its
// shard would still be stepped) or unfrozen (its gradient would stay in
// the module, never reduced nor applied).
//
// NOTE: [Stage boundaries in backward]
// A wrapped stage's forward, with grad mode on, puts two identity nodes
// around the stage's graph: a StageEntry between the input and the stage,
// and a StageExit after its output. In backward, StageExit runs first (it
// has the highest sequence number of the stage's nodes): it gathers the
// unit, pins it (forwards run while it is pinned, the recomputations of a
// non-reentrant checkpoint, do not free it) and points each parameter's
// .grad() at a slice of a zeroed flat gradient buffer, into which autograd's
// accumulation then adds in place. StageEntry runs last: it has the lowest
// sequence number of the stage, and the engine runs ready nodes by
// decreasing sequence number, with every accumulation node first as soon as
// it is ready, so by then every parameter gradient of the stage has been
// accumulated. It reduces the flat gradient: one reduce per rank r of slice
// r to rank r (what a reduce-scatter does, in place), adds its slice / world
// size to the shard's .grad(), drops the full gradients and frees the unit.
// A stage whose input is not floating point (token ids) gets no StageEntry;
// finish() does its reduction instead. Every rank issues the same
// collectives in the same order because every rank runs the same plan.
#include <algorithm>
#include <cstring>
#include <exception>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include "compat/compat.h"
#include "remat/distributed.h"
#include "sharded_units.h"

namespace remat::distributed {

/// The state every wrapped stage and node shares (NOTE: [Sharded units]).
struct ShardedStages::State {
  struct Unit {
    std::shared_ptr<torch::nn::Module> module;
    std::vector<torch::Tensor> parameters;  // the module's, in order
    std::vector<int64_t> offsets;           // into the flat buffer
    int64_t padded = 0;                     // elements of the flat buffer
    int64_t shard_size = 0;                 // padded / world_size
    torch::Tensor flat;                     // 1-D view of the whole storage
    torch::Tensor shard;                    // this rank's slice: a leaf
    torch::Tensor gradient;  // the flat full gradient, during backward
    bool gathered = false;
    bool in_backward = false;
    /// Calls of with_full_parameters() under way (they nest): not released
    /// until the outermost one returns.
    int64_t held = 0;
  };

  State(ProcessGroup group_in) : group(std::move(group_in)) {}

  ProcessGroup group;
  std::vector<Unit> units;
  std::vector<int64_t> unit_of_stage;  // -1: no unit
  std::vector<Stage> stages;           // wrapped
  /// The frozen parameters, whole in their modules (NOTE: [Frozen
  /// parameters]), with the first stage whose module has each.
  std::vector<std::pair<torch::Tensor, int64_t>> frozen;
  int64_t frozen_bytes = 0;
  ShardedStages::Counts counts;
  ShardedStages::Counts last_counts;

  int64_t bytes(const Unit& unit) const {
    return unit.padded * static_cast<int64_t>(unit.flat.element_size());
  }

  /// Gives the memory of `tensor`'s storage back to the allocator now,
  /// whoever else still refers to the storage (its views, a finished
  /// collective that has not dropped its tensors yet).
  static void free_memory(const torch::Tensor& tensor) {
    c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
    storage->set_data_ptr_noswap(at::DataPtr(nullptr, tensor.device()));
    storage->set_nbytes(0);
  }

  /// Frees the unit's parameter memory (every view keeps the storage).
  void release(Unit& unit) {
    if (!unit.gathered || unit.held > 0) {
      return;
    }
    free_memory(unit.flat);
    unit.gathered = false;
  }

  /// Gives the unit's storage memory again and fills it from the shards.
  void gather(Unit& unit) {
    if (unit.gathered) {
      return;
    }
    c10::StorageImpl* storage = unit.flat.storage().unsafeGetStorageImpl();
    at::Allocator* allocator = storage->allocator();
    if (allocator == nullptr) {
      allocator = c10::GetAllocator(unit.flat.device().type());
    }
    const auto nbytes = static_cast<size_t>(bytes(unit));
    storage->set_data_ptr_noswap(allocator->allocate(nbytes));
    storage->set_nbytes(nbytes);
    unit.gathered = true;
    c10::NoGradGuard no_grad;
    const int64_t rank = group.rank();
    unit.flat.narrow(0, rank * unit.shard_size, unit.shard_size)
        .copy_(unit.shard.detach());
    for (int64_t root = 0; root < group.world_size(); ++root) {
      if (group.world_size() > 1) {
        torch::Tensor slice =
            unit.flat.narrow(0, root * unit.shard_size, unit.shard_size);
        // A broadcast copies bytes: bfloat16, which Gloo refuses in some
        // LibTorch versions (1.13), travels as its bytes (uint8, which every
        // version takes; 2.14's refuses half in a broadcast).
        if (slice.scalar_type() == torch::kBFloat16) {
          slice = slice.view(torch::kByte);
        }
        group.broadcast(slice, root);
      }
    }
    ++counts.gathers;
  }

  /// The start of a stage's backward (StageExit).
  void begin_backward(Unit& unit) {
    gather(unit);
    if (unit.in_backward) {
      return;
    }
    unit.in_backward = true;
    c10::NoGradGuard no_grad;
    unit.gradient = torch::zeros({unit.padded}, unit.flat.options());
    for (size_t k = 0; k < unit.parameters.size(); ++k) {
      torch::Tensor& parameter = unit.parameters[k];
      if (parameter.requires_grad()) {
        parameter.mutable_grad() = gradient_view(unit, static_cast<int64_t>(k));
      }
    }
  }

  /// Throws c10::Error, naming the parameter and its stage, if a parameter
  /// was frozen or unfrozen since construction (NOTE: [Frozen parameters]).
  void check_frozen_unchanged() const {
    for (size_t u = 0; u < units.size(); ++u) {
      for (size_t k = 0; k < units[u].parameters.size(); ++k) {
        const torch::Tensor& p = units[u].parameters[k];
        TORCH_CHECK(
            p.requires_grad(),
            "remat::distributed::ShardedStages: a sharded parameter of shape ",
            p.sizes(),
            " (stage ",
            first_stage_of(static_cast<int64_t>(u)),
            ") no longer requires grad; which parameters are frozen is "
            "fixed when ShardedStages is constructed (its shard would still "
            "be stepped)");
      }
    }
    for (const auto& [p, stage] : frozen) {
      TORCH_CHECK(
          !p.requires_grad(),
          "remat::distributed::ShardedStages: a frozen parameter of shape ",
          p.sizes(),
          " (stage ",
          stage,
          ") requires grad now; which parameters are frozen is fixed when "
          "ShardedStages is constructed (it is not sharded, and the "
          "optimizer of the shards would never update it)");
    }
  }

  int64_t first_stage_of(int64_t unit) const {
    const auto found =
        std::find(unit_of_stage.begin(), unit_of_stage.end(), unit);
    return found - unit_of_stage.begin();
  }

  torch::Tensor gradient_view(const Unit& unit, int64_t k) const {
    const torch::Tensor& parameter = unit.parameters[k];
    return unit.gradient.narrow(0, unit.offsets[k], parameter.numel())
        .view(parameter.sizes());
  }

  /// The end of a stage's backward (StageEntry, or finish()).
  void end_backward(Unit& unit) {
    if (!unit.in_backward) {
      return;
    }
    c10::NoGradGuard no_grad;
    for (size_t k = 0; k < unit.parameters.size(); ++k) {
      torch::Tensor& parameter = unit.parameters[k];
      const torch::Tensor& grad = parameter.grad();
      if (!grad.defined()) {
        continue;
      }
      // Autograd accumulates into the view; should it have replaced it
      // (a sparse gradient, create_graph), copy the result in.
      const torch::Tensor slot = gradient_view(unit, static_cast<int64_t>(k));
      if (grad.data_ptr() != slot.data_ptr()) {
        slot.copy_(grad);
      }
      parameter.mutable_grad() = torch::Tensor();
    }
    const int64_t world_size = group.world_size();
    const int64_t rank = group.rank();
    torch::Tensor mine =
        unit.gradient.narrow(0, rank * unit.shard_size, unit.shard_size);
    if (world_size > 1) {
      // Gloo (LibTorch 1.13) cannot sum bfloat16: reduce an fp32 copy.
      const bool widened = unit.gradient.scalar_type() == torch::kBFloat16;
      const torch::Tensor wire =
          widened ? unit.gradient.to(torch::kFloat) : unit.gradient;
      std::vector<Work> works;
      for (int64_t root = 0; root < world_size; ++root) {
        works.push_back(group.reduce_sum(
            wire.narrow(0, root * unit.shard_size, unit.shard_size), root));
      }
      for (Work& work : works) {
        work.wait();
      }
      torch::Tensor summed =
          wire.narrow(0, rank * unit.shard_size, unit.shard_size);
      summed.div_(static_cast<double>(world_size));
      if (widened) {
        mine.copy_(summed);
      }
    }
    if (unit.shard.grad().defined()) {
      unit.shard.mutable_grad().add_(mine);
    } else {
      unit.shard.mutable_grad() = mine.clone();
    }
    // The reduces are done, but Gloo's worker threads may not have dropped
    // their views of the buffer yet: free its memory now, not when they do.
    free_memory(unit.gradient);
    unit.gradient = torch::Tensor();
    unit.in_backward = false;
    release(unit);
    ++counts.reductions;
  }
};

namespace {

using detail::find_units;
using detail::padded_elements;
using detail::resident_bytes_of_unit;
using detail::sharded_parameters;
using detail::Units;
using detail::with_unit_bytes;
using State = ShardedStages::State;

/// One end of a stage's graph (NOTE: [Stage boundaries in backward]): in
/// backward, the StageExit (kStart) begins the stage's backward and the
/// StageEntry (kEnd) ends it; the gradient passes through unchanged.
class StageBoundary : public torch::autograd::Node {
 public:
  enum class Side { kStart, kEnd };
  StageBoundary(std::shared_ptr<State> state, int64_t unit, Side side)
      : state_(std::move(state)), unit_(unit), side_(side) {}
  torch::autograd::variable_list apply(
      torch::autograd::variable_list&& grads) override {
    State::Unit& unit = state_->units[unit_];
    if (side_ == Side::kStart) {
      state_->begin_backward(unit);
    } else {
      state_->end_backward(unit);
    }
    return std::move(grads);
  }
  std::string name() const override {
    return side_ == Side::kStart ? "remat::distributed::StageExit"
                                 : "remat::distributed::StageEntry";
  }

 private:
  std::shared_ptr<State> state_;
  int64_t unit_;
  Side side_;
};

/// An alias of `value` (same storage and version counter) whose grad_fn is
/// `node`, itself connected to `value`'s history.
torch::Tensor through(const torch::Tensor& value, compat::NodePtr node) {
  torch::Tensor alias = value.variable_data();
  torch::autograd::impl::set_version_counter(
      alias, torch::autograd::impl::version_counter(value));
  node->set_next_edges(torch::autograd::collect_next_edges(value));
  torch::autograd::set_history(alias, node);
  return alias;
}

/// Stage i's forward with its unit gathered around it.
torch::Tensor run_sharded(
    const std::shared_ptr<State>& state,
    const Stage& inner,
    int64_t unit_index,
    const torch::Tensor& input) {
  State::Unit& unit = state->units[unit_index];
  state->gather(unit);
  const bool graph = c10::GradMode::is_enabled();
  torch::Tensor x = input;
  if (graph && input.is_floating_point()) {
    x = through(
        input,
        compat::make_node<StageBoundary>(
            state, unit_index, StageBoundary::Side::kEnd));
  }
  torch::Tensor output = inner.forward(x);
  if (graph && output.defined() && output.requires_grad()) {
    output = through(
        output,
        compat::make_node<StageBoundary>(
            state, unit_index, StageBoundary::Side::kStart));
  }
  if (!unit.in_backward) {
    state->release(unit);
  }
  return output;
}

/// A module that runs one wrapped stage (ShardedStages::sequential()).
class ShardedStageImpl : public torch::nn::Module {
 public:
  explicit ShardedStageImpl(Stage stage) : stage_(std::move(stage)) {
    if (stage_.module) {
      register_module("stage", stage_.module);
    }
  }
  torch::Tensor forward(const torch::Tensor& input) {
    return stage_.forward(input);
  }

 private:
  Stage stage_;
};
TORCH_MODULE(ShardedStage);

}  // namespace

ShardedStages::ShardedStages(std::vector<Stage> stages, ProcessGroup group)
    : state_(std::make_shared<State>(std::move(group))) {
  State& state = *state_;
  const int64_t world_size = state.group.world_size();
  const int64_t rank = state.group.rank();
  // Check everything before changing anything.
  const Units found = find_units(stages);
  for (size_t unit = 0; unit < found.modules.size(); ++unit) {
    for (const torch::Tensor& p : sharded_parameters(*found.modules[unit])) {
      // Sharded already (by another ShardedStages over the same modules):
      // the parameter holds no memory, and copying it would crash.
      TORCH_CHECK(
          p.numel() == 0 || p.storage().data() != nullptr,
          "remat::distributed::ShardedStages: a parameter of shape ",
          p.sizes(),
          " holds no memory; is its module sharded already by another "
          "ShardedStages?");
    }
  }
  for (const auto& [p, stage] : found.frozen) {
    // A frozen parameter stays in its module and is read there: one that
    // another ShardedStages sharded (and was frozen since) has no values.
    TORCH_CHECK(
        p.numel() == 0 || p.storage().data() != nullptr,
        "remat::distributed::ShardedStages: a frozen parameter of shape ",
        p.sizes(),
        " (stage ",
        stage,
        ") holds no memory; is its module sharded already by another "
        "ShardedStages?");
  }
  if (world_size > 1) {
    // Different units on different ranks would gather and reduce buffers of
    // different sizes: Gloo aborts the process or a rank reads garbage.
    // Which parameters are frozen counts too: ranks that freeze different
    // parameters of the same shapes would mix their values and gradients.
    std::ostringstream layout;
    for (size_t i = 0; i < stages.size(); ++i) {
      layout << " stage[unit " << found.unit_of_stage[i];
      if (stages[i].module) {
        for (const torch::Tensor& p : stages[i].module->parameters()) {
          layout << ' ' << p.scalar_type() << p.sizes()
                 << (p.requires_grad() ? "" : " (frozen)");
        }
      }
      layout << ']';
    }
    state.group.check_same(
        "the stages given to ShardedStages (units, parameter shapes, "
        "dtypes, which are frozen)",
        layout.str());
  }
  state.unit_of_stage = found.unit_of_stage;
  state.frozen = found.frozen;
  state.frozen_bytes = found.frozen_bytes;
  for (const auto& module : found.modules) {
    State::Unit unit;
    unit.module = module;
    unit.parameters = sharded_parameters(*module);
    state.units.push_back(std::move(unit));
  }

  c10::NoGradGuard no_grad;
  for (State::Unit& unit : state.units) {
    int64_t total = 0;
    for (const torch::Tensor& p : unit.parameters) {
      unit.offsets.push_back(total);
      total += p.numel();
    }
    unit.padded = padded_elements(unit.parameters, world_size);
    unit.shard_size = unit.padded / world_size;
    unit.flat = torch::zeros({unit.padded}, unit.parameters.front().options());
    for (size_t k = 0; k < unit.parameters.size(); ++k) {
      torch::Tensor& p = unit.parameters[k];
      unit.flat.narrow(0, unit.offsets[k], p.numel()).copy_(p.reshape(-1));
    }
    unit.shard = unit.flat.narrow(0, rank * unit.shard_size, unit.shard_size)
                     .clone()
                     .requires_grad_(true);
    for (size_t k = 0; k < unit.parameters.size(); ++k) {
      torch::Tensor& p = unit.parameters[k];
      p.set_data(
          unit.flat.narrow(0, unit.offsets[k], p.numel()).view(p.sizes()));
      p.mutable_grad() = torch::Tensor();
    }
    unit.gathered = true;
    state.release(unit);
  }

  for (size_t i = 0; i < stages.size(); ++i) {
    const int64_t unit = state.unit_of_stage[i];
    if (unit < 0) {
      state.stages.push_back(stages[i]);
      continue;
    }
    Stage inner = stages[i];
    std::weak_ptr<State> weak = state_;
    Stage wrapped;
    wrapped.module = inner.module;
    wrapped.forward = [weak, inner, unit](const torch::Tensor& input) {
      std::shared_ptr<State> shared = weak.lock();
      TORCH_CHECK(
          shared != nullptr,
          "remat::distributed::ShardedStages: a sharded stage ran after its "
          "ShardedStages was destroyed");
      return run_sharded(shared, inner, unit, input);
    };
    state.stages.push_back(std::move(wrapped));
  }
}

ShardedStages::~ShardedStages() {
  // Give the modules their parameters back (their values from the shards);
  // not while an exception unwinds, when the group may be gone.
  if (std::uncaught_exceptions() > 0 && state_->group.world_size() > 1) {
    return;
  }
  try {
    c10::NoGradGuard no_grad;
    for (State::Unit& unit : state_->units) {
      unit.gradient = torch::Tensor();
      unit.in_backward = false;
      state_->gather(unit);
      for (size_t k = 0; k < unit.parameters.size(); ++k) {
        torch::Tensor& p = unit.parameters[k];
        p.mutable_grad() = torch::Tensor();
        p.set_data(unit.flat.narrow(0, unit.offsets[k], p.numel())
                       .clone()
                       .view(p.sizes()));
      }
      state_->release(unit);
    }
  } catch (const std::exception&) {
    // A failed group: the modules are left without parameter memory.
  }
}

const std::vector<Stage>& ShardedStages::stages() const {
  return state_->stages;
}

torch::nn::Sequential ShardedStages::sequential() const {
  torch::nn::Sequential sequential;
  for (const Stage& stage : state_->stages) {
    sequential->push_back(ShardedStage(stage));
  }
  return sequential;
}

std::vector<torch::Tensor> ShardedStages::shards() const {
  std::vector<torch::Tensor> shards;
  for (const State::Unit& unit : state_->units) {
    shards.push_back(unit.shard);
  }
  return shards;
}

std::vector<int64_t> ShardedStages::gathered_bytes() const {
  std::vector<int64_t> bytes;
  for (int64_t unit : state_->unit_of_stage) {
    bytes.push_back(unit < 0 ? 0 : state_->bytes(state_->units[unit]));
  }
  return bytes;
}

int64_t ShardedStages::resident_bytes() const {
  int64_t bytes = state_->frozen_bytes;
  for (const State::Unit& unit : state_->units) {
    bytes +=
        resident_bytes_of_unit(state_->bytes(unit), state_->group.world_size());
  }
  return bytes;
}

planner::Chain ShardedStages::sharded_chain(const planner::Chain& chain) const {
  Units units;
  units.unit_of_stage = state_->unit_of_stage;
  units.frozen = state_->frozen;
  units.frozen_bytes = state_->frozen_bytes;
  for (const State::Unit& unit : state_->units) {
    units.modules.push_back(unit.module);
  }
  return with_unit_bytes(
      chain,
      units,
      state_->group.world_size(),
      "remat::distributed::ShardedStages::sharded_chain");
}

void ShardedStages::finish() {
  State& state = *state_;
  // The step's reductions first, as on every rank, and only then the
  // refusal: refusing before them left the other ranks waiting in their
  // reduces, and a unit still in its backward (a stage whose input is not
  // floating point) kept this step's gradient for the next one.
  for (State::Unit& unit : state.units) {
    state.end_backward(unit);
    state.release(unit);
  }
  state.last_counts = state.counts;
  state.counts = Counts{};
  state.check_frozen_unchanged();
}

void ShardedStages::with_full_parameters(const std::function<void()>& use) {
  State& state = *state_;
  for (State::Unit& unit : state.units) {
    state.gather(unit);
  }
  // Held until `use` returns: a stage forward (or a step) run inside `use`
  // must not free the parameters `use` goes on reading or has written.
  for (State::Unit& unit : state.units) {
    ++unit.held;
  }
  struct ReleaseAtExit {
    State& state;
    ~ReleaseAtExit() {
      c10::NoGradGuard no_grad;
      const int64_t rank = state.group.rank();
      for (State::Unit& unit : state.units) {
        --unit.held;
        if (unit.gathered) {
          unit.shard.detach().copy_(
              unit.flat.narrow(0, rank * unit.shard_size, unit.shard_size));
        }
        state.release(unit);
      }
    }
  } release_at_exit{state};
  use();
}

ShardedStages::Counts ShardedStages::last_step_counts() const {
  return state_->last_counts;
}

}  // namespace remat::distributed
