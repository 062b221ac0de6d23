// planned_sequential_test.cpp: PlannedSequential against the plain
// Sequential, auto_checkpoint, Budget, explain.
//
// Reference: the same model (same parameters, same buffers, same seed) run
// plainly. For plans from every solver and for random valid plans, on an MLP
// chain with dropout, a ResNet-style CNN chain (BatchNorm) and a GPT-style
// stack: parameter and input gradients and module buffers are bitwise equal,
// every stage is run forward exactly as often as the plan says (counting
// wrappers), and the measured activation peak plus the input bytes is never
// above simulate()'s prediction for the profiled chain, within 10% below it,
// and within the budget. The worst measured/predicted ratio per model is
// printed.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <models/models.h>
#include <torch/torch.h>

#include "remat/planner.h"
#include "remat/remat.h"
#include "test_util.h"

namespace {

using remat::planner::Chain;
using remat::planner::Op;
using remat::planner::OpKind;
using remat::planner::Plan;
using remat::planner::Replay;

/// Wraps one stage and counts its forwards.
class CountingStageImpl : public torch::nn::Module {
 public:
  CountingStageImpl(torch::nn::AnyModule inner, std::shared_ptr<int64_t> count)
      : inner_(std::move(inner)), count_(std::move(count)) {
    register_module("inner", inner_.ptr());
  }
  torch::Tensor forward(const torch::Tensor& input) {
    ++*count_;
    return inner_.forward(input);
  }

 private:
  torch::nn::AnyModule inner_;
  std::shared_ptr<int64_t> count_;
};
TORCH_MODULE(CountingStage);

/// A model under test, its input and a loss probe.
struct Case {
  std::string name;
  torch::nn::Sequential model;
  torch::Tensor input;
  std::vector<std::shared_ptr<int64_t>> counts;
  torch::Tensor probe;  // loss = (output * probe).sum()
  std::vector<torch::Tensor> initial_buffers;
};

Case make_case(
    std::string name, torch::nn::Sequential plain, torch::Tensor input) {
  Case result;
  result.name = std::move(name);
  result.model = torch::nn::Sequential();
  for (auto& child : *plain) {
    result.counts.push_back(std::make_shared<int64_t>(0));
    result.model->push_back(CountingStage(child, result.counts.back()));
  }
  result.input = input;
  {
    torch::NoGradGuard no_grad;
    result.probe = torch::randn_like(plain->forward(input).to(torch::kFloat));
    for (auto& parameter : result.model->parameters()) {
      parameter.mutable_grad() = torch::zeros_like(parameter);
    }
    for (auto& buffer : result.model->buffers()) {
      result.initial_buffers.push_back(buffer.clone());
    }
  }
  return result;
}

Case mlp_case() {
  torch::manual_seed(1);
  auto model = remat::models::mlp_chain(
      remat::models::MlpChainOptions({64, 128, 96, 160, 64, 128, 96, 64, 32})
          .dropout(0.2));
  auto input = torch::randn({64, 64}).requires_grad_(true);
  return make_case("mlp_dropout", model, input);
}

Case resnet_case() {
  torch::manual_seed(2);
  auto model = remat::models::resnet_chain(remat::models::ResNetChainOptions()
                                               .stage_channels({8, 16})
                                               .blocks_per_stage(1)
                                               .classes(5));
  auto input = torch::randn({4, 3, 16, 16});
  return make_case("resnet_bn", model, input);
}

Case gpt_case() {
  torch::manual_seed(3);
  auto model = remat::models::gpt(remat::models::GptOptions()
                                      .vocab(24)
                                      .seq_len(16)
                                      .layers(2)
                                      .hidden(32)
                                      .heads(2)
                                      .dropout(0.1));
  auto input = torch::randint(0, 24, {2, 16}, torch::kLong);
  return make_case("gpt", model, input);
}

struct StepResult {
  std::vector<torch::Tensor> grads;
  torch::Tensor input_grad;
  std::vector<torch::Tensor> buffers;
  std::vector<int64_t> forward_counts;
  int64_t activation_peak_bytes = 0;
};

/// One training step from the case's initial state, seed 1234.
StepResult run_step(
    Case& c, const std::function<torch::Tensor(const torch::Tensor&)>& fn) {
  {
    torch::NoGradGuard no_grad;
    auto buffers = c.model->buffers();
    for (size_t i = 0; i < buffers.size(); ++i) {
      buffers[i].copy_(c.initial_buffers[i]);
    }
    for (auto& parameter : c.model->parameters()) {
      parameter.mutable_grad().zero_();
    }
  }
  for (auto& count : c.counts) {
    *count = 0;
  }
  torch::Tensor input = c.input.detach();
  input.requires_grad_(c.input.requires_grad());
  torch::manual_seed(1234);
  StepResult result;
  {
    remat::MemoryMeter meter;
    auto loss = (fn(input) * c.probe).sum();
    loss.backward();
    // The scalar loss and its seed gradient are outside the chain.
    result.activation_peak_bytes =
        meter.peak_delta_bytes() - 2 * static_cast<int64_t>(loss.nbytes());
  }
  result.grads = remat::testing::grads_of(*c.model);
  result.input_grad = input.grad();
  for (const auto& buffer : c.model->buffers()) {
    result.buffers.push_back(buffer.clone());
  }
  for (const auto& count : c.counts) {
    result.forward_counts.push_back(*count);
  }
  return result;
}

std::vector<int64_t> plan_forward_counts(const Plan& plan, int64_t stages) {
  std::vector<int64_t> counts(stages, 0);
  for (const Op& op : plan.ops) {
    counts[op.stage] += op.kind != OpKind::kBackward;
  }
  return counts;
}

/// Whether the rest of the plan can be completed from `replay` (a greedy
/// completion: record the next backward's stage from the highest held value
/// below it, without saving).
bool completable(Replay replay, int64_t stages, Plan* completion = nullptr) {
  for (int64_t guard = 0; guard < 4 * stages * stages + 8; ++guard) {
    const int64_t next = replay.next_backward_stage();
    if (next < 0) {
      return true;
    }
    Op op;
    if (replay.recorded(next)) {
      op = {OpKind::kBackward, next};
    } else {
      int64_t held = next;
      while (replay.holding(held) == Replay::Holding::kAbsent) {
        --held;
      }
      op = {
          held == next ? OpKind::kForwardRecord : OpKind::kForwardNoSave, held};
    }
    if (!replay.apply(op).empty()) {
      return false;
    }
    if (completion != nullptr) {
      completion->ops.push_back(op);
    }
  }
  return false;
}

/// A random valid plan: a random walk over ops that keep the plan
/// completable, finished greedily after about 3 * stages ops.
Plan random_plan(const Chain& chain, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t stages = chain.size();
  Replay replay(chain);
  Plan plan;
  while (!replay.finished() &&
         static_cast<int64_t>(plan.ops.size()) < 3 * stages) {
    std::vector<Op> candidates;
    for (OpKind kind :
         {OpKind::kForwardNoSave,
          OpKind::kForwardCheckpoint,
          OpKind::kForwardRecord,
          OpKind::kBackward}) {
      for (int64_t stage = 0; stage < stages; ++stage) {
        Replay next = replay;
        if (next.apply({kind, stage}).empty() && completable(next, stages)) {
          candidates.push_back({kind, stage});
        }
      }
    }
    EXPECT_FALSE(candidates.empty());
    const Op op = candidates[rng() % candidates.size()];
    replay.apply(op);
    plan.ops.push_back(op);
  }
  EXPECT_TRUE(completable(replay, stages, &plan));
  return plan;
}

struct NamedPlan {
  std::string name;
  Plan plan;
  int64_t budget_bytes = -1;  // -1: no budget
};

std::vector<NamedPlan> plans_for(const Chain& chain) {
  namespace planner = remat::planner;
  std::vector<NamedPlan> plans;
  const int64_t stages = chain.size();
  plans.push_back({"store_all", planner::solve_store_all(chain)});
  for (int64_t k = 1; k <= stages; ++k) {
    plans.push_back(
        {"uniform(" + std::to_string(k) + ")",
         planner::solve_uniform(chain, k)});
  }
  plans.push_back({"sqrt", planner::solve_sqrt(chain)});
  const int64_t minimum = planner::min_feasible_budget_bytes(chain);
  const int64_t store_all =
      planner::simulate(chain, planner::solve_store_all(chain)).peak_bytes;
  for (double fraction : {0.0, 0.15, 0.35, 0.6, 0.85, 1.0, 1.2}) {
    const int64_t budget =
        minimum + static_cast<int64_t>(
                      fraction * static_cast<double>(store_all - minimum));
    if (auto plan = planner::solve_optimal(chain, budget)) {
      plans.push_back({"optimal@" + std::to_string(budget), *plan, budget});
    }
    if (auto plan = planner::solve_chen_greedy(chain, budget)) {
      plans.push_back({"chen_greedy@" + std::to_string(budget), *plan, budget});
    }
  }
  for (uint32_t seed = 1; seed <= 8; ++seed) {
    plans.push_back(
        {"random(seed=" + std::to_string(seed) + ")",
         random_plan(chain, seed)});
  }
  return plans;
}

/// The whole check for one model; returns the worst measured/predicted ratio.
void check_every_plan(Case c) {
  const Chain chain = remat::profile_chain(
      c.model, c.input, remat::ProfileOptions().warmup(0).repeats(1));
  const StepResult reference =
      run_step(c, [&](const torch::Tensor& x) { return c.model->forward(x); });
  const int64_t store_all_peak =
      remat::planner::simulate(chain, remat::planner::solve_store_all(chain))
          .peak_bytes;
  double worst_ratio = 1.0;
  std::string worst_plan;
  for (const NamedPlan& named : plans_for(chain)) {
    SCOPED_TRACE(
        c.name + " plan " + named.name + ": " + named.plan.to_string());
    const auto simulation = remat::planner::simulate(chain, named.plan);
    ASSERT_TRUE(simulation.valid) << simulation.error;
    remat::PlannedSequential net(c.model, named.plan);
    const StepResult result =
        run_step(c, [&](const torch::Tensor& x) { return net->forward(x); });
    remat::testing::expect_all_bitwise_equal(
        reference.grads, result.grads, "parameter grads");
    // An image input needs no gradient; an input that requires one has one.
    EXPECT_EQ(result.input_grad.defined(), c.input.requires_grad());
    EXPECT_TRUE(remat::testing::bitwise_equal_or_both_undefined(
        reference.input_grad, result.input_grad))
        << "input grad";
    remat::testing::expect_all_bitwise_equal(
        reference.buffers, result.buffers, "buffers");
    EXPECT_EQ(
        result.forward_counts, plan_forward_counts(named.plan, chain.size()));
    const int64_t measured = result.activation_peak_bytes + chain.input_bytes();
    const double ratio = static_cast<double>(measured) /
                         static_cast<double>(simulation.peak_bytes);
    // Never above the prediction (so a plan within its budget is within it
    // when run), and within 10% below it.
    EXPECT_LE(measured, simulation.peak_bytes)
        << "measured " << measured << " predicted " << simulation.peak_bytes;
    EXPECT_GE(measured, static_cast<int64_t>(0.90 * simulation.peak_bytes))
        << "measured " << measured << " predicted " << simulation.peak_bytes;
    if (std::abs(ratio - 1.0) > std::abs(worst_ratio - 1.0)) {
      worst_ratio = ratio;
      worst_plan = named.name;
    }
    if (named.budget_bytes > 0) {
      EXPECT_LE(measured, named.budget_bytes);
      if (named.budget_bytes >= store_all_peak) {
        EXPECT_EQ(result.forward_counts, std::vector<int64_t>(chain.size(), 1))
            << "a budget >= the store-all peak recomputes nothing";
      }
    }
  }
  std::cout << "[ peak     ] " << c.name << ": worst measured/predicted "
            << worst_ratio << " (" << worst_plan << "), store-all predicted "
            << store_all_peak << " bytes\n";
}

TEST(PlannedSequential, MatchesPlainSequentialOnMlpWithDropout) {
  check_every_plan(mlp_case());
}

TEST(PlannedSequential, MatchesPlainSequentialOnResNetWithBatchNorm) {
  check_every_plan(resnet_case());
}

TEST(PlannedSequential, MatchesPlainSequentialOnGpt) {
  check_every_plan(gpt_case());
}

// One module used by several stages: its gradient terms are summed in the
// plain backward's order under every plan (bitwise on CPU).
TEST(PlannedSequential, AModuleSharedByStagesGetsThePlainGradient) {
  torch::manual_seed(0);
  torch::nn::Linear shared(8, 8);
  torch::nn::Sequential model(
      shared, torch::nn::Tanh(), shared, torch::nn::Tanh(), shared);
  const torch::Tensor x = torch::randn({4, 8});
  const auto weight_grad = [&](const std::function<torch::Tensor()>& run) {
    shared->weight.mutable_grad() = torch::Tensor();
    shared->bias.mutable_grad() = torch::Tensor();
    run().pow(2).sum().backward();
    return shared->weight.grad().clone();
  };
  const torch::Tensor plain = weight_grad([&] { return model->forward(x); });
  for (const char* text :
       {"R0 R1 R2 R3 R4 B4 B3 B2 B1 B0",
        "R0 C1 N2 N3 R4 B4 R1 R2 R3 B3 B2 B1 B0",
        "R0 R1 C2 N3 R4 B4 R2 R3 B3 B2 B1 B0"}) {
    remat::PlannedSequential net(model, remat::planner::plan_from_string(text));
    EXPECT_TRUE(
        torch::equal(weight_grad([&] { return net->forward(x); }), plain))
        << text;
  }
}

// The caller switches train()/eval() between forward and backward (a
// validation loss logged before backward): the recomputation still runs as
// the forward ran, and the gradients are the plain run's; the caller's flags
// hold after backward.
TEST(PlannedSequential, RecomputesInTheModeOfTheForward) {
  const torch::Tensor x = torch::randn({8, 16});
  for (const bool forward_training : {true, false}) {
    torch::manual_seed(0);
    torch::nn::Sequential model(
        torch::nn::Linear(16, 16),
        torch::nn::BatchNorm1d(16),
        torch::nn::Dropout(0.5),
        torch::nn::Tanh(),
        torch::nn::Linear(16, 1));
    torch::nn::Sequential copy =
        std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone());
    const auto grads_after = [&](torch::nn::Module& holder,
                                 const std::function<torch::Tensor()>& run) {
      holder.train(forward_training);
      torch::manual_seed(1);
      const torch::Tensor out = run();
      holder.train(!forward_training);
      out.pow(2).sum().backward();
      std::vector<torch::Tensor> grads;
      for (const torch::Tensor& p : holder.parameters()) {
        grads.push_back(p.grad().clone());
      }
      return grads;
    };
    const auto plain = grads_after(*model, [&] { return model->forward(x); });
    remat::PlannedSequential net(
        copy,
        remat::planner::plan_from_string(
            "C0 N1 R2 R3 R4 B4 B3 B2 R0 R1 B1 B0"));
    const auto planned = grads_after(*net, [&] { return net->forward(x); });
    remat::testing::expect_all_bitwise_equal(
        plain,
        planned,
        forward_training ? "train, then eval" : "eval, then train");
    EXPECT_EQ(copy[1]->is_training(), !forward_training);
  }
}

// A parameter changed in place between forward and backward: plain autograd
// uses what it saved; a recomputation would read the new value, so it is
// refused, naming the stage.
TEST(
    PlannedSequential, RefusesToRecomputeWithParametersChangedSinceTheForward) {
  torch::nn::Sequential model(
      torch::nn::Linear(8, 8), torch::nn::Tanh(), torch::nn::Linear(8, 1));
  remat::PlannedSequential net(
      model, remat::planner::plan_from_string("C0 N1 R2 B2 R0 R1 B1 B0"));
  const torch::Tensor loss = net->forward(torch::randn({4, 8})).sum();
  {
    torch::NoGradGuard no_grad;
    model[0]->as<torch::nn::Linear>()->weight.mul_(0.5);
  }
  try {
    loss.backward();
    ADD_FAILURE() << "expected an error";
  } catch (const c10::Error& error) {
    EXPECT_NE(
        std::string(error.what())
            .find("a parameter of stage 0's module was "
                  "modified in place"),
        std::string::npos)
        << error.what();
  }
}

// A last stage that detaches its output: backward is the error plain
// autograd gives, not a silent step without gradients.
TEST(PlannedSequential, AnOutputWithoutAGraphTrainsNothingAsInPlainAutograd) {
  struct DetachImpl : torch::nn::Module {
    torch::Tensor forward(const torch::Tensor& x) {
      return x.detach() * 2;
    }
  };
  TORCH_MODULE(Detach);
  torch::nn::Sequential model(
      torch::nn::Linear(8, 8), torch::nn::Tanh(), Detach());
  const torch::Tensor x = torch::randn({4, 8});
  EXPECT_THROW(model->forward(x).sum().backward(), c10::Error);
  remat::PlannedSequential net(
      model, remat::planner::plan_from_string("C0 N1 R2 B2 R0 R1 B1 B0"));
  const torch::Tensor out = net->forward(x);
  EXPECT_FALSE(out.requires_grad());
  EXPECT_THROW(out.sum().backward(), c10::Error);
}

// Children added after construction: forward refuses to skip them, and
// reset() checks the plan against them (a plan of two stages fits three no
// longer), leaving the module as it was.
TEST(PlannedSequential, ChildrenAddedLaterNeedAReset) {
  torch::nn::Sequential model(torch::nn::Linear(8, 8), torch::nn::Tanh());
  remat::PlannedSequential net(
      model, remat::planner::plan_from_string("R0 R1 B1 B0"));
  model->push_back(torch::nn::Linear(8, 2));
  const torch::Tensor x = torch::randn({4, 8});
  EXPECT_THROW(net->forward(x), c10::Error);
  EXPECT_THROW(net->reset(), c10::Error);     // the plan has two stages
  EXPECT_THROW(net->forward(x), c10::Error);  // still as it was
}

TEST(PlannedSequential, EvaluationUnderNoGradRunsThePlainForward) {
  Case c = mlp_case();
  c.model->eval();
  const Chain chain = remat::profile_chain(c.model, c.input);
  remat::PlannedSequential net(
      c.model, remat::planner::solve_uniform(chain, 2));
  torch::NoGradGuard no_grad;
  const auto expected = c.model->forward(c.input);
  for (auto& count : c.counts) {
    *count = 0;
  }
  const auto actual = net->forward(c.input);
  EXPECT_TRUE(remat::testing::bitwise_equal(expected, actual));
  for (const auto& count : c.counts) {
    EXPECT_EQ(*count, 1);
  }
}

TEST(PlannedSequential, RejectsPlansThatDoNotFitTheSequential) {
  Case c = mlp_case();  // 8 stages
  const Plan four = remat::planner::plan_from_string("R0 R1 R2 R3 B3 B2 B1 B0");
  try {
    remat::PlannedSequential net(c.model, four);
    FAIL() << "expected an error";
  } catch (const c10::Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("remat::PlannedSequential"), std::string::npos);
    EXPECT_NE(message.find("8 stages"), std::string::npos) << message;
  }
  EXPECT_THROW(
      remat::PlannedSequential(
          c.model,
          remat::planner::plan_from_string(
              "N0 R1 R2 R3 R4 R5 R6 R7 B7 B6 B5 B4 B3 B2 B1 B0")),
      c10::Error);
  EXPECT_THROW(
      remat::PlannedSequential(torch::nn::Sequential(), four), c10::Error);
}

TEST(PlannedSequential, RefusesAutogradGradWithExplicitInputs) {
  Case c = resnet_case();  // BatchNorm buffers: profiling must not move them
  const Chain chain = remat::profile_chain(c.model, c.input);
  remat::PlannedSequential net(c.model, remat::planner::solve_sqrt(chain));
  auto input = c.input.detach().requires_grad_(true);
  auto loss = net->forward(input).sum();
  EXPECT_THROW(torch::autograd::grad({loss}, {input}), c10::Error);
}

TEST(PlannedSequential, ClonesDeeplyAndPrintsItsPlan) {
  auto model = remat::models::uniform_mlp_chain(5, 16);
  const Chain chain = remat::profile_chain(model, torch::randn({4, 16}));
  remat::PlannedSequential net(model, remat::planner::solve_sqrt(chain));
  auto copy =
      std::dynamic_pointer_cast<remat::PlannedSequentialImpl>(net->clone());
  ASSERT_TRUE(copy);
  EXPECT_EQ(copy->plan(), net->plan());
  const auto original = net->parameters();
  const auto cloned = copy->parameters();
  ASSERT_EQ(original.size(), cloned.size());
  for (size_t i = 0; i < original.size(); ++i) {
    EXPECT_NE(original[i].data_ptr(), cloned[i].data_ptr());
    EXPECT_TRUE(torch::equal(original[i], cloned[i]));
  }
  std::ostringstream text;
  text << *net;
  EXPECT_NE(
      text.str().find("remat::PlannedSequential(stages=5"), std::string::npos)
      << text.str();
}

TEST(AutoCheckpoint, FitsTheBudgetAndMatchesThePlainGradients) {
  Case c = mlp_case();
  const StepResult reference =
      run_step(c, [&](const torch::Tensor& x) { return c.model->forward(x); });
  for (double fraction : {0.7, 0.85}) {
    auto net = remat::auto_checkpoint(
        c.model, c.input, remat::Budget::fraction(fraction));
    const StepResult result =
        run_step(c, [&](const torch::Tensor& x) { return net->forward(x); });
    remat::testing::expect_all_bitwise_equal(
        reference.grads, result.grads, "auto_checkpoint grads");
    const Chain chain = remat::profile_chain(c.model, c.input);
    const int64_t budget =
        remat::Budget::fraction(fraction).resolve_bytes(chain);
    EXPECT_LE(result.activation_peak_bytes + chain.input_bytes(), budget);
  }
}

TEST(AutoCheckpoint, AtTheStoreAllPeakRecomputesNothing) {
  Case c = mlp_case();
  auto net =
      remat::auto_checkpoint(c.model, c.input, remat::Budget::fraction(1.0));
  const StepResult result =
      run_step(c, [&](const torch::Tensor& x) { return net->forward(x); });
  EXPECT_EQ(result.forward_counts, std::vector<int64_t>(c.counts.size(), 1));
}

TEST(AutoCheckpoint, ABudgetBelowTheMinimumStatesTheMinimum) {
  Case c = resnet_case();  // BatchNorm buffers: profiling must not move them
  const Chain chain = remat::profile_chain(c.model, c.input);
  const int64_t minimum = remat::planner::min_feasible_budget_bytes(chain);
  try {
    remat::auto_checkpoint(c.model, c.input, remat::Budget::bytes(minimum - 1));
    FAIL() << "expected an error";
  } catch (const c10::Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(std::to_string(minimum)), std::string::npos)
        << message;
    EXPECT_NE(message.find(std::to_string(minimum - 1)), std::string::npos)
        << message;
  }
  EXPECT_THROW(remat::Budget::bytes(0), c10::Error);
  EXPECT_THROW(remat::Budget::fraction(-0.5), c10::Error);
}

TEST(AutoCheckpoint, AnotherInputShapeIsAnErrorNamingBothShapes) {
  Case c = mlp_case();
  auto net =
      remat::auto_checkpoint(c.model, c.input, remat::Budget::fraction(0.8));
  try {
    net->forward(torch::randn({32, 64}));
    FAIL() << "expected an error";
  } catch (const c10::Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("[64, 64]"), std::string::npos) << message;
    EXPECT_NE(message.find("[32, 64]"), std::string::npos) << message;
  }
}

/// auto_checkpoint of `model` with ShapePolicy::kReplan.
remat::PlannedSequential replanning(
    torch::nn::Sequential model,
    const torch::Tensor& sample,
    remat::Budget budget) {
  return remat::auto_checkpoint(
      std::move(model),
      sample,
      budget,
      remat::AutoCheckpointOptions().on_shape_change(
          remat::ShapePolicy::kReplan));
}

TEST(AutoCheckpoint, ReplansForAnotherInputShapeWhenAskedTo) {
  Case c = mlp_case();
  auto net = replanning(c.model, c.input, remat::Budget::fraction(0.8));
  c.input = torch::randn({16, 64}).requires_grad_(true);
  c.probe = torch::randn({16, 32});
  const StepResult reference =
      run_step(c, [&](const torch::Tensor& x) { return c.model->forward(x); });
  const StepResult result =
      run_step(c, [&](const torch::Tensor& x) { return net->forward(x); });
  remat::testing::expect_all_bitwise_equal(
      reference.grads, result.grads, "grads after re-planning");
  EXPECT_EQ(net->options.input_shape(), std::vector<int64_t>({16, 64}));
}

// A profile on a sample that needs no gradient measures no input gradient
// (as the runtime computes none). A training input that requires grad would
// compute one the plan never counted: a Conv2d first stage's input gradient
// and its working set took the peak 24 % above the budget. It is refused,
// naming the option, before anything runs; with kReplan, a new shape is
// profiled as the first sample was (with an input gradient when it had one),
// so that a later input of that shape that requires grad fits too.
TEST(AutoCheckpoint, AnInputGradientTheProfileDidNotMeasureIsRefused) {
  torch::manual_seed(3);
  torch::nn::Sequential model(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)),
      torch::nn::ReLU(),
      torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 8, 3).padding(1)));
  const torch::Tensor images = torch::randn({4, 3, 16, 16});  // no grad
  const remat::Budget budget = remat::Budget::parse("100%");
  auto net = remat::auto_checkpoint(model, images, budget);
  ASSERT_EQ(net->options.input_requires_grad(), std::optional<bool>(false));
  for (auto& p : model->parameters()) {
    p.mutable_grad() = torch::full_like(p, 0.5);
  }
  const torch::Tensor x = images.clone().requires_grad_(true);
  try {
    net->forward(x).sum().backward();
    FAIL() << "expected an error";
  } catch (const c10::Error& error) {
    const std::string message = error.what_without_backtrace();
    EXPECT_NE(message.find("input_requires_grad"), std::string::npos)
        << message;
  }
  EXPECT_FALSE(x.grad().defined());
  for (const auto& p : model->parameters()) {
    EXPECT_TRUE(torch::equal(p.grad(), torch::full_like(p, 0.5)));
  }
  // An input like the sample still trains.
  net->forward(images).sum().backward();

  // kReplan on a sample that requires grad: another shape is profiled with
  // an input gradient even when its first input has none.
  auto replan = remat::auto_checkpoint(
      model,
      images.clone().requires_grad_(true),
      budget,
      remat::AutoCheckpointOptions().on_shape_change(
          remat::ShapePolicy::kReplan));
  const torch::Tensor small = torch::randn({2, 3, 8, 8});
  replan->forward(small).sum().backward();
  ASSERT_EQ(replan->options.input_shape(), std::vector<int64_t>({2, 3, 8, 8}));
  const remat::planner::Chain with_grad = remat::profile_chain(
      model,
      small.clone().requires_grad_(true),
      remat::ProfileOptions().warmup(0).repeats(1));
  ASSERT_TRUE(replan->options.chain().has_value());
  EXPECT_EQ(
      replan->options.chain()->stage(0).backward_tmp_bytes,
      with_grad.stage(0).backward_tmp_bytes);
}

// A refused input computed by earlier modules (head(x)) must not be told to
// pass input.detach(): that trains the earlier modules on no gradient,
// silently. A leaf input may still be told so (its gradient is optional).
TEST(AutoCheckpoint, ARefusedInputFromEarlierModulesIsNotToldToDetach) {
  torch::manual_seed(3);
  torch::nn::Linear head(8, 8);
  torch::nn::Sequential body(
      torch::nn::Linear(8, 8), torch::nn::Tanh(), torch::nn::Linear(8, 8));
  const torch::Tensor sample = torch::randn({4, 8});  // no grad
  auto net = remat::auto_checkpoint(body, sample, remat::Budget::parse("100%"));
  const torch::Tensor x = torch::randn({4, 8});
  try {
    net->forward(head(x)).sum().backward();
    FAIL() << "expected an error";
  } catch (const c10::Error& error) {
    const std::string message = error.what_without_backtrace();
    EXPECT_NE(message.find("input_requires_grad"), std::string::npos)
        << message;
    EXPECT_TRUE(
        message.find("pass input.detach()") == std::string::npos ||
        message.find("do not pass input.detach()") != std::string::npos)
        << message;
  }
  EXPECT_FALSE(head->weight.grad().defined());
}

TEST(AutoCheckpoint, ReusesThePlanOfAShapeSeenBeforeWithoutProfiling) {
  Case c = mlp_case();
  auto net = replanning(c.model, c.input, remat::Budget::fraction(0.5));
  const std::vector<int64_t> first_shape = c.input.sizes().vec();
  const Plan first_plan = net->plan();
  const torch::Tensor first_input = c.input;
  const torch::Tensor small_input = torch::randn({16, 64}).requires_grad_(true);
  const int64_t stages = static_cast<int64_t>(c.counts.size());
  const torch::Tensor first_probe = c.probe;
  const torch::Tensor small_probe = torch::randn({16, 32});
  const auto step = [&](const torch::Tensor& input) {
    c.input = input;
    c.probe = input.size(0) == 16 ? small_probe : first_probe;
    return run_step(c, [&](const torch::Tensor& x) { return net->forward(x); });
  };

  step(small_input);  // a new shape: profiled and solved once
  ASSERT_EQ(net->plans_by_shape().size(), 2u);
  const Plan small_plan = net->plan();
  // Back and forth between the two shapes: each step runs only its plan's
  // forwards (profiling would run every stage many more times).
  for (int round = 0; round < 2; ++round) {
    for (const auto& [input, plan] :
         {std::pair{first_input, first_plan},
          std::pair{small_input, small_plan}}) {
      SCOPED_TRACE("round " + std::to_string(round));
      const StepResult result = step(input);
      EXPECT_EQ(net->plan(), plan);
      EXPECT_EQ(result.forward_counts, plan_forward_counts(plan, stages));
      EXPECT_EQ(net->options.input_shape(), input.sizes().vec());
    }
  }
  EXPECT_EQ(net->plans_by_shape().size(), 2u);
  EXPECT_EQ(net->plans_by_shape().at(first_shape), first_plan);
}

TEST(AutoCheckpoint, ACloneKeepsThePlansByShape) {
  torch::manual_seed(4);
  auto net = replanning(
      remat::models::mlp_chain(remat::models::MlpChainOptions({32, 64, 48})),
      torch::randn({8, 32}),
      remat::Budget::fraction(1.0));
  net->forward(torch::randn({4, 32}));
  ASSERT_EQ(net->plans_by_shape().size(), 2u);
  auto copy =
      std::dynamic_pointer_cast<remat::PlannedSequentialImpl>(net->clone());
  ASSERT_NE(copy, nullptr);
  EXPECT_EQ(copy->plans_by_shape(), net->plans_by_shape());
  EXPECT_EQ(copy->options.input_shape(), std::vector<int64_t>({4, 32}));
}

TEST(AutoCheckpoint, AnInfeasibleReplanLeavesTheModuleAsItWas) {
  Case c = resnet_case();  // BatchNorm buffers: profiling must not move them
  const Chain chain = remat::profile_chain(c.model, c.input);
  // Enough for the sample's shape, not for 4x its batch.
  const int64_t budget =
      remat::planner::simulate(chain, remat::planner::solve_store_all(chain))
          .peak_bytes;
  auto net = replanning(c.model, c.input, remat::Budget::bytes(budget));
  const Plan plan = net->plan();
  std::vector<torch::Tensor> buffers;
  for (const auto& buffer : c.model->buffers()) {
    buffers.push_back(buffer.clone());
  }
  ASSERT_FALSE(buffers.empty());
  EXPECT_THROW(net->forward(torch::randn({16, 3, 16, 16})), c10::Error);
  EXPECT_EQ(net->plan(), plan);
  EXPECT_EQ(net->options.input_shape(), c.input.sizes().vec());
  EXPECT_EQ(net->plans_by_shape().size(), 1u);
  remat::testing::expect_all_bitwise_equal(
      buffers, c.model->buffers(), "buffers after a failed re-plan");
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream stream(text);
  for (std::string line; std::getline(stream, line);) {
    lines.push_back(line);
  }
  return lines;
}

TEST(Explain, ShowsStagesOpsAndThePredictedPeak) {
  const Chain chain(
      {remat::planner::StageCost{1, 2, 100, 150},
       remat::planner::StageCost{1, 2, 100, 100},
       remat::planner::StageCost{1, 2, 100, 100}},
      100);
  const Plan plan = remat::planner::solve_uniform(chain, 2);
  const std::string text = remat::explain(chain, plan);
  const auto simulation = remat::planner::simulate(chain, plan);
  EXPECT_NE(text.find("predicted peak"), std::string::npos) << text;
  EXPECT_NE(
      text.find(std::to_string(simulation.peak_bytes) + " bytes"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("C0  forward_checkpoint"), std::string::npos) << text;
  EXPECT_NE(
      remat::explain(chain, remat::planner::plan_from_string("B0"))
          .find("invalid plan"),
      std::string::npos);
}

TEST(Explain, AlignsItsColumnsForLongChains) {
  // 12 stages: two-digit stages and op indices, MiB sizes, a plan with
  // checkpoints and recomputations.
  std::vector<remat::planner::StageCost> stages;
  for (int i = 0; i < 12; ++i) {
    remat::planner::StageCost cost;
    cost.forward_ms = 1.5 + i * 100;
    cost.backward_ms = 3;
    cost.output_bytes = (int64_t{1} << 20) * (1 + i % 3);
    cost.saved_bytes = 3 * cost.output_bytes;
    cost.forward_tmp_bytes = i % 2 == 0 ? cost.output_bytes : 0;
    stages.push_back(cost);
  }
  const Chain chain(stages, 1 << 20);
  const auto solved = remat::planner::solve_optimal(
      chain, remat::planner::min_feasible_budget_bytes(chain));
  ASSERT_TRUE(solved.has_value());
  const Plan& plan = *solved;
  const std::string plan_text = plan.to_string();
  ASSERT_NE(plan_text.find('C'), std::string::npos) << plan_text;
  ASSERT_NE(plan_text.find("R10"), std::string::npos) << plan_text;
  const std::string text = remat::explain(chain, plan);
  const std::vector<std::string> lines = lines_of(text);

  // Stage table: the first line is its header; the "keeps" column starts at
  // the same offset in every row, after two blanks.
  ASSERT_GE(lines.size(), 13u) << text;
  const size_t keeps = lines[0].find("keeps");
  ASSERT_NE(keeps, std::string::npos) << text;
  for (size_t row = 1; row <= 12; ++row) {
    ASSERT_GT(lines[row].size(), keeps) << lines[row];
    EXPECT_EQ(lines[row].substr(keeps - 2, 2), "  ") << text;
    EXPECT_NE(lines[row][keeps], ' ') << text;
  }

  // Op table: right-aligned last column, so every row is as long as the
  // header; op label and kind in their own columns.
  size_t header = 0;
  while (header < lines.size() &&
         (lines[header].find("kind") == std::string::npos ||
          lines[header].find("peak in op") == std::string::npos)) {
    ++header;
  }
  ASSERT_LT(header, lines.size()) << text;
  const size_t kind = lines[header].find("kind");
  ASSERT_NE(kind, std::string::npos);
  for (size_t k = 0; k < plan.ops.size(); ++k) {
    const std::string& row = lines[header + 1 + k];
    EXPECT_EQ(row.size(), lines[header].size()) << text;
    EXPECT_EQ(row.substr(kind - 2, 2), "  ") << text;
    const remat::planner::Op& op = plan.ops[k];
    EXPECT_EQ(
        row.substr(
            kind, std::string(remat::planner::op_kind_name(op.kind)).size()),
        remat::planner::op_kind_name(op.kind))
        << row;
    const std::string label =
        std::string(1, remat::planner::op_kind_letter(op.kind)) +
        std::to_string(op.stage) + " ";
    EXPECT_NE(row.find(" " + label), std::string::npos) << row;
  }
}

/// Three Linear(width, width) + Tanh layers.
torch::nn::Sequential three_tanh_layers(int64_t width) {
  torch::nn::Sequential model;
  for (int layer = 0; layer < 3; ++layer) {
    model->push_back(torch::nn::Linear(width, width));
    model->push_back(torch::nn::Tanh());
  }
  return model;
}

// A forward that needs no gradient (evaluation under NoGradGuard, on a data
// or validation thread) runs the Sequential plainly: it must neither re-plan
// (profile_chain writes the parameters' .grad, the buffers and the RNG while
// it runs) nor refuse another shape.
TEST(PlannedSequential, EvaluationOfAnotherShapeNeitherReplansNorThrows) {
  torch::manual_seed(6);
  torch::nn::Sequential model = three_tanh_layers(32);
  const torch::Tensor train_input = torch::randn({8, 32});
  const torch::Tensor eval_input = torch::randn({5, 32});
  for (const auto policy :
       {remat::ShapePolicy::kError, remat::ShapePolicy::kReplan}) {
    auto net = remat::auto_checkpoint(
        model,
        train_input,
        remat::Budget::fraction(1.0),
        remat::AutoCheckpointOptions().on_shape_change(policy));
    const Plan plan = net->plan();
    torch::NoGradGuard no_grad;
    torch::Tensor expected = model->forward(eval_input);
    torch::Tensor actual;
    EXPECT_NO_THROW(actual = net->forward(eval_input));
    EXPECT_TRUE(remat::testing::bitwise_equal(expected, actual));
    EXPECT_EQ(net->plans_by_shape().size(), 1u);
    EXPECT_EQ(net->plan(), plan);
    EXPECT_EQ(net->options.input_shape(), train_input.sizes().vec());
  }
}

TEST(PlannedSequential, EvaluationOnAnotherThreadLeavesTrainingGradientsExact) {
  torch::manual_seed(6);
  torch::nn::Sequential model = three_tanh_layers(64);
  const torch::Tensor x = torch::randn({32, 64});
  auto zero_grads = [&] {
    for (auto& p : model->parameters()) {
      p.mutable_grad() = torch::Tensor();
    }
  };
  for (int warm = 0; warm < 2; ++warm) {
    zero_grads();
    model->forward(x).pow(2).sum().backward();
  }
  const auto expected = remat::testing::grads_of(*model);
  auto net = remat::auto_checkpoint(
      model,
      x,
      remat::Budget::fraction(1.0),
      remat::AutoCheckpointOptions().on_shape_change(
          remat::ShapePolicy::kReplan));
  std::atomic<bool> stop{false};
  std::thread evaluation([&] {
    torch::NoGradGuard no_grad;
    for (int64_t batch = 1; !stop; batch = batch % 31 + 1) {
      (void)net->forward(torch::ones({batch, 64}));
    }
  });
  for (int step = 0; step < 20; ++step) {
    zero_grads();
    net->forward(x).pow(2).sum().backward();
    remat::testing::expect_all_bitwise_equal(
        expected,
        remat::testing::grads_of(*model),
        "step " + std::to_string(step));
  }
  stop = true;
  evaluation.join();
}

}  // namespace
