// plan_executor.cpp: one autograd node that executes a whole plan, on a
// chain or a graph of stages.
//
// NOTE: [Plan execution]
// run_program() executes the plan's forward phase (every op before the first
// kBackward) and returns the output of the last stage, whose grad_fn is a
// PlanBackward node; that node's apply() executes the rest of the plan. The
// executor follows the graph memory model op by op (NOTE: [The memory model
// on graphs] in src/planner/graph_simulate.cpp; on a chain it is the chain
// model): after each op it drops the values planner::released_values names,
// and a stage's backward frees its record, so what is alive is exactly what
// simulate() counts:
//  - kForwardNoSave / kForwardCheckpoint run the stage under no-grad on its
//    held inputs and hold its output as a plain tensor.
//  - kForwardRecord runs the stage with grad on detached leaves aliasing its
//    distinct inputs (each requiring grad unless it is a non-float or an
//    input that does not), so the stage's graph is kept apart from the
//    caller's; R_i = (leaves, output), and x_{i+1} is held as that output
//    itself (it adds nothing: the record holds the output and its graph until
//    the stage's backward, which lets go of x_{i+1} too, and a reader that
//    records detaches its own leaf from it).
//  - kForwardSelective does the same inside a non-reentrant checkpoint region
//    with the chain's selective policy (record_stage): R_i holds only what
//    the policy keeps, and the stage's backward starts by recomputing the
//    rest (the region's own recomputation, which preserves the buffers).
//  - kBackward runs the stage's backward from output_i with g_{i+1}
//    (run_stage_backward); each input's gradient is read from its leaf's
//    .grad and, for a value several stages read, accumulated in place in
//    the order of their backwards (the last reader first, as autograd
//    orders a plain backward, so the sums are bitwise the same). The executor
//    hands x_{i+1} and g_{i+1} over to autograd instead of holding them for
//    the whole stage backward, so each is freed as soon as the node that
//    uses it has run, as in a plain backward (the model's R_i and g_{i+1} are
//    gone by the end of the op either way; profile_chain measures
//    backward_tmp_bytes the same way). Parameters accumulate their gradients
//    there, so the outer backward must be a plain backward
//    (torch::autograd::grad is refused, as in the reentrant checkpoint).
// The incoming gradient g_L is taken out of the engine's input list, so it is
// freed after the backward of stage L-1 exactly as the model says (a
// torch::autograd::Function would keep a copy for the whole backward).
//
// NOTE: [Linked stages]
// Where the plan runs the backward of a stage p directly after that of its
// only reader r, and both were recorded (p first), r's record takes x_{p+1}
// as p's record output itself, with its graph, instead of a detached leaf
// (linked_values() finds these pairs; consecutive pairs make runs). r's
// backward then runs on into p's graph in the same engine call, as a plain
// backward does, and p's backward op only collects its leaves' gradients.
// This removes what each stage boundary costs (an engine call, a leaf and
// its AccumulateGrad, a detach): a store-all plan is one engine call, and a
// recomputed segment one per segment, as checkpoint_sequential. Gradients
// are unchanged (the same operators run in the same order) and memory is
// the same, to the byte: g_{p+1} passes from node to node instead of
// through p's leaf, and the held x_{p+1} is let go by a hook on it when its
// gradient is complete, where the unlinked backward of p would let go of it.
// Ops timed for self-correction are never linked (a per-stage time needs a
// stage boundary), nor is an output the record did not compute (one with no
// graph: a parameter, the stage's input leaf), which outlives the step and
// must carry nothing of it (PlanExecution::linkable), nor are stages whose
// modules share a parameter (make_program): a linked run holding two of its
// uses would add their terms to each other before the term an earlier engine
// call left in .grad, where a plain backward adds them to it one by one
// (floating-point addition is not associative). A value both stages
// read has one leaf, the producer's, which the reader shares: its
// gradient's terms from both stages then meet in one accumulator, in the
// order of a plain backward (the reader's uses first), and the reader's
// backward op collects the sum.
//
// RNG and module state (NOTE: [Recompute and RNG] in recompute_context.h): the
// first forward of each stage the plan runs more than once captures a
// RecomputeContext (RNG states as plain bytes, so nothing extra is counted by
// the tracking allocator; autocast; a stage run once captures nothing);
// every later forward of that stage replays it under a RecomputeGuard that
// restores the stage module's buffers afterwards, so dropout masks repeat and
// BatchNorm running statistics are updated once per step.
#include "plan_executor.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/Context.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include "checkpoint/recompute_context.h"
#include "compat/compat.h"
#include "remat/checkpoint.h"
#include "remat/measure/timer.h"
#include "remat/planner/graph.h"
#include "remat/planner/simulate.h"
#include "self_correct.h"

namespace remat::detail {
namespace {

using planner::OpKind;

/// How errors name value x_v.
std::string value_name(int64_t v) {
  return v == 0 ? std::string("the model's input")
                : "the output of stage " + std::to_string(v - 1);
}

/// What a recorded forward of one stage leaves alive for its backward.
struct StageRecord {
  std::vector<torch::Tensor> leaves;  // one per distinct input value
  torch::Tensor output;               // x_{i+1}, carrying the stage's graph
  bool full = false;                  // kForwardRecord (not selective)
  // The input value taken with its producer's graph (NOTE: [Linked
  // stages]), whose leaf is left undefined; -1 if none.
  int64_t linked_value = -1;
};

/// The part of a planned execution that runs in the backward pass.
class BackwardPhase {
 public:
  virtual ~BackwardPhase() = default;
  /// Runs the rest of the plan with the gradient of the planned output;
  /// returns the gradient of the planned input (undefined if none).
  virtual torch::Tensor run_backward_phase(torch::Tensor grad_output) = 0;
};

/// One execution of a program: one per forward() call.
class PlanExecution : public BackwardPhase,
                      public std::enable_shared_from_this<PlanExecution> {
 public:
  PlanExecution(
      std::shared_ptr<const PlanProgram> program,
      const torch::Tensor& input,
      const char* who,
      Policy selective_policy,
      std::shared_ptr<StageTimes> times)
      : program_(std::move(program)),
        selective_policy_(std::move(selective_policy)),
        who_(who),
        input_requires_grad_(input.requires_grad()),
        device_(input.device()),
        times_(std::move(times)) {
    const int64_t n = program_->structure.size();
    values_.resize(n + 1);
    versions_.resize(n + 1);
    grads_.resize(n + 1);
    alias_.resize(n + 1);
    alias_known_.resize(n + 1);
    for (int64_t v = 0; v <= n; ++v) {
      alias_[v] = v;
    }
    records_.resize(n);
    first_forward_.resize(n);
    values_[0] = input.detach();
    versions_[0] = version_of(values_[0]);
  }
  PlanExecution(const PlanExecution&) = delete;
  PlanExecution& operator=(const PlanExecution&) = delete;

  /// Runs the ops before the first backward; returns the last stage's
  /// output with its graph.
  torch::Tensor run_forward_phase() {
    const auto& ops = program_->plan.ops;
    while (next_op_ < ops.size() && ops[next_op_].kind != OpKind::kBackward) {
      run_op(next_op_++);
    }
    TORCH_INTERNAL_ASSERT(records_.back().output.defined());
    return records_.back().output;
  }

  torch::Tensor run_backward_phase(torch::Tensor grad_output) override {
    grads_.back() = std::move(grad_output);
    while (next_op_ < program_->plan.ops.size()) {
      run_op(next_op_++);
    }
    if (times_) {
      times_->step_done();
    }
    return std::move(grads_[0]);
  }

 private:
  /// Runs op k, timed when self-correction collects times.
  void run_op(size_t k) {
    if (!times_) {
      execute_op(k);
      return;
    }
    const planner::Op& op = program_->plan.ops[k];
    const bool after_full_record =
        op.kind == OpKind::kBackward && records_[op.stage].full;
    measure::synchronize(device_);
    const measure::Timer timer;
    execute_op(k);
    measure::synchronize(device_);
    const double ms = timer.elapsed_ms();
    if (op.kind != OpKind::kBackward) {
      times_->add_forward(op.stage, ms);
    } else if (after_full_record) {
      times_->add_backward(op.stage, ms);
    }
  }

  void execute_op(size_t k) {
    const planner::Op& op = program_->plan.ops[k];
    const int64_t i = op.stage;
    if (op.kind == OpKind::kBackward) {
      run_backward(i);
    } else {
      const std::vector<int64_t>& values = program_->structure.input_values(i);
      std::vector<torch::Tensor> inputs;
      inputs.reserve(values.size());
      for (int64_t v : values) {
        TORCH_INTERNAL_ASSERT(values_[v].defined(), "x_", v, " is not held");
        check_unchanged(v);
        inputs.push_back(values_[v]);
      }
      if (op.kind == OpKind::kForwardNoSave ||
          op.kind == OpKind::kForwardCheckpoint) {
        values_[i + 1] = forward_stage(i, inputs, op.kind);
        versions_[i + 1] = version_of(values_[i + 1]);
        note_alias(i, inputs);
      } else {
        StageRecord record;
        record.leaves.reserve(inputs.size());
        // Linked only when ops are not timed: a linked backward runs two
        // stages in one engine call, which per-stage times cannot split.
        // A stage known to return its input as it is stays unlinked: its
        // readers sum their terms in that input's accumulator.
        if (!times_ && alias_[i + 1] == i + 1 &&
            linkable(program_->linked_value[k])) {
          record.linked_value = program_->linked_value[k];
        }
        for (size_t j = 0; j < inputs.size(); ++j) {
          if (values[j] == record.linked_value) {
            record.leaves.push_back(take_linked(values[j]));
            continue;
          }
          torch::Tensor leaf = linked_leaf(record.linked_value, values[j]);
          if (leaf.defined()) {
            record.leaves.push_back(std::move(leaf));
            continue;
          }
          // Values that are one tensor (a stage returned its input as it
          // is: NOTE: [A stage that returns its input]) get one leaf, as a
          // plain backward has one accumulator for them.
          for (size_t m = 0; m < j && !leaf.defined(); ++m) {
            if (alias_[values[m]] == alias_[values[j]] &&
                values[m] != record.linked_value &&
                record.leaves[m].defined()) {
              leaf = record.leaves[m];
            }
          }
          if (leaf.defined()) {
            record.leaves.push_back(std::move(leaf));
            continue;
          }
          leaf = inputs[j].detach();
          // Complex values carry gradients too (an FFT between stages).
          if ((leaf.is_floating_point() || leaf.is_complex()) &&
              (alias_[values[j]] > 0 || input_requires_grad_)) {
            leaf.requires_grad_(true);
          }
          record.leaves.push_back(std::move(leaf));
        }
        record.output = forward_stage(i, record.leaves, op.kind);
        record.full = op.kind == OpKind::kForwardRecord;
        for (size_t j = 0; j < values.size(); ++j) {
          if (values[j] == record.linked_value) {
            record.leaves[j] = torch::Tensor();  // autograd holds what it saved
          }
        }
        values_[i + 1] = record.output;
        versions_[i + 1] = version_of(values_[i + 1]);
        note_alias(i, record.leaves);
        records_[i] = std::move(record);
      }
    }
    for (int64_t v : program_->released[k]) {
      values_[v] = torch::Tensor();
    }
  }

  void run_backward(int64_t i) {
    StageRecord record = std::move(records_[i]);
    records_[i] = StageRecord{};
    // x_{i+1} is an alias of the record's output: let autograd free it.
    values_[i + 1] = torch::Tensor();
    torch::Tensor grad_output = std::move(grads_[i + 1]);
    // A record whose output went to its reader's record (linked) had its
    // backward run with that reader's.
    const std::vector<int64_t>& values = program_->structure.input_values(i);
    if (record.output.defined() && grad_output.defined() &&
        record.output.requires_grad()) {
      // What later readers added to an input's gradient enters the stage's
      // backward first, as in a plain backward (see run_stage_backward).
      std::vector<std::pair<torch::Tensor, torch::Tensor>> carried;
      for (size_t j = 0; j < values.size(); ++j) {
        const torch::Tensor& leaf = record.leaves[j];
        torch::Tensor& total = grads_[alias_[values[j]]];
        if (leaf.defined() && leaf.requires_grad() && total.defined()) {
          carried.emplace_back(leaf, std::move(total));
          total = torch::Tensor();
        }
      }
      run_stage_backward(
          std::move(record.output), std::move(grad_output), std::move(carried));
    }
    record.output = torch::Tensor();
    for (size_t j = 0; j < values.size(); ++j) {
      torch::Tensor& leaf = record.leaves[j];
      if (!leaf.defined() || !leaf.requires_grad() || !leaf.grad().defined()) {
        continue;
      }
      torch::Tensor grad = leaf.grad();
      leaf.mutable_grad() = torch::Tensor();  // collected once if shared
      leaf = torch::Tensor();
      torch::Tensor& total = grads_[alias_[values[j]]];
      if (total.defined()) {
        total.add_(grad);  // a stage whose own backward did not run
      } else {
        total = std::move(grad);
      }
    }
  }

  // NOTE: [A stage that returns its input]
  // A stage (other than the last) may return one of its inputs as it is.
  // In a plain run every use of that tensor then adds its term to one
  // accumulator, in the order of the engine; held as a value of its own,
  // its uses would be summed apart and added to the input's sum at the end,
  // a different association of the same terms (not bitwise equal). So x_{i+1}
  // is recorded as an alias of that input: its readers add their terms to
  // the input's gradient (a reader of both gets one leaf for them), and the
  // stage's own backward, the identity, receives nothing and does nothing.
  void note_alias(int64_t i, const std::vector<torch::Tensor>& inputs) {
    // Decided at the stage's first forward and kept: its readers may have
    // summed into the input's accumulator already. (A first forward linked
    // to its producer's record decides "no alias", as before.)
    // The last stage's gradient comes from outside, into g_L.
    if (i + 1 == program_->structure.size() || alias_known_[i + 1]) {
      return;
    }
    alias_known_[i + 1] = true;
    const std::vector<int64_t>& values = program_->structure.input_values(i);
    for (size_t j = 0; j < inputs.size(); ++j) {
      if (inputs[j].defined() && values_[i + 1].is_same(inputs[j])) {
        alias_[i + 1] = alias_[values[j]];
        return;
      }
    }
  }

  /// Throws c10::Error, naming the value, if held x_v was modified in place
  /// since it was computed: a forward that reads it again (a recomputation
  /// during backward) would compute from the changed value. Plain autograd
  /// refuses the same backward where it saved the value.
  void check_unchanged(int64_t v) const {
    const int64_t now = version_of(values_[v]);
    TORCH_CHECK(
        now == versions_[v],
        who_,
        ": ",
        value_name(v),
        " was modified in place since the forward (version ",
        versions_[v],
        " then, ",
        now,
        " now); the plan reads it again to recompute during backward, so it "
        "must stay unchanged until backward ends (plain autograd refuses "
        "such a backward where it saved the value)");
  }

  /// Whether x_v (v >= 0; -1: none) may be linked: its producer's record
  /// output has a graph. A stage may also return a leaf it did not compute
  /// (a parameter, its input leaf): such a tensor outlives this execution,
  /// and so would a hook on it, so its reader takes a leaf as usual. (A
  /// non-leaf the stage closes over and returns as it is is linked; the
  /// hook of take_linked reaches the execution only while it is alive.)
  bool linkable(int64_t v) const {
    return v > 0 && records_[v - 1].output.defined() &&
           records_[v - 1].output.grad_fn() != nullptr;
  }

  /// The leaf of x_v in the record of linked value u's producer (undefined
  /// if u is -1 or that record has none): a reader linked to its producer
  /// shares the producer's leaves of the values both read, so that their
  /// gradients from both stages, computed in one engine call, are summed in
  /// one accumulator in the order of a plain backward (NOTE: [Linked
  /// stages]).
  torch::Tensor linked_leaf(int64_t u, int64_t v) const {
    if (u <= 0) {
      return {};
    }
    const std::vector<int64_t>& read = program_->structure.input_values(u - 1);
    const auto it = std::find(read.begin(), read.end(), v);
    return it == read.end() ? torch::Tensor()
                            : records_[u - 1].leaves[it - read.begin()];
  }

  /// The record output of x_v's producer, with its graph, for its reader's
  /// record (NOTE: [Linked stages]). x_v stays held until its gradient is
  /// complete, which is where an unlinked backward lets go of it.
  /// REQUIRES: linkable(v).
  torch::Tensor take_linked(int64_t v) {
    torch::Tensor output = std::move(records_[v - 1].output);
    TORCH_INTERNAL_ASSERT(output.defined());
    if (output.requires_grad()) {
      // The hook lives as long as the tensor, which may outlive this
      // execution (a non-leaf tensor the stage closes over and returns as
      // it is): it reaches the execution only while that is alive.
      output.register_hook(
          [execution = weak_from_this(), v](const torch::Tensor& /*grad*/) {
            if (const auto alive = execution.lock()) {
              alive->values_[v] = torch::Tensor();
            }
          });
    }
    return output;
  }

  /// Runs stage i; replays its first forward's RNG state and restores its
  /// buffers if it ran before (NOTE: [Recompute and RNG]), with the
  /// training flags of its module as they were then (NOTE: [Recompute and
  /// module mode]).
  torch::Tensor forward_stage(
      int64_t i, const std::vector<torch::Tensor>& inputs, OpKind kind) {
    const StageCall& call = program_->calls[i];
    if (!program_->replayed[i]) {
      return call_stage(
          i, inputs, kind);  // its only forward: nothing to replay
    }
    if (!first_forward_[i]) {
      first_forward_[i].emplace(
          torch::autograd::variable_list(inputs.begin(), inputs.end()),
          /*preserve_rng=*/true,
          std::vector<std::shared_ptr<torch::nn::Module>>{call.module});
      const BufferWrites writes({call.module});
      torch::Tensor output = call_stage(i, inputs, kind);
      first_forward_[i]->note_buffer_writes(writes);
      return output;
    }
    first_forward_[i]->check_parameters(
        who_, "stage " + std::to_string(i) + "'s module");
    RecomputeGuard guard(*first_forward_[i], {call.module});
    return call_stage(i, inputs, kind);
  }

  torch::Tensor call_stage(
      int64_t i, const std::vector<torch::Tensor>& inputs, OpKind kind) {
    const StageCall& call = program_->calls[i];
    const std::vector<int64_t>& values = program_->structure.input_values(i);
    if (kind == OpKind::kForwardRecord) {
      return record_stage(call, i, inputs, values, Policy{});
    }
    if (kind == OpKind::kForwardSelective) {
      return record_stage(call, i, inputs, values, selective_policy_);
    }
    c10::NoGradGuard no_grad;
    UncachedAutocast uncached;  // a cast cached here has no history
    return forward_of_stage(call, i, inputs, values);
  }

  const std::shared_ptr<const PlanProgram> program_;
  const Policy selective_policy_;  // what kForwardSelective keeps
  const char* const who_;
  const bool input_requires_grad_;
  const c10::Device device_;
  const std::shared_ptr<StageTimes> times_;  // null: not timed
  size_t next_op_ = 0;
  std::vector<torch::Tensor> values_;  // x_v while held, else undefined
  std::vector<int64_t> versions_;      // x_v's version when computed
  std::vector<torch::Tensor> grads_;   // g_v while held
  // The value whose tensor x_v is (v itself, or the input a stage returned
  // as it is): where g_v is summed (NOTE: [A stage that returns its input]).
  std::vector<int64_t> alias_;
  std::vector<bool> alias_known_;  // alias_[v] decided (at x_v's first forward)
  std::vector<StageRecord> records_;  // R_i while recorded
  // RNG, autocast, train()/eval() and parameter versions of each replayed
  // stage's first forward.
  std::vector<std::optional<RecomputeContext>> first_forward_;
};

/// The root of a stage backward: it owns the incoming gradients (one per
/// edge) and hands them to the engine without keeping a reference (see
/// run_stage_backward).
class GradientRoot : public torch::autograd::Node {
 public:
  GradientRoot(
      torch::autograd::variable_list grads, torch::autograd::edge_list next)
      : torch::autograd::Node(std::move(next)), grads_(std::move(grads)) {}

  torch::autograd::variable_list apply(
      torch::autograd::variable_list&& /*trigger*/) override {
    return std::move(grads_);
  }

  std::string name() const override {
    return "remat::GradientRoot";
  }

 private:
  torch::autograd::variable_list grads_;
};

/// The grad_fn of a planned forward's output: runs the backward phase.
class PlanBackward : public torch::autograd::Node {
 public:
  PlanBackward(std::shared_ptr<BackwardPhase> phase, const char* who)
      : phase_(std::move(phase)), who_(who) {}

  torch::autograd::variable_list apply(
      torch::autograd::variable_list&& grads) override {
    TORCH_CHECK(
        torch::autograd::Engine::get_default_engine().is_checkpoint_valid(),
        who_,
        ": backward accumulates parameter gradients itself, so "
        "torch::autograd::grad and backward(inputs=...) are not supported; "
        "call backward() on a loss");
    TORCH_CHECK(
        phase_ != nullptr,
        who_,
        ": expected one backward per forward, got a second backward through "
        "the same forward (retain_graph is not supported)");
    // The engine runs a backward with create_graph under grad mode. The
    // stages' backwards build no graph of the gradients they produce, so a
    // gradient of a gradient would be silently zero: refuse it.
    TORCH_CHECK(
        !c10::GradMode::is_enabled(),
        who_,
        ": backward(create_graph=true) is not supported (a gradient of the "
        "gradients, such as a gradient penalty, would be zero); compute such "
        "a term with a plain run of the model");
    std::shared_ptr<BackwardPhase> phase = std::move(phase_);
    // Take g_L out of the engine's list so that it can be freed mid-way.
    torch::Tensor grad_output = std::move(grads.at(0));
    grads.clear();
    return {phase->run_backward_phase(std::move(grad_output))};
  }

  std::string name() const override {
    return std::string(who_) + "Backward";
  }

  void release_variables() override {
    phase_.reset();
  }

 private:
  std::shared_ptr<BackwardPhase> phase_;
  const char* who_;
};

}  // namespace

void run_stage_backward(
    torch::Tensor output,
    torch::Tensor grad_output,
    std::vector<std::pair<torch::Tensor, torch::Tensor>> carried) {
  TORCH_INTERNAL_ASSERT(output.requires_grad() && grad_output.defined());
  torch::autograd::edge_list edges{
      torch::autograd::impl::gradient_edge(output)};
  output = torch::Tensor();
  const torch::Tensor trigger = at::empty({0}, grad_output.options());
  torch::autograd::variable_list grads{std::move(grad_output)};
  // A carried gradient goes straight to its leaf's accumulator, from the
  // root: the engine adds the root's outputs to their nodes' input buffers
  // before any node of the stage runs, so it is the first term of the sum.
  for (auto& [leaf, grad] : carried) {
    TORCH_INTERNAL_ASSERT(leaf.requires_grad() && grad.defined());
    edges.push_back(torch::autograd::impl::gradient_edge(leaf));
    grads.push_back(std::move(grad));
  }
  carried.clear();
  // torch::autograd::backward(outputs, grads) would keep `grads` (and the
  // caller `outputs`) alive until the whole graph has run. Instead the
  // gradients travel in a root node that gives them away when it runs; the
  // engine starts that root with a zero-byte trigger tensor.
  compat::NodePtr root =
      compat::make_node<GradientRoot>(std::move(grads), std::move(edges));
  root->add_input_metadata(trigger);
  torch::autograd::Engine::get_default_engine().execute(
      {torch::autograd::Edge(root, 0)},
      {trigger},
      /*keep_graph=*/false,
      /*create_graph=*/false,
      /*accumulate_grad=*/true);
}

planner::StageCost unit_cost() {
  planner::StageCost unit;
  unit.forward_ms = 1;
  unit.backward_ms = 1;
  unit.output_bytes = 1;
  unit.saved_bytes = 1;
  unit.selective = planner::SelectiveCost{1, 0, 0, 0};
  return unit;
}

planner::Chain unit_chain(int64_t stages) {
  return planner::Chain(
      std::vector<planner::StageCost>(static_cast<size_t>(stages), unit_cost()),
      /*input_bytes=*/1);
}

StageCall call_of(const Stage& stage) {
  return StageCall{
      [forward = stage.forward](const std::vector<torch::Tensor>& inputs) {
        return forward(inputs.at(0));
      },
      stage.module};
}

// NOTE: [A stage leaves its inputs unchanged]
// Plain autograd lets a stage modify what it reads in place (x.mul_(2) on
// an input whose producer saved nothing of it). Under a plan it must not:
// the executor holds the values a stage reads and runs the stage again on
// them (a recorded forward after one that kept nothing, a recomputation),
// and the profiler runs it several times, so a second run would read the
// changed value and every gradient after it would be silently wrong.
// LibTorch refuses in-place changes of a leaf that requires grad (the
// inputs of a recorded forward) with its own message; a forward under
// no-grad, or on an input that needs no gradient, would change the value
// unnoticed. Every forward the executors and the profiler run therefore
// compares its inputs' version counters (shared by a tensor, its detached
// aliases and its views) before and after the call, and refuses a change
// naming the stage and the value. The check reads one counter per input.
namespace {

/// `run()` (the forward of stage `index` on `inputs`), checked as
/// forward_of_stage() says.
torch::Tensor checked_forward(
    int64_t index,
    const std::vector<torch::Tensor>& inputs,
    const std::vector<int64_t>& values,
    const std::function<torch::Tensor()>& run) {
  TORCH_INTERNAL_ASSERT(inputs.size() == values.size());
  c10::SmallVector<int64_t, 4> versions;  // no allocation for most stages
  for (const torch::Tensor& input : inputs) {
    versions.push_back(version_of(input));
  }
  torch::Tensor output;
  try {
    output = run();
  } catch (c10::Error& error) {
    const std::string message = error.msg();
    const bool in_place =
        message.find("in-place operation") != std::string::npos;
    // A forward that records nothing runs under no-grad, where a backward
    // inside the stage (torch::autograd::grad) fails in autograd's words,
    // which say nothing of the mode: say it.
    const bool no_grad = !c10::GradMode::is_enabled();
    const bool inner_backward =
        no_grad && message.find("require grad") != std::string::npos;
    error.add_context(c10::str(
        "remat: raised by the forward of stage ",
        index,
        in_place ? "; a stage must not modify its inputs in place" : "",
        no_grad ? "; it ran with grad mode off (a forward whose graph the plan "
                  "does not keep)"
                : "",
        inner_backward ? "; a stage cannot run torch::autograd::grad inside "
                         "its forward: checkpoint such a block with "
                         "remat::checkpoint instead"
                       : ""));
    throw;
  }
  for (size_t k = 0; k < inputs.size(); ++k) {
    TORCH_CHECK(
        version_of(inputs[k]) == versions[k],
        "remat: stage ",
        index,
        " modified its input (",
        value_name(values[k]),
        ") in place. Under a plan a stage runs again on the values it read "
        "(recomputation, profiling), so it must leave them unchanged: use "
        "the out-of-place operation (mul instead of mul_, ReLU without "
        "inplace), or clone the input first");
  }
  // An input returned as it is stays that tensor, even where it is a view
  // of a larger storage (a graph input narrowed from a batch): it is held
  // anyway, and a copy would hide that the output is the input (NOTE: [A
  // stage that returns its input]), summing its gradient apart.
  for (const torch::Tensor& input : inputs) {
    if (output.defined() && output.is_same(input)) {
      return output;
    }
  }
  return stage_output(std::move(output), index);
}

}  // namespace

torch::Tensor forward_of_stage(
    const StageCall& call,
    int64_t index,
    const std::vector<torch::Tensor>& inputs,
    const std::vector<int64_t>& values) {
  return checked_forward(
      index, inputs, values, [&] { return call.forward(inputs); });
}

torch::Tensor record_stage(
    const StageCall& call,
    int64_t index,
    const std::vector<torch::Tensor>& leaves,
    const std::vector<int64_t>& values,
    const Policy& policy) {
  c10::AutoGradMode grad_mode(true);
  if (!policy) {
    return forward_of_stage(call, index, leaves, values);
  }
  CheckpointOptions options;
  options.policy(policy);
  if (call.module) {
    options.preserve_buffers_of({call.module});
  }
  // The region keeps its function for the recomputation: a copy of `call`.
  // It checks that the output is defined; undefined, it never returns.
  const auto region = [call](const torch::autograd::variable_list& in) {
    return torch::autograd::variable_list{call.forward(in)};
  };
  return checked_forward(index, leaves, values, [&] {
    return checkpoint(region, leaves, options).at(0);
  });
}

// NOTE: [A stage output that is a view]
// A stage may return a view of a larger tensor (x.narrow(1, 0, 64) of a
// [32, 1024] activation, an attention head's slice): the view keeps its
// whole storage alive, while the memory model counts the view's own bytes
// as the stage's output. The executor holds such an output as a compact copy
// (clone: its backward passes the gradient through unchanged, so gradients
// stay bitwise equal), and profile_chain measures the stage the same way, so
// the held bytes are the counted ones and the storage is freed with what the
// plan drops. An output whose storage is no larger than itself (the input
// returned as is, a reshape, an expand) is taken as it is.
torch::Tensor stage_output(torch::Tensor output, int64_t index) {
  TORCH_CHECK(
      output.defined(),
      "remat: stage ",
      index,
      " returned an undefined tensor; every stage must return "
      "a defined tensor");
  if (output.has_storage() &&
      output.storage().nbytes() > static_cast<size_t>(output.nbytes())) {
    return output.clone(at::MemoryFormat::Contiguous);
  }
  return output;
}

std::vector<int64_t> linked_values(
    const planner::Graph& structure, const planner::Plan& plan) {
  const std::vector<planner::Op>& ops = plan.ops;
  std::vector<int64_t> linked(ops.size(), -1);
  // Per stage, the index of its latest forward op so far (-1: none).
  std::vector<int64_t> latest(static_cast<size_t>(structure.size()), -1);
  const auto recorded_at = [&](int64_t stage) -> int64_t {
    const int64_t k = latest[static_cast<size_t>(stage)];
    return k >= 0 && ops[static_cast<size_t>(k)].kind == OpKind::kForwardRecord
               ? k
               : -1;
  };
  for (size_t c = 0; c < ops.size(); ++c) {
    const planner::Op& op = ops[c];
    if (op.kind != OpKind::kBackward) {
      latest[static_cast<size_t>(op.stage)] = static_cast<int64_t>(c);
      continue;
    }
    if (c + 1 == ops.size() || ops[c + 1].kind != OpKind::kBackward) {
      continue;
    }
    const int64_t reader = op.stage;
    const int64_t producer = ops[c + 1].stage;
    const std::vector<int64_t>& readers = structure.consumers(producer);
    const int64_t producer_record = recorded_at(producer);
    const int64_t reader_record = recorded_at(reader);
    if (readers.size() == 1 && readers[0] == reader && producer_record >= 0 &&
        reader_record > producer_record) {
      linked[static_cast<size_t>(reader_record)] = producer + 1;
    }
  }
  return linked;
}

planner::Graph chain_structure(int64_t stages) {
  return planner::graph_of(unit_chain(stages));
}

std::shared_ptr<const PlanProgram> make_program(
    std::vector<StageCall> calls,
    planner::Graph structure,
    planner::Plan plan) {
  std::vector<std::vector<int64_t>> released =
      planner::released_values(structure, plan);
  std::vector<int> forwards(static_cast<size_t>(structure.size()), 0);
  for (const planner::Op& op : plan.ops) {
    if (op.kind != OpKind::kBackward) {
      ++forwards[static_cast<size_t>(op.stage)];
    }
  }
  std::vector<bool> replayed;
  for (int count : forwards) {
    replayed.push_back(count > 1);
  }
  std::vector<int64_t> linked = linked_values(structure, plan);
  // A parameter used by several stages sums its gradient terms in the order
  // of a plain backward only if each engine call holds all of its uses or
  // one: a linked run holding two uses of it, after an earlier call that
  // held another, would add (g_a + g_b) to g_c where a plain backward adds
  // g_b and then g_a to g_c, and floating-point addition is not
  // associative. Stages that share a parameter are not linked.
  std::unordered_map<const void*, int64_t> first_stage;
  std::vector<bool> shares(calls.size(), false);
  for (size_t i = 0; i < calls.size(); ++i) {
    if (!calls[i].module) {
      continue;
    }
    for (const torch::Tensor& parameter : calls[i].module->parameters()) {
      const void* key = parameter.unsafeGetTensorImpl();
      auto [it, inserted] = first_stage.emplace(key, static_cast<int64_t>(i));
      if (!inserted && it->second != static_cast<int64_t>(i)) {
        shares[i] = true;
        shares[static_cast<size_t>(it->second)] = true;
      }
    }
  }
  for (size_t k = 0; k < linked.size(); ++k) {
    if (linked[k] < 0) {
      continue;
    }
    const auto reader = static_cast<size_t>(plan.ops[k].stage);
    const auto producer = static_cast<size_t>(linked[k] - 1);
    if (shares[reader] || shares[producer]) {
      linked[k] = -1;
    }
  }
  return std::make_shared<const PlanProgram>(PlanProgram{
      std::move(calls),
      std::move(structure),
      std::move(plan),
      std::move(released),
      std::move(replayed),
      std::move(linked)});
}

torch::Tensor run_program(
    std::shared_ptr<const PlanProgram> program,
    const torch::Tensor& input,
    const char* who,
    const Policy& selective_policy,
    std::shared_ptr<StageTimes> times) {
  auto execution = std::make_shared<PlanExecution>(
      std::move(program), input, who, selective_policy, std::move(times));
  torch::Tensor inner_output = execution->run_forward_phase();
  TORCH_CHECK(
      inner_output.is_floating_point() || inner_output.is_complex(),
      who,
      ": expected a floating-point output to train through, got ",
      inner_output.scalar_type());
  if (!inner_output.requires_grad()) {
    // As in plain autograd, an output with no graph (the last stage detached
    // it, or nothing it depends on requires grad) trains nothing: a backward
    // through it is an error, not a silent no-op.
    return inner_output;
  }
  // A fresh tensor sharing the output's storage, so that the stage graph of
  // the inner output stays intact for the backward of the last stage.
  torch::Tensor output = inner_output.variable_data();
  inner_output = torch::Tensor();
  compat::NodePtr node =
      compat::make_node<PlanBackward>(std::move(execution), who);
  node->set_next_edges(torch::autograd::collect_next_edges(input));
  torch::autograd::set_history(output, node);
  return output;
}

std::shared_ptr<const PlanProgram> chain_program(
    const std::vector<Stage>& stages, const planner::Plan& plan) {
  std::vector<StageCall> calls;
  calls.reserve(stages.size());
  for (const Stage& stage : stages) {
    calls.push_back(call_of(stage));
  }
  const auto count = static_cast<int64_t>(calls.size());
  return make_program(std::move(calls), chain_structure(count), plan);
}

bool any_parameter_requires_grad(const torch::nn::Module& module) {
  for (const torch::Tensor& parameter : module.parameters(/*recurse=*/false)) {
    if (parameter.requires_grad()) {
      return true;
    }
  }
  for (const auto& child : module.children()) {
    if (any_parameter_requires_grad(*child)) {
      return true;
    }
  }
  return false;
}

void check_input_gradient_profiled(
    const char* who,
    const torch::Tensor& input,
    const std::optional<bool>& profiled_input_grad) {
  // An input computed by earlier modules passes its gradient on to them:
  // detaching it would leave them untrained, silently, so only a leaf is
  // offered that way out.
  TORCH_CHECK(
      !input.requires_grad() || profiled_input_grad.value_or(true),
      who,
      "::forward: expected a training input that does not require grad, as "
      "the sample the plan was profiled on (options.input_requires_grad "
      "false), got one that requires grad: its gradient was not measured, "
      "so the peak could exceed the plan's; profile (auto_checkpoint) on a "
      "sample that requires grad",
      input.grad_fn() != nullptr
          ? " (for an input computed by earlier modules: their output for "
            "the sample; do not pass input.detach(), which would leave them "
            "without gradients)"
          : ", or pass input.detach() if its gradient is not needed");
}

void check_stages(const char* who, const std::vector<Stage>& stages) {
  TORCH_CHECK(!stages.empty(), who, ": expected at least one stage, got none");
  for (size_t i = 0; i < stages.size(); ++i) {
    TORCH_CHECK(
        static_cast<bool>(stages[i].forward),
        who,
        ": expected every stage to have a forward, stage ",
        i,
        " has none");
  }
}

std::vector<std::shared_ptr<torch::nn::Module>> modules_of(
    const std::vector<Stage>& stages) {
  std::vector<std::shared_ptr<torch::nn::Module>> modules;
  for (const Stage& stage : stages) {
    if (stage.module &&
        std::find(modules.begin(), modules.end(), stage.module) ==
            modules.end()) {
      modules.push_back(stage.module);
    }
  }
  return modules;
}

torch::Tensor run_stages(
    const std::vector<Stage>& stages, const torch::Tensor& input) {
  torch::Tensor value = input;
  for (const Stage& stage : stages) {
    value = stage.forward(value);
  }
  return value;
}

}  // namespace remat::detail
