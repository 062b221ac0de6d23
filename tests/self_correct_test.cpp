// self_correct_test.cpp: self-correcting plans (PlannedChainOptions::
// self_correct and PlannedGraphOptions::self_correct): the switch decided on
// fixed costs (detail::corrected_plan, StageTimes), and a chain and a graph
// with a skip connection whose stage turns slow after profiling: the plan
// changes, gradients stay bitwise those of the plain run, the measured peak
// within the budget.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "planning/plan_executor.h"
#include "planning/self_correct.h"
#include "remat/remat.h"
#include "test_util.h"

namespace {

namespace planner = remat::planner;

/// Forwards of `stage` in `plan` (1 = it is never recomputed).
int64_t forwards_of(const planner::Plan& plan, int64_t stage) {
  int64_t count = 0;
  for (const planner::Op& op : plan.ops) {
    count += op.stage == stage && op.kind != planner::OpKind::kBackward;
  }
  return count;
}

/// Eight equal stages of fixed costs: 1 ms forward, 2 ms backward, 1 MiB.
planner::Chain even_chain() {
  planner::StageCost stage;
  stage.forward_ms = 1;
  stage.backward_ms = 2;
  stage.output_bytes = 1 << 20;
  stage.saved_bytes = 2 << 20;
  return planner::Chain(std::vector<planner::StageCost>(8, stage), 1 << 20);
}

TEST(SelfCorrection, KeepsThePlanWhenTheMeasuredCostsAreTheProfiles) {
  const planner::Chain chain = even_chain();
  const int64_t budget = planner::min_feasible_budget_bytes(chain) * 3 / 2;
  const planner::Plan plan = *planner::solve_optimal(chain, budget);
  double from_ms = 0;
  double to_ms = 0;
  EXPECT_FALSE(remat::detail::corrected_plan(
                   chain, plan, budget, 0.05, {}, from_ms, to_ms)
                   .has_value());
  EXPECT_EQ(from_ms, planner::simulate(chain, plan).time_ms);
}

TEST(SelfCorrection, SwitchesToStopRecomputingAStageThatTurnedSlow) {
  const planner::Chain chain = even_chain();
  const int64_t budget = planner::min_feasible_budget_bytes(chain) * 3 / 2;
  const planner::Plan plan = *planner::solve_optimal(chain, budget);
  // The stage the plan recomputes first becomes 50 times slower.
  int64_t slow = -1;
  for (int64_t i = 0; i < chain.size() && slow < 0; ++i) {
    if (forwards_of(plan, i) > 1) {
      slow = i;
    }
  }
  ASSERT_GE(slow, 0) << plan.to_string();
  remat::detail::StageTimes times(chain.size());
  for (int step = 0; step < 3; ++step) {
    for (int64_t i = 0; i < chain.size(); ++i) {
      times.add_forward(i, i == slow ? 50 : 1);
      times.add_backward(i, 2);
    }
    times.step_done();
  }
  EXPECT_EQ(times.steps(), 3);
  const planner::Chain measured = times.apply_to(chain);
  EXPECT_EQ(measured.stage(slow).forward_ms, 50);
  EXPECT_EQ(measured.stage((slow + 1) % chain.size()).forward_ms, 1);
  EXPECT_EQ(measured.stage(slow).output_bytes, chain.stage(slow).output_bytes);
  double from_ms = 0;
  double to_ms = 0;
  const auto next = remat::detail::corrected_plan(
      measured, plan, budget, 0.05, {}, from_ms, to_ms);
  ASSERT_TRUE(next.has_value());
  EXPECT_LT(forwards_of(*next, slow), forwards_of(plan, slow));
  EXPECT_LT(to_ms, from_ms * 0.95);
  EXPECT_LE(planner::simulate(measured, *next).peak_bytes, budget);
  // A threshold above the gain keeps the plan.
  EXPECT_FALSE(remat::detail::corrected_plan(
                   measured,
                   plan,
                   budget,
                   1 - to_ms / from_ms + 0.01,
                   {},
                   from_ms,
                   to_ms)
                   .has_value());
  times.clear();
  EXPECT_EQ(times.steps(), 0);
  EXPECT_EQ(times.apply_to(chain).stage(slow).forward_ms, 1);
}

TEST(SelfCorrection, ScalesWhatItCouldNotMeasureByTheMeasuredForward) {
  planner::Chain chain = even_chain();
  std::vector<planner::StageCost> stages = chain.stages();
  stages[3].selective = planner::SelectiveCost{1 << 20, 0, 0, 0.5};
  chain = planner::Chain(stages, chain.input_bytes());
  remat::detail::StageTimes times(chain.size());
  times.add_forward(3, 4);  // 4 times the profile; no backward sample
  const planner::Chain measured = times.apply_to(chain);
  EXPECT_EQ(measured.stage(3).forward_ms, 4);
  EXPECT_EQ(measured.stage(3).backward_ms, 8);
  EXPECT_EQ(measured.stage(3).selective->recompute_ms, 2);
  EXPECT_EQ(measured.stage(2).backward_ms, 2);
}

/// A stage of `width` units that, while `*slow` is set, also sleeps 200 ms:
/// extra work that appears after profiling.
remat::Stage stage_of(
    int64_t width, std::shared_ptr<bool> slow, bool with_dropout) {
  auto block = std::make_shared<torch::nn::SequentialImpl>(
      torch::nn::Linear(width, width), torch::nn::Tanh());
  if (with_dropout) {
    block->push_back(torch::nn::Dropout(0.1));
  }
  return {
      [block, slow](const torch::Tensor& x) {
        if (slow && *slow) {
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
        }
        return block->forward(x);
      },
      block};
}

struct Step {
  std::vector<torch::Tensor> grads;
  int64_t peak_bytes = 0;  // activations + input, as simulate()
};

/// One training step of `forward` on `input` (seed 3), with the gradients
/// of the parameters of `stages` (Stage or GraphStage; each with its own
/// module).
template <class StageT>
Step step_of(
    const std::vector<StageT>& stages,
    const torch::Tensor& input,
    const std::function<torch::Tensor(const torch::Tensor&)>& forward) {
  std::vector<torch::Tensor> parameters;
  for (const auto& stage : stages) {
    for (const auto& parameter : stage.module->parameters()) {
      parameters.push_back(parameter);
    }
  }
  remat::measure::zero_gradients(parameters);
  torch::manual_seed(3);
  const auto measured = remat::measure::measure_step(
      input.device(), [&] { return forward(input).sum(); });
  Step step;
  step.peak_bytes =
      measured.activation_peak_bytes() + static_cast<int64_t>(input.nbytes());
  for (const auto& parameter : parameters) {
    step.grads.push_back(parameter.grad().clone());
  }
  return step;
}

/// `chain` with every stage's forward `forward_ms` and backward 2 ms, and
/// stage `slow` (if >= 0) forward `slow_ms`.
planner::Chain with_times(
    const planner::Chain& chain,
    double forward_ms,
    int64_t slow = -1,
    double slow_ms = 0) {
  std::vector<planner::StageCost> costs = chain.stages();
  for (int64_t i = 0; i < chain.size(); ++i) {
    costs[i].forward_ms = i == slow ? slow_ms : forward_ms;
    costs[i].backward_ms = 2;
  }
  return planner::Chain(costs, chain.input_bytes());
}

TEST(SelfCorrection, APlanChangesWhenAStageTurnsSlowAndKeepsItsGuarantees) {
  torch::manual_seed(0);
  auto slow = std::make_shared<bool>(false);
  constexpr int64_t kStages = 8;
  constexpr int64_t kWidth = 64;
  std::vector<remat::Stage> stages;
  for (int64_t i = 0; i < kStages; ++i) {
    stages.push_back(stage_of(kWidth, i == 2 ? slow : nullptr, i == 5));
  }
  const torch::Tensor input = torch::randn({64, kWidth});
  // The profile's bytes with fixed times (every stage 1 ms), so that the
  // plan and the budget do not depend on this machine's speed: a budget at
  // which the plan recomputes stage 2, and at which a plan that does not
  // would be chosen once stage 2 costs 200 ms, even if every other stage
  // measured 40 ms (they take well under 1 ms on an idle machine, and up to
  // 25 ms were seen with a build running on both cores).
  const planner::Chain chain =
      with_times(remat::profile_chain(stages, input), 1);
  const planner::Chain slow_chain = with_times(chain, 40, 2, 200);
  std::optional<int64_t> budget;
  const int64_t minimum = planner::min_feasible_budget_bytes(chain);
  const int64_t store_all =
      planner::simulate(chain, planner::solve_store_all(chain)).peak_bytes;
  for (int64_t b = minimum; b < store_all && !budget;
       b += (store_all - minimum) / 20) {
    const auto plan = planner::solve_optimal(chain, b);
    const auto slow_plan = planner::solve_optimal(slow_chain, b);
    if (plan && slow_plan && forwards_of(*plan, 2) > 1 &&
        forwards_of(*slow_plan, 2) == 1) {
      budget = b;
    }
  }
  ASSERT_TRUE(budget.has_value());
  const planner::Plan initial =
      remat::plan_within(chain, remat::Budget::bytes(*budget));
  ASSERT_GT(forwards_of(initial, 2), 1) << initial.to_string();
  remat::PlannedChain net(
      stages,
      initial,
      remat::PlannedChainOptions()
          .chain(chain)
          .budget(remat::Budget::bytes(*budget))
          .self_correct(true)
          .correction_steps(2));
  const auto check_step = [&](const std::string& when) {
    const Step plain = step_of(stages, input, [&](const torch::Tensor& x) {
      return remat::detail::run_stages(stages, x);
    });
    const Step planned = step_of(
        stages, input, [&](const torch::Tensor& x) { return net->forward(x); });
    remat::testing::expect_all_bitwise_equal(plain.grads, planned.grads, when);
    EXPECT_LE(planned.peak_bytes, *budget) << when;
  };
  check_step("before the slowdown");  // no decision before the second step
  EXPECT_EQ(net->plan(), initial);
  *slow = true;
  int steps = 0;
  while (forwards_of(net->plan(), 2) > 1 && steps < 10) {
    check_step("after the slowdown, step " + std::to_string(steps));
    ++steps;
  }
  std::ostringstream measured_text;
  if (net->measured_chain()) {
    for (const auto& stage : net->measured_chain()->stages()) {
      measured_text << " " << stage.forward_ms;
    }
  }
  ASSERT_EQ(forwards_of(net->plan(), 2), 1)
      << "after " << steps << " slow steps: " << net->plan().to_string()
      << "; measured forward ms:" << measured_text.str();
  ASSERT_FALSE(net->corrections().empty());
  const remat::PlanCorrection& correction = net->corrections().back();
  EXPECT_EQ(correction.to, net->plan());
  EXPECT_LT(correction.to_ms, correction.from_ms);
  // Decided on stage 2's measured slowness (its window may have begun
  // before the slowdown).
  for (int64_t i = 0; i < kStages; ++i) {
    if (i != 2) {
      EXPECT_GT(
          correction.measured.stage(2).forward_ms,
          correction.measured.stage(i).forward_ms)
          << "stage " << i;
    }
  }
  ASSERT_TRUE(net->measured_chain().has_value());
  check_step("under the corrected plan");
  EXPECT_LE(planner::simulate(chain, net->plan()).peak_bytes, *budget);
  *slow = false;
}

TEST(SelfCorrection, IsOffByDefaultAndRefusesBadOptions) {
  std::vector<remat::Stage> stages;
  for (int i = 0; i < 3; ++i) {
    stages.push_back(stage_of(16, nullptr, false));
  }
  const torch::Tensor input = torch::randn({4, 16});
  const planner::Chain chain = remat::profile_chain(stages, input);
  const planner::Plan plan = planner::solve_sqrt(chain);
  remat::PlannedChain net(stages, plan);
  for (int s = 0; s < 5; ++s) {
    net->forward(input).sum().backward();
  }
  EXPECT_EQ(net->plan(), plan);
  EXPECT_TRUE(net->corrections().empty());
  EXPECT_FALSE(net->measured_chain().has_value());
  const auto message_of = [&](const remat::PlannedChainOptions& options) {
    try {
      remat::PlannedChain bad(stages, plan, options);
    } catch (const c10::Error& error) {
      return std::string(error.what_without_backtrace());
    }
    return std::string("no error");
  };
  EXPECT_NE(
      message_of(remat::PlannedChainOptions().correction_steps(0))
          .find("correction_steps >= 1, got 0"),
      std::string::npos);
  EXPECT_NE(
      message_of(remat::PlannedChainOptions().correction_threshold(-0.5))
          .find("correction_threshold finite and >= 0, got -0.5"),
      std::string::npos);
}

// PlannedChain::options is a public member: values set after construction
// are refused at the next training forward, as at construction, instead of
// deciding switches (a NaN or negative threshold logged switches to the same
// plan) or dereferencing a missing budget.
TEST(SelfCorrection, RefusesBadOptionsSetAfterConstruction) {
  std::vector<remat::Stage> stages;
  for (int i = 0; i < 3; ++i) {
    stages.push_back(stage_of(8, nullptr, false));
  }
  const torch::Tensor input = torch::randn({4, 8});
  const planner::Chain chain = remat::profile_chain(stages, input);
  remat::PlannedChain net(
      stages,
      planner::solve_store_all(chain),
      remat::PlannedChainOptions().chain(chain).self_correct(true));
  const auto message_of_step = [&](const torch::Tensor& x) {
    return remat::testing::error_message_of(
        [&] { net->forward(x).sum().backward(); });
  };
  net->options.correction_threshold(std::nan(""));
  EXPECT_NE(
      message_of_step(input).find("correction_threshold finite and >= 0"),
      std::string::npos);
  net->options.correction_threshold(0.05).correction_steps(0);
  EXPECT_NE(
      message_of_step(input).find("correction_steps >= 1, got 0"),
      std::string::npos);
  net->options.correction_steps(3).self_correct(false);
  net->options.input_shape({4, 8}).on_shape_change(remat::ShapePolicy::kReplan);
  EXPECT_NE(
      message_of_step(torch::randn({2, 8}))
          .find("expected options.budget to be set for ShapePolicy::kReplan"),
      std::string::npos);
  EXPECT_TRUE(net->corrections().empty());
}

TEST(SelfCorrection, ProfilesOnTheFirstTrainingInputWithoutAChain) {
  std::vector<remat::Stage> stages;
  for (int i = 0; i < 4; ++i) {
    stages.push_back(stage_of(32, nullptr, i == 1));
  }
  const torch::Tensor input = torch::randn({8, 32});
  const planner::Chain chain = remat::profile_chain(stages, input);
  remat::PlannedChain net(
      stages,
      planner::solve_sqrt(chain),
      remat::PlannedChainOptions().self_correct(true).correction_steps(1));
  for (int s = 0; s < 3; ++s) {
    const Step plain = step_of(stages, input, [&](const torch::Tensor& x) {
      return remat::detail::run_stages(stages, x);
    });
    const Step planned = step_of(
        stages, input, [&](const torch::Tensor& x) { return net->forward(x); });
    remat::testing::expect_all_bitwise_equal(
        plain.grads, planned.grads, "step " + std::to_string(s));
  }
  ASSERT_TRUE(net->measured_chain().has_value());
  EXPECT_EQ(net->measured_chain()->size(), 4);
  EXPECT_EQ(net->measured_chain()->input_bytes(), chain.input_bytes());
}

// The profile a self-correcting chain makes inside its first step (no chain
// given) measures one stage at a time and its cold writes within the budget,
// so that step stays within the budget too (on this MLP; not guaranteed in
// general, see planned_chain.h).
TEST(SelfCorrection, TheFirstStepsOwnProfileStaysWithinTheBudget) {
  torch::manual_seed(0);
  torch::nn::Sequential model;
  for (int i = 0; i < 8; ++i) {
    model->push_back(torch::nn::Linear(256, 256));
    model->push_back(torch::nn::GELU());
  }
  const std::vector<remat::Stage> stages = remat::stages_of(model);
  const torch::Tensor input = torch::randn({512, 256});
  const remat::Budget budget = remat::Budget::parse("50%");
  const planner::Chain chain = remat::profile_chain(stages, input);
  const int64_t budget_bytes = budget.resolve_bytes(chain);
  remat::PlannedChain net(
      stages,
      remat::plan_within(chain, budget),
      remat::PlannedChainOptions().self_correct(true).budget(budget));
  int64_t parameter_bytes = 0;
  for (const torch::Tensor& p : model->parameters()) {
    parameter_bytes += static_cast<int64_t>(p.nbytes());
  }
  remat::install_tracking_allocator();
  remat::MemoryMeter meter;
  const torch::Tensor loss = net->forward(input).sum();
  loss.backward();
  // The step's activations and input: its peak less the gradients it made
  // (at most every parameter's) and the loss and its gradient.
  const int64_t activations = meter.peak_delta_bytes() - parameter_bytes -
                              2 * static_cast<int64_t>(loss.nbytes()) +
                              static_cast<int64_t>(input.nbytes());
  EXPECT_LE(activations, budget_bytes);
}

// ---- Graphs ---------------------------------------------------------------

/// Seven stages of `width` units; stage 5 adds stage 1's output (a skip
/// connection); stage `slow_stage` sleeps while `*slow` is set and counts its
/// forwards in `*calls` (if given); stage 3 has dropout.
std::vector<remat::GraphStage> skip_graph(
    int64_t width,
    std::shared_ptr<bool> slow,
    int64_t slow_stage,
    std::shared_ptr<int64_t> calls = nullptr) {
  std::vector<remat::GraphStage> stages;
  const std::vector<std::vector<int>> inputs = {
      {remat::kGraphInput}, {0}, {1}, {2}, {3}, {4, 1}, {5}};
  for (int64_t i = 0; i < static_cast<int64_t>(inputs.size()); ++i) {
    const remat::Stage block =
        stage_of(width, i == slow_stage ? slow : nullptr, i == 3);
    stages.push_back(
        {[forward = block.forward, calls = i == slow_stage ? calls : nullptr](
             const std::vector<torch::Tensor>& in) {
           if (calls) {
             ++*calls;
           }
           return forward(in.size() == 1 ? in[0] : in[0] + in[1]);
         },
         block.module,
         inputs[static_cast<size_t>(i)]});
  }
  return stages;
}

/// `graph` with every stage's forward `forward_ms` and backward 2 ms, and
/// stage `slow` (if >= 0) forward `slow_ms`.
planner::Graph with_times(
    const planner::Graph& graph,
    double forward_ms,
    int64_t slow = -1,
    double slow_ms = 0) {
  std::vector<planner::StageCost> costs = graph.stages();
  for (int64_t i = 0; i < graph.size(); ++i) {
    costs[i].forward_ms = i == slow ? slow_ms : forward_ms;
    costs[i].backward_ms = 2;
  }
  return remat::detail::with_stage_costs(graph, costs);
}

TEST(SelfCorrectionOnGraphs, MeasuredTimesKeepTheGraphsBytesAndInputs) {
  const auto stages = skip_graph(16, nullptr, -1);
  const planner::Graph graph =
      with_times(remat::profile_graph(stages, torch::randn({4, 16})), 1);
  remat::detail::StageTimes times(graph.size());
  times.add_forward(2, 4);
  times.add_backward(2, 5);
  const planner::Graph measured = times.apply_to(graph);
  EXPECT_EQ(measured.stage(2).forward_ms, 4);
  EXPECT_EQ(measured.stage(2).backward_ms, 5);
  EXPECT_EQ(measured.stage(1).forward_ms, 1);
  for (int64_t i = 0; i < graph.size(); ++i) {
    EXPECT_EQ(measured.inputs(i), graph.inputs(i)) << "stage " << i;
    EXPECT_EQ(measured.stage(i).output_bytes, graph.stage(i).output_bytes);
    EXPECT_EQ(measured.stage(i).saved_bytes, graph.stage(i).saved_bytes);
  }
  EXPECT_EQ(measured.input_bytes(), graph.input_bytes());
  const int64_t budget = planner::min_feasible_budget_bytes(graph);
  const planner::Plan plan = *planner::solve_optimal(graph, budget);
  double from_ms = 0;
  double to_ms = 0;
  EXPECT_FALSE(remat::detail::corrected_plan(
                   graph, plan, budget, 0.05, {}, from_ms, to_ms)
                   .has_value());
  EXPECT_EQ(from_ms, planner::simulate(graph, plan).time_ms);
}

TEST(
    SelfCorrectionOnGraphs,
    APlanChangesWhenAStageTurnsSlowAndKeepsItsGuarantees) {
  torch::manual_seed(0);
  auto slow = std::make_shared<bool>(false);
  constexpr int64_t kSlow = 2;
  constexpr int64_t kWidth = 64;
  auto calls = std::make_shared<int64_t>(0);
  const auto stages = skip_graph(kWidth, slow, kSlow, calls);
  const torch::Tensor input = torch::randn({64, kWidth});
  // Fixed times on the profile's bytes, as for the chain above: a budget at
  // which the plan recomputes stage 2, and at which a plan that does not is
  // chosen once stage 2 costs 200 ms, even if every other stage measured
  // 40 ms.
  const planner::Graph graph =
      with_times(remat::profile_graph(stages, input), 1);
  const planner::Graph slow_graph = with_times(graph, 40, kSlow, 200);
  std::optional<int64_t> budget;
  const int64_t minimum = planner::min_feasible_budget_bytes(graph);
  const int64_t store_all =
      planner::simulate(graph, planner::solve_store_all(graph)).peak_bytes;
  for (int64_t b = minimum; b < store_all && !budget;
       b += std::max<int64_t>(1, (store_all - minimum) / 40)) {
    const auto plan = planner::solve_optimal(graph, b);
    const auto slow_plan = planner::solve_optimal(slow_graph, b);
    if (plan && slow_plan && forwards_of(*plan, kSlow) > 1 &&
        forwards_of(*slow_plan, kSlow) == 1) {
      budget = b;
    }
  }
  ASSERT_TRUE(budget.has_value());
  const planner::Plan initial =
      remat::plan_within(graph, remat::Budget::bytes(*budget));
  ASSERT_GT(forwards_of(initial, kSlow), 1) << initial.to_string();
  remat::PlannedGraph net(
      stages,
      initial,
      remat::PlannedGraphOptions()
          .graph(graph)
          .budget(remat::Budget::bytes(*budget))
          .self_correct(true)
          .correction_steps(2));
  const auto check_step = [&](const std::string& when) {
    const Step plain = step_of(stages, input, [&](const torch::Tensor& x) {
      return remat::run_graph(stages, x);
    });
    *calls = 0;
    const Step planned = step_of(
        stages, input, [&](const torch::Tensor& x) { return net->forward(x); });
    remat::testing::expect_all_bitwise_equal(plain.grads, planned.grads, when);
    EXPECT_LE(planned.peak_bytes, *budget) << when;
    // The plan in force (after any switch before this step) is the one run.
    EXPECT_EQ(*calls, forwards_of(net->plan(), kSlow)) << when;
  };
  check_step("before the slowdown");  // no decision before the second step
  EXPECT_EQ(net->plan(), initial);
  *slow = true;
  int steps = 0;
  while (forwards_of(net->plan(), kSlow) > 1 && steps < 10) {
    check_step("after the slowdown, step " + std::to_string(steps));
    ++steps;
  }
  std::ostringstream measured_text;
  if (net->measured_graph()) {
    for (const auto& stage : net->measured_graph()->stages()) {
      measured_text << " " << stage.forward_ms;
    }
  }
  ASSERT_EQ(forwards_of(net->plan(), kSlow), 1)
      << "after " << steps << " slow steps: " << net->plan().to_string()
      << "; measured forward ms:" << measured_text.str();
  ASSERT_FALSE(net->corrections().empty());
  const remat::GraphPlanCorrection& correction = net->corrections().back();
  EXPECT_EQ(correction.to, net->plan());
  EXPECT_LT(correction.to_ms, correction.from_ms);
  // Decided on the profile's structure and bytes (no measured time is
  // asserted on).
  for (int64_t i = 0; i < graph.size(); ++i) {
    EXPECT_EQ(correction.measured.inputs(i), graph.inputs(i));
    EXPECT_EQ(
        correction.measured.stage(i).output_bytes, graph.stage(i).output_bytes);
    EXPECT_EQ(
        correction.measured.stage(i).saved_bytes, graph.stage(i).saved_bytes);
  }
  EXPECT_LE(
      planner::simulate(correction.measured, correction.to).peak_bytes,
      *budget);
  ASSERT_TRUE(net->measured_graph().has_value());
  check_step("under the corrected plan");
  EXPECT_LE(planner::simulate(graph, net->plan()).peak_bytes, *budget);
  *slow = false;
}

TEST(SelfCorrectionOnGraphs, IsOffByDefaultAndRefusesBadOptions) {
  const auto stages = skip_graph(16, nullptr, -1);
  const torch::Tensor input = torch::randn({4, 16});
  const planner::Graph graph = remat::profile_graph(stages, input);
  const planner::Plan plan =
      planner::solve_min_memory(graph);  // recomputes: the most to correct
  remat::PlannedGraph net(stages, plan);
  for (int s = 0; s < 5; ++s) {
    net->forward(input).sum().backward();
  }
  EXPECT_EQ(net->plan(), plan);
  EXPECT_TRUE(net->corrections().empty());
  EXPECT_FALSE(net->measured_graph().has_value());
  const auto message_of = [&](const remat::PlannedGraphOptions& options) {
    try {
      remat::PlannedGraph bad(stages, plan, options);
    } catch (const c10::Error& error) {
      return std::string(error.what_without_backtrace());
    }
    return std::string("no error");
  };
  EXPECT_NE(
      message_of(remat::PlannedGraphOptions().correction_steps(0))
          .find("remat::PlannedGraph: expected options.correction_steps >= "
                "1, got 0"),
      std::string::npos);
  EXPECT_NE(
      message_of(remat::PlannedGraphOptions().correction_threshold(-0.5))
          .find("correction_threshold finite and >= 0, got -0.5"),
      std::string::npos);
  EXPECT_NE(
      message_of(remat::PlannedGraphOptions().correction_threshold(NAN))
          .find("correction_threshold finite and >= 0, got nan"),
      std::string::npos);
}

TEST(SelfCorrectionOnGraphs, ProfilesOnTheFirstTrainingInputWithoutAGraph) {
  const auto stages = skip_graph(32, nullptr, -1);
  const torch::Tensor input = torch::randn({8, 32});
  const planner::Graph graph = remat::profile_graph(stages, input);
  remat::PlannedGraph net(
      stages,
      planner::solve_min_memory(graph),
      remat::PlannedGraphOptions().self_correct(true).correction_steps(1));
  for (int s = 0; s < 3; ++s) {
    const Step plain = step_of(stages, input, [&](const torch::Tensor& x) {
      return remat::run_graph(stages, x);
    });
    const Step planned = step_of(
        stages, input, [&](const torch::Tensor& x) { return net->forward(x); });
    remat::testing::expect_all_bitwise_equal(
        plain.grads, planned.grads, "step " + std::to_string(s));
  }
  ASSERT_TRUE(net->measured_graph().has_value());
  EXPECT_EQ(net->measured_graph()->size(), graph.size());
  EXPECT_EQ(net->measured_graph()->input_bytes(), graph.input_bytes());
  EXPECT_EQ(net->measured_graph()->inputs(5), graph.inputs(5));
}

}  // namespace
