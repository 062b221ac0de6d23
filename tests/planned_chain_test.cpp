// planned_chain_test.cpp: PlannedChain and auto_checkpoint over a
// std::vector<Stage> against the stages run plainly.
//
// The chain: residual blocks that take a mask captured by their stage
// (x + mask * fc2(dropout(relu(bn(fc1(x)))))), between a parameter-free
// first stage and a head. Under auto_checkpoint at 50 % of the store-all peak
// and at the minimum feasible budget: parameter and input gradients and the
// BatchNorm buffers are bitwise those of the plain run (buffers updated once
// per step), and the measured activation peak plus the input bytes is within
// the budget, never above simulate()'s prediction, and within 10 % below it.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <models/models.h>
#include <torch/torch.h>

#include "planning/plan_executor.h"
#include "remat/remat.h"
#include "test_util.h"

namespace {

using remat::testing::bitwise_equal;
using remat::testing::expect_all_bitwise_equal;
using remat::testing::expect_same_step;
using remat::testing::grads_of;

/// A residual block whose forward takes a mask besides its input.
struct MaskedBlockImpl : torch::nn::Module {
  explicit MaskedBlockImpl(int64_t width) {
    fc1 = register_module("fc1", torch::nn::Linear(width, 2 * width));
    bn = register_module("bn", torch::nn::BatchNorm1d(2 * width));
    dropout = register_module("dropout", torch::nn::Dropout(0.2));
    fc2 = register_module("fc2", torch::nn::Linear(2 * width, width));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask) {
    return x + mask * fc2(dropout(torch::relu(bn(fc1(x)))));
  }
  torch::nn::Linear fc1{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  torch::nn::Dropout dropout{nullptr};
  torch::nn::Linear fc2{nullptr};
};
TORCH_MODULE(MaskedBlock);

/// The chain, its modules (in one ModuleList, for gradients and buffers) and
/// an input.
struct MaskedChain {
  std::vector<remat::Stage> stages;
  torch::nn::ModuleList modules;
  torch::Tensor input;
  std::vector<torch::Tensor> initial_buffers;

  explicit MaskedChain(
      int64_t blocks = 8, int64_t width = 64, int64_t batch = 128) {
    torch::manual_seed(3);
    const torch::Tensor mask = (torch::rand({width}) > 0.25).to(torch::kFloat);
    // A parameter-free stage (no module).
    stages.push_back(
        {[](const torch::Tensor& x) { return torch::tanh(x); }, nullptr});
    for (int64_t i = 0; i < blocks; ++i) {
      MaskedBlock block(width);
      modules->push_back(block);
      stages.push_back(
          {[block, mask](const torch::Tensor& x) mutable {
             return block->forward(x, mask);
           },
           block.ptr()});
    }
    torch::nn::Linear head(width, 8);
    modules->push_back(head);
    stages.push_back(
        {[head](const torch::Tensor& x) mutable { return head(x); },
         head.ptr()});
    input = torch::randn({batch, width}, torch::requires_grad());
    for (const auto& buffer : modules->buffers()) {
      initial_buffers.push_back(buffer.clone());
    }
  }

  // rng_after is not kept: the chains are compared on gradients and buffers.
  using Step = remat::testing::MeasuredStep;

  /// One training step from the initial buffers, seed 99.
  Step step(const std::function<torch::Tensor(const torch::Tensor&)>& forward) {
    return remat::testing::measured_step(
        *modules, initial_buffers, input, forward);
  }

  torch::Tensor plain(const torch::Tensor& x) const {
    torch::Tensor value = x;
    for (const auto& stage : stages) {
      value = stage.forward(value);
    }
    return value;
  }
};

TEST(
    PlannedChain,
    AutoCheckpointOfMaskedBlocksMatchesThePlainRunWithinTheBudget) {
  MaskedChain chain;
  const MaskedChain::Step plain =
      chain.step([&](const torch::Tensor& x) { return chain.plain(x); });
  const remat::planner::Chain profiled = remat::profile_chain(
      chain.stages, chain.input, remat::ProfileOptions().warmup(0).repeats(1));
  ASSERT_EQ(profiled.size(), static_cast<int64_t>(chain.stages.size()));
  const int64_t minimum = remat::planner::min_feasible_budget_bytes(profiled);
  for (const remat::Budget& budget :
       {remat::Budget::parse("50%"), remat::Budget::bytes(minimum)}) {
    SCOPED_TRACE("budget " + budget.to_string());
    remat::PlannedChain net = remat::auto_checkpoint(
        chain.stages,
        chain.input,
        budget,
        remat::AutoCheckpointOptions().profile(
            remat::ProfileOptions().warmup(0).repeats(1)));
    const MaskedChain::Step planned =
        chain.step([&](const torch::Tensor& x) { return net->forward(x); });
    expect_same_step(plain, planned);
    // The plan of this run, predicted on the chain auto_checkpoint profiled
    // (the same model and sample as `profiled`).
    const auto simulation = remat::planner::simulate(profiled, net->plan());
    ASSERT_TRUE(simulation.valid) << simulation.error;
    const int64_t measured =
        planned.activation_peak_bytes + profiled.input_bytes();
    EXPECT_LE(measured, budget.resolve_bytes(profiled));
    EXPECT_LE(measured, simulation.peak_bytes);
    EXPECT_GE(measured, static_cast<int64_t>(0.9 * simulation.peak_bytes))
        << "measured " << measured << ", predicted " << simulation.peak_bytes;
    EXPECT_NE(net->plan().to_string().find('C'), std::string::npos)
        << "a budget under the store-all peak checkpoints: "
        << net->plan().to_string();
  }
}

// With a selective policy every block gets a third way to run (keep the
// matmul outputs, recompute batch norm, relu, dropout and the mask product).
// The plans are made on the profiled memory with fixed times (a selective
// backward recomputes a quarter of the forward), so which budgets pay off
// does not depend on how busy the machine is. Budgets from 20 % to 90 % of
// the store-all peak: the plans that run some stage selectively (S) must
// match the plain run bitwise, with the dropout masks replayed and the
// buffers moved once, and the measured peak must be within the budget and
// within 10 % below simulate()'s prediction. auto_checkpoint with the policy
// (measured times) keeps the same guarantees at 40 %.
TEST(PlannedChain, SelectiveStagesMatchThePlainRunWithinTheBudget) {
  MaskedChain chain;
  const MaskedChain::Step plain =
      chain.step([&](const torch::Tensor& x) { return chain.plain(x); });
  const auto profile = remat::ProfileOptions().warmup(0).repeats(1);
  const auto policy = remat::policies::save_compute_intensive();
  const remat::planner::Chain profiled = remat::profile_chain(
      chain.stages,
      chain.input,
      remat::ProfileOptions(profile).selective_policy(policy));
  std::vector<remat::planner::StageCost> timed_stages = profiled.stages();
  for (int64_t i = 1; i + 1 < profiled.size(); ++i) {  // the blocks
    const auto& stage = profiled.stage(i);
    ASSERT_TRUE(stage.selective.has_value()) << "stage " << i;
    EXPECT_LT(stage.selective->saved_bytes, stage.saved_bytes)
        << "stage " << i << ": the policy keeps less than a record";
    EXPECT_GE(stage.selective->saved_bytes, stage.output_bytes);
  }
  for (auto& stage : timed_stages) {
    stage.forward_ms = 1.0;
    stage.backward_ms = 2.0;
    if (stage.selective) {
      stage.selective->recompute_ms = 0.25;
    }
  }
  const remat::planner::Chain timed(timed_stages, profiled.input_bytes());
  const auto run_options =
      remat::PlannedChainOptions().selective_policy(policy);

  // Runs `net`, checks it against the plain run and the prediction.
  auto check = [&](remat::PlannedChain& net, const remat::Budget& budget) {
    const MaskedChain::Step planned =
        chain.step([&](const torch::Tensor& x) { return net->forward(x); });
    expect_same_step(plain, planned);
    const auto simulation = remat::planner::simulate(profiled, net->plan());
    ASSERT_TRUE(simulation.valid) << simulation.error;
    const int64_t measured =
        planned.activation_peak_bytes + profiled.input_bytes();
    EXPECT_LE(measured, budget.resolve_bytes(profiled))
        << net->plan().to_string();
    EXPECT_LE(measured, simulation.peak_bytes) << net->plan().to_string();
    EXPECT_GE(measured, static_cast<int64_t>(0.9 * simulation.peak_bytes))
        << "measured " << measured << ", predicted " << simulation.peak_bytes
        << " for " << net->plan().to_string();
  };

  int64_t selective_plans = 0;
  std::optional<remat::planner::Plan> a_selective_plan;
  for (const char* fraction :
       {"20%", "30%", "40%", "50%", "60%", "75%", "90%"}) {
    SCOPED_TRACE(std::string("budget ") + fraction);
    const remat::Budget budget = remat::Budget::parse(fraction);
    if (budget.resolve_bytes(timed) <
        remat::planner::min_feasible_budget_bytes(timed)) {
      continue;
    }
    const remat::planner::Plan plan = remat::plan_within(timed, budget);
    if (plan.to_string().find('S') == std::string::npos) {
      continue;
    }
    ++selective_plans;
    a_selective_plan = plan;
    remat::PlannedChain net(chain.stages, plan, run_options);
    check(net, budget);
  }
  EXPECT_GE(selective_plans, 2) << "the policy should pay off at some budgets";

  {
    SCOPED_TRACE("auto_checkpoint at 40%");
    const remat::Budget budget = remat::Budget::parse("40%");
    remat::PlannedChain net = remat::auto_checkpoint(
        chain.stages,
        chain.input,
        budget,
        remat::AutoCheckpointOptions().profile(profile).selective_policy(
            policy));
    check(net, budget);
  }

  // A plan with S ops needs the policy it was made with.
  ASSERT_TRUE(a_selective_plan.has_value());
  EXPECT_THROW(
      remat::PlannedChain(chain.stages, *a_selective_plan), c10::Error);
}

TEST(PlannedChain, RegistersEachModuleOnceAndEvaluatesPlainlyUnderNoGrad) {
  MaskedChain chain(3);
  // The first block used twice: registered once (under its first stage).
  chain.stages.insert(
      chain.stages.end() - 1,
      {chain.stages[1].forward, chain.stages[1].module});
  const auto profiled = remat::profile_chain(
      chain.stages, chain.input, remat::ProfileOptions().warmup(0).repeats(1));
  remat::PlannedChain net(chain.stages, remat::planner::solve_sqrt(profiled));
  EXPECT_EQ(net->parameters().size(), chain.modules->parameters().size());
  EXPECT_EQ(net->stages().size(), chain.stages.size());
  torch::NoGradGuard no_grad;
  torch::manual_seed(1);
  const torch::Tensor expected = chain.plain(chain.input);
  torch::manual_seed(1);
  EXPECT_TRUE(bitwise_equal(expected, net->forward(chain.input)));
  std::ostringstream printed;
  printed << *net;
  EXPECT_NE(
      printed.str().find("remat::PlannedChain(stages=6"), std::string::npos)
      << printed.str();
}

TEST(PlannedChain, GptStagesWithACapturedMaskMatchTheSequential) {
  namespace models = remat::models;
  const auto options = models::GptOptions()
                           .vocab(32)
                           .seq_len(32)
                           .layers(3)
                           .hidden(32)
                           .heads(2)
                           .dropout(0.1);
  torch::manual_seed(8);
  torch::nn::Sequential model = models::gpt(options);
  model->train();
  const auto tokens = torch::randint(32, {4, 32}, torch::kLong);
  const auto targets = torch::randint(32, {4, 32}, torch::kLong);
  auto step =
      [&](const std::function<torch::Tensor(const torch::Tensor&)>& forward) {
        for (auto& parameter : model->parameters()) {
          parameter.mutable_grad() = torch::zeros_like(parameter);
        }
        torch::manual_seed(21);
        models::gpt_loss(forward(tokens), targets).backward();
        return grads_of(*model);
      };
  const auto plain =
      step([&](const torch::Tensor& t) { return model->forward(t); });
  const auto causal = models::causal_mask(32);
  remat::PlannedChain net = remat::auto_checkpoint(
      models::gpt_stages(model, causal),
      tokens,
      remat::Budget::parse("50%"),
      remat::AutoCheckpointOptions().profile(
          remat::ProfileOptions().warmup(0).repeats(1)));
  EXPECT_EQ(net->stages().size(), model->size());
  expect_all_bitwise_equal(
      plain,
      step([&](const torch::Tensor& t) { return net->forward(t); }),
      "GPT stages, causal mask");
  // Another mask reaches every block: no masking changes the output.
  const auto open = torch::zeros({32, 32}, torch::kBool);
  torch::NoGradGuard no_grad;
  model->eval();
  const auto masked =
      remat::detail::run_stages(models::gpt_stages(model, causal), tokens);
  const auto unmasked =
      remat::detail::run_stages(models::gpt_stages(model, open), tokens);
  EXPECT_FALSE(torch::equal(masked, unmasked));
  EXPECT_THROW(
      models::gpt_stages(model, torch::zeros({32, 32}))[1].forward(
          masked.new_zeros({4, 32, 32})),
      c10::Error);
}

// The GPT's blocks profiled with save_compute_intensive(): at every budget
// of 10 %, 20 %, ..., 100 % of the store-all peak, the optimal plan with the
// third way to run a stage is predicted at least as fast as the best plan
// without it (the same profile, its selective costs removed), and strictly
// faster at some budget. The bytes are the profile's (exact); the times are
// fixed, so that the test does not depend on the machine's speed: a block's
// forward 10 ms, its backward 20 ms, its selective recomputation 6 ms (about
// what it measures here at this width, where the matrix products it skips
// dominate the forward).
TEST(PlannedChain, SelectiveChoiceIsNeverSlowerOnTheGptAndSometimesFaster) {
  namespace models = remat::models;
  const auto options = models::GptOptions()
                           .vocab(64)
                           .seq_len(128)
                           .layers(4)
                           .hidden(256)
                           .heads(2)
                           .dropout(0.1);
  torch::manual_seed(8);
  torch::nn::Sequential model = models::gpt(options);
  model->train();
  const auto tokens = torch::randint(64, {8, 128}, torch::kLong);
  const auto causal = models::causal_mask(128);
  const remat::planner::Chain profiled = remat::profile_chain(
      models::gpt_stages(model, causal),
      tokens,
      remat::ProfileOptions().warmup(0).repeats(1).selective_policy(
          remat::policies::save_compute_intensive()));
  std::vector<remat::planner::StageCost> timed = profiled.stages();
  int64_t selective_stages = 0;
  for (auto& stage : timed) {
    selective_stages += stage.selective.has_value();
    stage.forward_ms = 10;
    stage.backward_ms = 20;
    if (stage.selective) {
      stage.selective->recompute_ms = 6;
    }
  }
  EXPECT_EQ(selective_stages, profiled.size());
  const remat::planner::Chain with(timed, profiled.input_bytes());
  std::vector<remat::planner::StageCost> stages = timed;
  for (auto& stage : stages) {
    stage.selective.reset();
  }
  const remat::planner::Chain without(stages, profiled.input_bytes());
  const int64_t store_all =
      remat::planner::simulate(with, remat::planner::solve_store_all(with))
          .peak_bytes;
  int64_t faster = 0;
  int64_t compared = 0;
  for (int percent = 10; percent <= 100; percent += 10) {
    SCOPED_TRACE(std::to_string(percent) + "%");
    const int64_t budget = store_all * percent / 100;
    const auto three = remat::planner::solve_optimal(with, budget);
    const auto two = remat::planner::solve_optimal(without, budget);
    if (!two) {
      continue;  // nothing fits without the third way; it may with it
    }
    ASSERT_TRUE(three.has_value());
    const auto fast = remat::planner::simulate(with, *three);
    const auto slow = remat::planner::simulate(without, *two);
    ASSERT_TRUE(fast.valid) << fast.error;
    EXPECT_LE(fast.peak_bytes, budget);
    EXPECT_LE(fast.time_ms, slow.time_ms * (1 + 1e-6))
        << three->to_string() << " vs " << two->to_string();
    faster += fast.time_ms < slow.time_ms * (1 - 1e-6);
    ++compared;
  }
  EXPECT_GE(compared, 5);
  EXPECT_GE(faster, 1);
}

// Linked stages (NOTE: [Linked stages]): a record takes its input with the
// producer's graph exactly where the producer has no other reader, was
// recorded first, and its backward follows the reader's.
TEST(PlanExecutor, LinksARecordToItsProducerOnlyWhereTheirBackwardsAdjoin) {
  using remat::planner::plan_from_string;
  const remat::planner::Graph chain = remat::detail::chain_structure(4);
  const auto linked = [](const remat::planner::Graph& graph, const char* plan) {
    const remat::planner::Plan parsed = plan_from_string(plan);
    const auto simulation = remat::planner::simulate(graph, parsed);
    EXPECT_TRUE(simulation.valid) << plan << ": " << simulation.error;
    return remat::detail::linked_values(graph, parsed);
  };
  using Links = std::vector<int64_t>;
  // Store-all: every boundary, so the backward is one engine call.
  EXPECT_EQ(
      linked(chain, "R0 R1 R2 R3 B3 B2 B1 B0"),
      (Links{-1, 1, 2, 3, -1, -1, -1, -1}));
  // Two segments: within each recomputed segment, not across them (stage 1
  // ran without recording; B2 is followed by a recomputation).
  EXPECT_EQ(
      linked(chain, "C0 N1 R2 R3 B3 B2 R0 R1 B1 B0"),
      (Links{-1, -1, -1, 3, -1, -1, -1, 1, -1, -1}));
  // A selective record keeps its own boundary, on either side.
  EXPECT_EQ(
      linked(chain, "R0 S1 R2 R3 B3 B2 B1 B0"),
      (Links{-1, -1, -1, 3, -1, -1, -1, -1}));
  // A record kept from the forward phase links to a recomputation's record
  // in the backward phase; stage 3's input was computed without a record.
  EXPECT_EQ(
      linked(chain, "R0 C1 N2 R3 B3 R1 R2 B2 B1 B0"),
      (Links{-1, -1, -1, -1, -1, 1, 2, -1, -1, -1}));
  // A skip: stage 0's output has two readers and is never linked; stage
  // 1's has one.
  const remat::planner::Graph skip(
      std::vector<remat::planner::StageCost>(3, remat::detail::unit_cost()),
      {{remat::planner::kGraphInput}, {0}, {0, 1}},
      /*input_bytes=*/1);
  EXPECT_EQ(linked(skip, "R0 R1 R2 B2 B1 B0"), (Links{-1, -1, 2, -1, -1, -1}));
}

// Linked and unlinked execution of the same plans give the plain run's
// gradients and buffers bitwise and the same peak, within simulate()'s: the
// plans run as they are (linked) and timed for self-correction (never
// linked).
TEST(PlannedChain, LinkedStagesMatchThePlainRunAndTheUnlinkedOne) {
  MaskedChain chain;
  const MaskedChain::Step plain =
      chain.step([&](const torch::Tensor& x) { return chain.plain(x); });
  const remat::planner::Chain profiled = remat::profile_chain(
      chain.stages, chain.input, remat::ProfileOptions().warmup(0).repeats(1));
  for (const remat::planner::Plan& plan :
       {remat::planner::solve_store_all(profiled),
        remat::planner::solve_uniform(profiled, 3),
        remat::planner::solve_min_memory(profiled)}) {
    SCOPED_TRACE(plan.to_string());
    const int64_t predicted =
        remat::planner::simulate(profiled, plan).peak_bytes;
    std::vector<int64_t> peaks;
    for (const bool timed : {false, true}) {
      SCOPED_TRACE(timed ? "timed" : "linked");
      remat::PlannedChain net(
          chain.stages,
          plan,
          remat::PlannedChainOptions().chain(profiled).self_correct(timed));
      const MaskedChain::Step planned =
          chain.step([&](const torch::Tensor& x) { return net->forward(x); });
      expect_same_step(plain, planned);
      EXPECT_LE(
          planned.activation_peak_bytes + profiled.input_bytes(), predicted);
      peaks.push_back(planned.activation_peak_bytes);
    }
    EXPECT_EQ(peaks[0], peaks[1]) << "linked against unlinked";
  }
  // An input that needs no gradient through a parameter-free first stage:
  // the linked output of stage 0 carries no graph.
  remat::PlannedChain net(
      chain.stages, remat::planner::solve_store_all(profiled));
  for (auto& p : chain.modules->parameters()) {
    p.mutable_grad() = torch::Tensor();
  }
  const torch::Tensor input = chain.input.detach();
  torch::manual_seed(7);
  chain.plain(input).sum().backward();
  const std::vector<torch::Tensor> expected = grads_of(*chain.modules);
  for (auto& p : chain.modules->parameters()) {
    p.mutable_grad() = torch::Tensor();
  }
  torch::manual_seed(7);
  net->forward(input).sum().backward();
  expect_all_bitwise_equal(
      expected, grads_of(*chain.modules), "parameter grad");
}

// A stage may return a tensor it did not compute: a parameter of its module,
// its input unchanged, or a tensor it closes over. Such a tensor outlives the
// step, so nothing of the step may stay attached to it: once, a hook that a
// linked record put on a returned parameter ran in the next step's backward,
// after its execution had ended (a use after free; an error or a crash). Two
// steps per plan, against the plain run's gradients.
TEST(PlannedChain, AStageReturningATensorItDidNotComputeMatchesThePlainRun) {
  torch::manual_seed(3);
  torch::nn::Linear first(6, 6);
  torch::nn::Linear table(6, 6);
  torch::nn::Linear last(6, 6);
  auto closed_over = std::make_shared<torch::Tensor>();
  const auto linear = [](torch::nn::Linear layer) {
    return remat::Stage{
        [layer](const torch::Tensor& x) mutable { return layer(x).tanh(); },
        layer.ptr()};
  };
  const std::vector<std::pair<std::string, remat::Stage>> middles = {
      {"a parameter",
       {[table](const torch::Tensor&) { return table->weight; }, table.ptr()}},
      {"its input", {[](const torch::Tensor& x) { return x; }, nullptr}},
      {"a tensor it closes over",
       {[closed_over](const torch::Tensor&) { return *closed_over; }, nullptr}},
  };
  const std::vector<torch::nn::Linear> layers = {first, table, last};
  const auto zero_grads = [&] {
    for (const auto& layer : layers) {
      for (auto& p : layer->parameters()) {
        p.mutable_grad() = torch::Tensor();
      }
    }
  };
  const auto grads = [&] {
    std::vector<torch::Tensor> all;
    for (const auto& layer : layers) {
      for (const auto& p : layer->parameters()) {
        all.push_back(
            p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
      }
    }
    return all;
  };
  const torch::Tensor input = torch::randn({5, 6});
  for (const auto& [what, middle] : middles) {
    SCOPED_TRACE(what);
    const std::vector<remat::Stage> stages = {
        linear(first), middle, linear(last)};
    // Two steps: the second sees what the first left behind.
    const auto steps =
        [&](const std::function<torch::Tensor(const torch::Tensor&)>& forward) {
          zero_grads();
          for (int step = 0; step < 2; ++step) {
            *closed_over = table->weight * table->bias.unsqueeze(0);
            forward(input.clone().requires_grad_()).pow(2).sum().backward();
          }
          return grads();
        };
    const std::vector<torch::Tensor> expected =
        steps([&](const torch::Tensor& x) {
          torch::Tensor value = x;
          for (const remat::Stage& stage : stages) {
            value = stage.forward(value);
          }
          return value;
        });
    for (const char* text :
         {"R0 R1 R2 B2 B1 B0",
          "C0 N1 R2 B2 R0 R1 B1 B0",
          "N0 R1 R2 B2 B1 R0 B0",
          "C0 C1 R2 B2 R1 B1 R0 B0"}) {
      SCOPED_TRACE(text);
      remat::PlannedChain net(stages, remat::planner::plan_from_string(text));
      expect_all_bitwise_equal(
          expected,
          steps([&](const torch::Tensor& x) { return net->forward(x); }),
          "parameter grad");
    }
  }
}

// The chain a plan was solved on travels with it: a report needs no second
// profile, a re-plan for a new shape brings that shape's chain, and a chain
// of another length is refused.
TEST(PlannedChain, KeepsTheChainItsPlanWasSolvedOn) {
  torch::manual_seed(5);
  torch::nn::Sequential model(
      torch::nn::Linear(8, 16),
      torch::nn::Tanh(),
      torch::nn::Linear(16, 16),
      torch::nn::Tanh());
  const std::vector<remat::Stage> stages = remat::stages_of(model);
  const torch::Tensor small = torch::randn({4, 8});
  auto net = remat::auto_checkpoint(
      stages,
      small,
      remat::Budget::parse("100%"),
      remat::AutoCheckpointOptions().on_shape_change(
          remat::ShapePolicy::kReplan));
  ASSERT_TRUE(net->chain().has_value());
  EXPECT_EQ(net->chain()->size(), 4);
  EXPECT_EQ(net->chain()->input_bytes(), static_cast<int64_t>(small.nbytes()));
  EXPECT_TRUE(remat::planner::simulate(*net->chain(), net->plan()).valid);
  const torch::Tensor large = torch::randn({32, 8});
  net->forward(large).sum().backward();
  ASSERT_TRUE(net->chain().has_value());
  EXPECT_EQ(net->chain()->input_bytes(), static_cast<int64_t>(large.nbytes()));
  net->forward(small).sum().backward();
  EXPECT_EQ(net->chain()->input_bytes(), static_cast<int64_t>(small.nbytes()));
  // A plan given without a chain has none; a chain of another length fails.
  remat::PlannedChain given(stages, net->plan());
  EXPECT_FALSE(given->chain().has_value());
  remat::planner::StageCost unit;
  unit.forward_ms = 1;
  unit.backward_ms = 1;
  unit.output_bytes = 1;
  unit.saved_bytes = 1;
  const remat::planner::Chain two(
      std::vector<remat::planner::StageCost>(2, unit), 1);
  EXPECT_THROW(
      remat::PlannedChain(
          std::vector<remat::Stage>(stages.begin(), stages.begin() + 2),
          remat::planner::solve_store_all(two),
          remat::PlannedChainOptions().chain(*net->chain())),
      c10::Error);
  // PlannedSequential from auto_checkpoint keeps its chain too.
  auto sequential =
      remat::auto_checkpoint(model, small, remat::Budget::parse("100%"));
  ASSERT_TRUE(sequential->chain().has_value());
  EXPECT_EQ(sequential->chain()->size(), 4);
}

// The model's input changed in place between forward and backward: a plan
// that recomputes from it refuses the backward, as plain autograd refuses it
// where the first layer saved its input, instead of recomputing from the
// changed value.
TEST(PlannedChain, RefusesAnInputModifiedInPlaceBeforeBackward) {
  torch::manual_seed(2);
  torch::nn::Linear first(6, 6);
  torch::nn::Linear last(6, 6);
  const std::vector<remat::Stage> stages = {
      {[first](const torch::Tensor& x) mutable {
         return torch::tanh(first(x));
       },
       first.ptr()},
      {[last](const torch::Tensor& x) mutable { return last(x); }, last.ptr()},
  };
  for (const char* text : {"R0 R1 B1 B0", "N0 R1 B1 R0 B0", "C0 R1 B1 R0 B0"}) {
    SCOPED_TRACE(text);
    remat::PlannedChain net(stages, remat::planner::plan_from_string(text));
    torch::Tensor input = torch::randn({5, 6});
    torch::Tensor loss = net->forward(input).sum();
    input.mul_(2);
    try {
      loss.backward();
      ADD_FAILURE() << "expected an error";
    } catch (const c10::Error& error) {
      const std::string message = error.what_without_backtrace();
      EXPECT_TRUE(
          message.find("remat::PlannedChain: the model's input was modified "
                       "in place since the forward (version 0 then, 1 now)") !=
              std::string::npos ||
          // Recorded from the start: LibTorch's own check of what it saved.
          (text[0] == 'R' && message.find("modified by an inplace operation") !=
                                 std::string::npos))
          << message;
    }
  }
}

// A gradient of the gradients (backward with create_graph) would be zero:
// the stages' backwards build no graph of what they produce. Refused, on
// every plan (store-all included, one engine call: NOTE: [Linked stages]).
TEST(PlannedChain, RefusesABackwardThatCreatesAGraph) {
  torch::manual_seed(3);
  torch::nn::Linear first(4, 4);
  torch::nn::Linear last(4, 4);
  const std::vector<remat::Stage> stages = {
      {[first](const torch::Tensor& x) mutable { return first(x).tanh(); },
       first.ptr()},
      {[last](const torch::Tensor& x) mutable { return last(x); }, last.ptr()},
  };
  for (const char* text : {"R0 R1 B1 B0", "N0 R1 B1 R0 B0"}) {
    SCOPED_TRACE(text);
    remat::PlannedChain net(stages, remat::planner::plan_from_string(text));
    torch::Tensor input = torch::randn({3, 4}, torch::requires_grad());
    torch::Tensor loss = net->forward(input).pow(2).sum();
    try {
      loss.backward({}, /*retain_graph=*/true, /*create_graph=*/true);
      ADD_FAILURE() << "expected an error";
    } catch (const c10::Error& error) {
      EXPECT_NE(
          std::string(error.what_without_backtrace())
              .find("remat::PlannedChain: backward(create_graph=true) is not "
                    "supported"),
          std::string::npos)
          << error.what_without_backtrace();
    }
  }
}

TEST(PlannedChain, RefusesEmptyChainsStagesWithoutForwardAndBadPlans) {
  auto expect_error = [](const std::function<void()>& make,
                         const std::string& message) {
    try {
      make();
      ADD_FAILURE() << "expected an error containing: " << message;
    } catch (const c10::Error& error) {
      EXPECT_NE(std::string(error.what()).find(message), std::string::npos)
          << error.what();
    }
  };
  const auto plan = remat::planner::plan_from_string("R0 B0");
  expect_error(
      [&] { remat::PlannedChain net(std::vector<remat::Stage>{}, plan); },
      "remat::PlannedChain: expected at least one stage, got none");
  expect_error(
      [&] { remat::PlannedChain net(std::vector<remat::Stage>(1), plan); },
      "expected every stage to have a forward, stage 0 has none");
  MaskedChain chain(1);
  expect_error(
      [&] { remat::PlannedChain net(chain.stages, plan); },
      "remat::PlannedChain: expected a valid plan for the 3 stages");
  expect_error(
      [&] { remat::profile_chain(std::vector<remat::Stage>{}, chain.input); },
      "remat::profile_chain: expected at least one stage, got none");
}

// Three stages: `first`, then `middle` (no module), then a new Linear(6, 6);
// the middle stage is the one a test puts under a plan.
std::vector<remat::Stage> between_two_linears(
    torch::nn::Linear first,
    std::function<torch::Tensor(const torch::Tensor&)> middle) {
  torch::nn::Linear last(6, 6);
  return {
      {[first](const torch::Tensor& x) mutable { return first(x); },
       first.ptr()},
      {std::move(middle), nullptr},
      {[last](const torch::Tensor& x) mutable { return last(x); }, last.ptr()},
  };
}

// A stage that modifies its input in place (legal in plain autograd when
// the producer saved nothing of it) would, run again under a plan, read
// the changed value: every schedule and the profiler refuse it, naming the
// stage, instead of returning wrong gradients.
TEST(PlannedChain, RefusesAStageThatModifiesItsInputInPlace) {
  torch::manual_seed(2);
  torch::nn::Linear first(6, 6);
  const std::vector<remat::Stage> stages =
      between_two_linears(first, [](const torch::Tensor& x) {
        torch::Tensor doubled = x.mul_(2);
        return doubled * doubled;
      });
  const torch::Tensor input = torch::randn({5, 6});
  // Plain autograd runs it.
  torch::Tensor value = input.clone().requires_grad_();
  for (const remat::Stage& stage : stages) {
    value = stage.forward(value);
  }
  value.sum().backward();
  for (const char* text :
       {"R0 R1 R2 B2 B1 B0",
        "R0 N1 R2 B2 R1 B1 B0",
        "N0 N1 R2 B2 R0 R1 B1 B0",
        "C0 R1 R2 B2 B1 R0 B0"}) {
    SCOPED_TRACE(text);
    remat::PlannedChain net(stages, remat::planner::plan_from_string(text));
    try {
      net->forward(input.clone().requires_grad_()).sum().backward();
      ADD_FAILURE() << "expected an error";
    } catch (const c10::Error& error) {
      const std::string message = error.what_without_backtrace();
      EXPECT_TRUE(
          message.find("remat: stage 1 modified its input (the output of "
                       "stage 0) in place") != std::string::npos ||
          message.find("remat: raised by the forward of stage 1; a stage "
                       "must not modify its inputs in place") !=
              std::string::npos)
          << message;
    }
  }
  try {
    remat::profile_chain(stages, input);
    ADD_FAILURE() << "expected an error";
  } catch (const c10::Error& error) {
    EXPECT_NE(
        std::string(error.what_without_backtrace())
            .find("remat: stage 1 modified its input (the output of stage 0) "
                  "in place"),
        std::string::npos)
        << error.what_without_backtrace();
  }
}

// A stage that runs a backward inside its forward (a gradient penalty)
// cannot run where a plan does not keep its graph (grad mode off): the
// profiler and the no-record forwards refuse it with autograd's error, the
// stage's index, the mode and the way out; a store-all plan runs it.
TEST(PlannedChain, AStageWithABackwardInsideIsRefusedWhereItRunsWithoutGrad) {
  torch::manual_seed(3);
  torch::nn::Linear first(6, 6);
  const std::vector<remat::Stage> stages =
      between_two_linears(first, [](const torch::Tensor& x) {
        const torch::Tensor y = torch::tanh(x);
        return y +
               torch::autograd::grad({y.pow(2).sum()}, {x}, {}, true, true)[0];
      });
  const torch::Tensor input = torch::randn({5, 6});
  const auto expect_refused = [](const std::function<void()>& run) {
    try {
      run();
      ADD_FAILURE() << "expected an error";
    } catch (const c10::Error& error) {
      const std::string message = error.what_without_backtrace();
      for (const char* part :
           {"does not require grad",
            "remat: raised by the forward of stage 1; it ran with grad mode "
            "off",
            "a stage cannot run torch::autograd::grad inside its forward"}) {
        EXPECT_NE(message.find(part), std::string::npos) << message;
      }
    }
  };
  expect_refused([&] { remat::profile_chain(stages, input); });
  expect_refused([&] {
    remat::PlannedChain net(
        stages, remat::planner::plan_from_string("R0 N1 R2 B2 R1 B1 B0"));
    net->forward(input.clone().requires_grad_()).sum().backward();
  });
  // Recorded, the stage runs as in plain autograd.
  first->zero_grad();
  torch::Tensor value = input.clone().requires_grad_();
  for (const remat::Stage& stage : stages) {
    value = stage.forward(value);
  }
  value.sum().backward();
  const torch::Tensor expected = first->weight.grad().clone();
  first->zero_grad();
  remat::PlannedChain net(
      stages, remat::planner::plan_from_string("R0 R1 R2 B2 B1 B0"));
  net->forward(input.clone().requires_grad_()).sum().backward();
  EXPECT_TRUE(torch::equal(first->weight.grad(), expected));
}

}  // namespace
