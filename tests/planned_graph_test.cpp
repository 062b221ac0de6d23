// planned_graph_test.cpp: PlannedGraph, profile_graph and auto_checkpoint on
// a U-Net-shaped graph of stages against the stages run plainly.
//
// The graph: two encoder levels (convolution, BatchNorm, ReLU; dropout on
// the second), a bottleneck, two decoder levels that read the level below
// and the encoder's skip, a refinement module shared by two stages (the
// second adds a residual from the first decoder output), and a head. Every
// plan checked (the solver's at 50 % and at the minimum feasible budget, and
// schedules of every stage mode) must leave gradients and BatchNorm buffers
// bitwise those of the plain run (buffers updated once per step), and the
// measured activation peak plus the input bytes must be within the budget,
// never above simulate()'s prediction, and within 10 % below it.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/remat.h"
#include "test_util.h"

namespace {

using remat::testing::expect_same_step;
using remat::testing::grads_of;

torch::nn::Sequential conv_block(int64_t in, int64_t out, double dropout) {
  torch::nn::Sequential block(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).padding(1)),
      torch::nn::BatchNorm2d(out),
      torch::nn::ReLU());
  if (dropout > 0) {
    block->push_back(torch::nn::Dropout(dropout));
  }
  return block;
}

torch::Tensor upsample(const torch::Tensor& x) {
  return torch::upsample_nearest2d(x, {x.size(2) * 2, x.size(3) * 2});
}

struct SkipGraph {
  std::vector<remat::GraphStage> stages;
  torch::nn::ModuleList modules;
  torch::Tensor input;
  std::vector<torch::Tensor> initial_buffers;

  SkipGraph() {
    torch::manual_seed(5);
    auto enc0 = conv_block(2, 8, 0);
    auto enc1 = conv_block(8, 16, 0.2);
    auto bottom = conv_block(16, 16, 0);
    auto dec1 = conv_block(32, 16, 0);
    auto dec0 = conv_block(24, 8, 0);
    torch::nn::Conv2d refine(torch::nn::Conv2dOptions(8, 8, 3).padding(1));
    torch::nn::Conv2d head(torch::nn::Conv2dOptions(8, 3, 1));
    for (const auto& module : std::vector<std::shared_ptr<torch::nn::Module>>{
             enc0.ptr(),
             enc1.ptr(),
             bottom.ptr(),
             dec1.ptr(),
             dec0.ptr(),
             refine.ptr(),
             head.ptr()}) {
      modules->push_back(module);
    }
    using In = const std::vector<torch::Tensor>&;
    stages = {
        {[enc0](In in) mutable { return enc0->forward(in[0]); },
         enc0.ptr(),
         {remat::kGraphInput}},
        {[enc1](In in) mutable {
           return enc1->forward(torch::max_pool2d(in[0], 2));
         },
         enc1.ptr(),
         {0}},
        {[bottom](In in) mutable {
           return bottom->forward(torch::max_pool2d(in[0], 2));
         },
         bottom.ptr(),
         {1}},
        {[dec1](In in) mutable {
           return dec1->forward(torch::cat({upsample(in[0]), in[1]}, 1));
         },
         dec1.ptr(),
         {2, 1}},
        {[dec0](In in) mutable {
           return dec0->forward(torch::cat({upsample(in[0]), in[1]}, 1));
         },
         dec0.ptr(),
         {3, 0}},
        {[refine](In in) mutable { return torch::relu(refine(in[0])); },
         refine.ptr(),
         {4}},
        // The same module again, with a residual from stage 4.
        {[refine](In in) mutable { return refine(in[0]) + in[1]; },
         refine.ptr(),
         {5, 4}},
        {[head](In in) mutable { return head(in[0]); }, head.ptr(), {6}},
    };
    input = torch::randn({4, 2, 16, 16}, torch::requires_grad());
    for (const auto& buffer : modules->buffers()) {
      initial_buffers.push_back(buffer.clone());
    }
  }

  using Step = remat::testing::MeasuredStep;

  /// One training step from the initial buffers, seed 99.
  Step step(const std::function<torch::Tensor(const torch::Tensor&)>& forward) {
    return remat::testing::measured_step(
        *modules, initial_buffers, input, forward);
  }

  Step plain_step() {
    return step(
        [&](const torch::Tensor& x) { return remat::run_graph(stages, x); });
  }
};

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::Error& error) {
    return error.what_without_backtrace();
  }
  return "";
}

// Checks one plan's step against the plain one and simulate().
void expect_planned_step_matches(
    SkipGraph& graph,
    const SkipGraph::Step& plain,
    const remat::planner::Graph& profiled,
    const remat::planner::Plan& plan,
    int64_t budget) {
  SCOPED_TRACE("plan " + plan.to_string());
  remat::PlannedGraph net(graph.stages, plan);
  const SkipGraph::Step planned =
      graph.step([&](const torch::Tensor& x) { return net->forward(x); });
  expect_same_step(plain, planned);
  const auto simulation = remat::planner::simulate(profiled, plan);
  ASSERT_TRUE(simulation.valid) << simulation.error;
  const int64_t measured =
      planned.activation_peak_bytes + profiled.input_bytes();
  EXPECT_LE(measured, budget);
  EXPECT_LE(measured, simulation.peak_bytes);
  EXPECT_GE(measured, static_cast<int64_t>(0.9 * simulation.peak_bytes))
      << "measured " << measured << ", predicted " << simulation.peak_bytes;
}

TEST(PlannedGraph, PlansWithinBudgetsMatchThePlainRunAndTheModel) {
  SkipGraph graph;
  const SkipGraph::Step plain = graph.plain_step();
  const remat::planner::Graph profiled = remat::profile_graph(
      graph.stages, graph.input, remat::ProfileOptions().warmup(0).repeats(1));
  ASSERT_EQ(profiled.size(), 8);
  EXPECT_FALSE(profiled.is_chain());
  EXPECT_EQ(profiled.inputs(4), (std::vector<int64_t>{3, 0}));
  const int64_t store_all =
      remat::planner::simulate(
          profiled, remat::planner::solve_store_all(profiled))
          .peak_bytes;
  const int64_t minimum = remat::planner::min_feasible_budget_bytes(profiled);
  EXPECT_LT(minimum, store_all);
  for (const remat::Budget& budget :
       {remat::Budget::parse("50%"),
        remat::Budget::parse("90%"),
        remat::Budget::bytes(minimum),
        remat::Budget::none()}) {
    SCOPED_TRACE("budget " + budget.to_string());
    const int64_t bytes = budget.resolve_bytes(profiled);
    if (bytes < minimum) {  // here 50 %: the decoder's last level alone
      // needs more (its record and backward transient).
      EXPECT_NE(
          message_of([&] {
            remat::plan_within(profiled, budget);
          }).find("expected a budget of at least " + std::to_string(minimum)),
          std::string::npos);
      continue;
    }
    expect_planned_step_matches(
        graph, plain, profiled, remat::plan_within(profiled, budget), bytes);
  }
}

// Every way of running every stage, executed: schedules with all stages in
// one mode, and each stage alone checkpointed or recomputed.
TEST(PlannedGraph, EveryStageModeMatchesThePlainRunAndTheModel) {
  SkipGraph graph;
  const SkipGraph::Step plain = graph.plain_step();
  const remat::planner::Graph profiled = remat::profile_graph(
      graph.stages, graph.input, remat::ProfileOptions().warmup(0).repeats(1));
  using remat::planner::StageMode;
  std::vector<std::vector<StageMode>> assignments;
  for (StageMode mode : {StageMode::kCheckpoint, StageMode::kRecompute}) {
    assignments.emplace_back(8, mode);
    for (int64_t i = 0; i < 7; ++i) {
      std::vector<StageMode> one(8, StageMode::kRecord);
      one[i] = mode;
      assignments.push_back(one);
    }
  }
  for (const auto& modes : assignments) {
    const remat::planner::Plan plan =
        remat::planner::schedule_graph(profiled, modes);
    expect_planned_step_matches(graph, plain, profiled, plan, INT64_MAX);
  }
}

TEST(PlannedGraph, AutoCheckpointPlansTheSampleShapeAndEvaluatesPlainly) {
  SkipGraph graph;
  const SkipGraph::Step plain = graph.plain_step();
  remat::PlannedGraph net = remat::auto_checkpoint(
      graph.stages,
      graph.input,
      remat::Budget::parse("80%"),
      remat::AutoCheckpointOptions().profile(
          remat::ProfileOptions().warmup(0).repeats(1)));
  ASSERT_TRUE(net->graph().has_value());
  EXPECT_LE(
      remat::planner::simulate(*net->graph(), net->plan()).peak_bytes,
      remat::Budget::parse("80%").resolve_bytes(*net->graph()));
  const SkipGraph::Step planned =
      graph.step([&](const torch::Tensor& x) { return net->forward(x); });
  expect_same_step(plain, planned);
  // Its modules are its children, each once (the shared one too).
  EXPECT_EQ(net->parameters().size(), graph.modules->parameters().size());
  // Another shape is refused, naming both.
  try {
    net->forward(torch::randn({2, 2, 16, 16}));
    ADD_FAILURE() << "expected an error";
  } catch (const c10::Error& error) {
    EXPECT_NE(
        std::string(error.what())
            .find("made for inputs of shape [4, 2, 16, 16]"),
        std::string::npos)
        << error.what();
  }
  // Evaluation runs the stages plainly, at any shape, the plan untouched.
  torch::NoGradGuard no_grad;
  const remat::planner::Plan plan = net->plan();
  for (const torch::Tensor& x : {graph.input, torch::randn({2, 2, 16, 16})}) {
    torch::manual_seed(1);
    const torch::Tensor expected = remat::run_graph(graph.stages, x);
    torch::manual_seed(1);
    EXPECT_TRUE(remat::testing::bitwise_equal(net->forward(x), expected));
  }
  EXPECT_EQ(net->plan(), plan);
}

TEST(PlannedGraph, RefusesBadGraphsNamingTheStage) {
  SkipGraph graph;
  auto stages = graph.stages;
  stages[2].inputs = {5};  // a cycle: 2 reads 5, which reads ... 2
  EXPECT_NE(
      message_of([&] {
        remat::profile_graph(stages, graph.input);
      }).find("remat::profile_graph: stage 2 reads 5, which is neither"),
      std::string::npos);
  stages = graph.stages;
  stages[3].inputs = {2, 17};
  EXPECT_NE(
      message_of([&] {
        remat::PlannedGraph(stages, remat::planner::Plan{});
      }).find("remat::PlannedGraph: stage 3 reads 17"),
      std::string::npos);
  stages = graph.stages;
  stages[4].forward = nullptr;
  EXPECT_NE(
      message_of([&] {
        remat::run_graph(stages, graph.input);
      }).find("stage 4 has none"),
      std::string::npos);
  EXPECT_NE(
      message_of([&] {
        remat::PlannedGraph(
            graph.stages, remat::planner::plan_from_string("R0 B0"));
      }).find("expected a valid plan for the 8 stages"),
      std::string::npos);
  EXPECT_NE(
      message_of([&] {
        remat::profile_graph(std::vector<remat::GraphStage>{}, graph.input);
      }).find("expected at least one stage"),
      std::string::npos);
}

}  // namespace

namespace {

// Runs `stages` plainly and under every schedule of one way for all stages
// and of each stage alone recomputed, from `input` (as it is: a view stays a
// view) requiring grad or not, and checks every parameter gradient and the
// input's gradient bitwise against the plain run.
void expect_every_schedule_matches_the_plain_run(
    const std::vector<remat::GraphStage>& stages,
    const torch::nn::Module& modules,
    const torch::Tensor& input,
    bool input_grad) {
  const auto run =
      [&](const std::function<torch::Tensor(torch::Tensor)>& forward) {
        for (auto& p : modules.parameters()) {
          p.mutable_grad() = torch::Tensor();
        }
        torch::Tensor x = input.detach().requires_grad_(input_grad);
        torch::manual_seed(3);
        forward(x).pow(2).sum().backward();
        std::vector<torch::Tensor> grads = grads_of(modules);
        grads.push_back(x.grad());
        return grads;
      };
  const auto plain =
      run([&](torch::Tensor x) { return remat::run_graph(stages, x); });
  const remat::planner::Graph structure = remat::profile_graph(
      stages,
      input.detach().requires_grad_(input_grad),
      remat::ProfileOptions().warmup(0).repeats(1));
  using remat::planner::StageMode;
  const auto n = static_cast<size_t>(structure.size());
  std::vector<std::vector<StageMode>> assignments{
      std::vector<StageMode>(n, StageMode::kRecord),
      std::vector<StageMode>(n, StageMode::kCheckpoint),
      std::vector<StageMode>(n, StageMode::kRecompute)};
  for (size_t i = 0; i + 1 < n; ++i) {
    std::vector<StageMode> one(n, StageMode::kRecord);
    one[i] = StageMode::kRecompute;
    assignments.push_back(one);
  }
  for (const auto& modes : assignments) {
    const remat::planner::Plan plan =
        remat::planner::schedule_graph(structure, modes);
    SCOPED_TRACE(plan.to_string());
    remat::PlannedGraph net(stages, plan);
    const auto planned = run([&](torch::Tensor x) { return net->forward(x); });
    ASSERT_EQ(planned.size(), plain.size());
    for (size_t k = 0; k < plain.size(); ++k) {
      EXPECT_TRUE(
          remat::testing::bitwise_equal_or_both_undefined(planned[k], plain[k]))
          << "gradient " << k;
    }
    EXPECT_EQ(planned.back().defined(), input_grad);
  }
}

// Hostile shapes of graphs, each run under every schedule of one way for
// all stages and of each stage alone recomputed: a stage that returns its
// input as is (the output aliases the input), a stage that reads one value
// twice and the graph input again, a last stage that reads the input, an
// input that needs no gradient, a graph of one stage, and stages whose
// outputs are views or a mask without gradient.
TEST(PlannedGraph, HostileShapesMatchThePlainRun) {
  torch::manual_seed(7);
  torch::nn::Linear a(6, 6);
  torch::nn::Linear b(6, 6);
  using In = const std::vector<torch::Tensor>&;
  const std::vector<remat::GraphStage> stages = {
      {[a](In in) mutable { return torch::tanh(a(in[0])); }, a.ptr(), {-1}},
      {[](In in) { return in[0]; }, nullptr, {0}},  // aliases its input
      {[b](In in) mutable {
         return b(in[0]) * in[1] + in[0] + in[2].sum(1, true);
       },
       b.ptr(),
       {1, 1, -1, 0}},
      {[](In in) { return torch::dropout(in[0], 0.3, true) + in[1]; },
       nullptr,
       {2, -1}},
  };
  const std::vector<remat::GraphStage> single = {
      {[a](In in) mutable { return a(in[0]); }, a.ptr(), {-1}}};
  // Outputs that are views (a slice, a transpose) and a mask that carries
  // no gradient, read together by the last stage.
  const std::vector<remat::GraphStage> views = {
      {[a](In in) mutable { return torch::tanh(a(in[0])); }, a.ptr(), {-1}},
      {[](In in) { return in[0].narrow(1, 0, 3); }, nullptr, {0}},
      {[](In in) { return in[0].t(); }, nullptr, {0}},
      {[](In in) { return (in[0].detach() > 0).to(torch::kFloat); },
       nullptr,
       {0}},
      {[b](In in) mutable {
         return b(torch::cat({in[0], in[0] * 2}, 1)) * in[1].t() * in[2];
       },
       b.ptr(),
       {1, 2, 3}},
  };
  // A value that one stage uses several times and a later stage reads too:
  // its gradient is summed as a plain backward sums it (the later reader's
  // part first, then each use), not the stage's uses first.
  const std::vector<remat::GraphStage> reread = {
      {[a](In in) mutable { return torch::tanh(a(in[0])); }, a.ptr(), {-1}},
      {[b](In in) mutable { return torch::tanh(b(in[0])) * in[0] + in[0] * 3; },
       b.ptr(),
       {0}},
      {[](In in) { return in[0] * in[1]; }, nullptr, {1, 0}},
  };
  // A complex value between stages (a spectral block: FFT, a product in
  // the frequency domain, inverse FFT) carries its gradient: the stages
  // before it are trained too.
  const std::vector<remat::GraphStage> spectral = {
      {[a](In in) mutable { return torch::fft::fft(torch::tanh(a(in[0]))); },
       a.ptr(),
       {-1}},
      {[](In in) { return in[0] * in[0]; }, nullptr, {0}},
      {[b](In in) mutable {
         return b(torch::real(torch::fft::ifft(in[0]))) + torch::abs(in[1]);
       },
       b.ptr(),
       {1, 0}},
  };
  torch::nn::ModuleList modules;
  modules->push_back(a);
  modules->push_back(b);
  for (const auto& graph_stages : {stages, single, views, reread, spectral}) {
    for (bool input_grad : {true, false}) {
      SCOPED_TRACE(
          "stages " + std::to_string(graph_stages.size()) + ", input grad " +
          std::to_string(input_grad));
      expect_every_schedule_matches_the_plain_run(
          graph_stages, *modules, torch::randn({5, 6}), input_grad);
    }
  }
}

// A stage that modifies what it reads in place is refused under every
// schedule and by the profiler, naming the stage and the value, instead of
// recomputing from the changed value (PlannedChain's test explains why).
TEST(PlannedGraph, RefusesAStageThatModifiesItsInputInPlace) {
  SkipGraph graph;
  auto stages = graph.stages;
  // Stage 5 (refine) reads stage 4's output, which stage 6 reads too.
  stages[5].forward =
      [refine = graph.stages[5].forward](const std::vector<torch::Tensor>& in) {
        in[0].relu_();
        return refine(in);
      };
  const remat::planner::Graph profiled = remat::profile_graph(
      graph.stages, graph.input, remat::ProfileOptions().warmup(0).repeats(1));
  using remat::planner::StageMode;
  for (StageMode mode :
       {StageMode::kRecord, StageMode::kCheckpoint, StageMode::kRecompute}) {
    remat::PlannedGraph net(
        stages,
        remat::planner::schedule_graph(
            profiled, std::vector<StageMode>(8, mode)));
    const std::string message =
        message_of([&] { net->forward(graph.input).sum().backward(); });
    EXPECT_TRUE(
        message.find("remat: stage 5 modified its input (the output of stage "
                     "4) in place") != std::string::npos ||
        message.find("remat: raised by the forward of stage 5; a stage must "
                     "not modify its inputs in place") != std::string::npos)
        << message;
  }
  EXPECT_NE(
      message_of([&] {
        remat::profile_graph(stages, graph.input);
      }).find("stage 5"),
      std::string::npos);
}

// One backward per forward, no torch::autograd::grad, no create_graph
// (whose gradients of gradients would be zero), and a defined input.
TEST(PlannedGraph, RefusesASecondBackwardAndAutogradGrad) {
  SkipGraph graph;
  const remat::planner::Graph profiled = remat::profile_graph(
      graph.stages, graph.input, remat::ProfileOptions().warmup(0).repeats(1));
  remat::PlannedGraph net(
      graph.stages, remat::planner::solve_store_all(profiled));
  torch::Tensor loss = net->forward(graph.input).sum();
  loss.backward({}, /*retain_graph=*/true);
  EXPECT_NE(
      message_of([&] {
        loss.backward();
      }).find("expected one backward per forward"),
      std::string::npos);
  torch::Tensor again = net->forward(graph.input).sum();
  EXPECT_NE(
      message_of([&] { torch::autograd::grad({again}, {graph.input}); })
          .find("torch::autograd::grad and backward(inputs=...) are not "
                "supported"),
      std::string::npos);
  EXPECT_NE(
      message_of([&] {
        net->forward(torch::Tensor());
      }).find("remat::PlannedGraph::forward: expected a defined input"),
      std::string::npos);
  torch::Tensor penalty = net->forward(graph.input).sum();
  EXPECT_NE(
      message_of([&] {
        penalty.backward({}, /*retain_graph=*/true, /*create_graph=*/true);
      }).find("backward(create_graph=true) is not supported"),
      std::string::npos);
}

// A stage that returns its input as it is (the graph input, or an earlier
// stage's output) while later stages read both it and that input: a plain
// backward adds every use of the one tensor to one accumulator, in the
// engine's order; the executor must not sum the alias's uses apart and add
// them to the input's sum afterwards (a different rounding).
TEST(PlannedGraph, AStageReturningItsInputSumsItsGradientAsOneValue) {
  torch::manual_seed(1);
  torch::nn::Linear a(6, 6);
  torch::nn::Linear b(6, 6);
  torch::nn::ModuleList modules;
  modules->push_back(a);
  modules->push_back(b);
  using In = const std::vector<torch::Tensor>&;
  const std::vector<std::vector<remat::GraphStage>> graphs = {
      // Stage 0 returns the graph input; stages 1 and 2 read both.
      {{[](In in) { return in[0]; }, nullptr, {remat::kGraphInput}},
       {[a](In in) mutable { return torch::tanh(a(in[0])) + in[1]; },
        a.ptr(),
        {0, remat::kGraphInput}},
       {[b](In in) mutable { return b(in[0]) * in[1] + in[2]; },
        b.ptr(),
        {1, remat::kGraphInput, 0}}},
      // Stage 1 returns stage 0's output; stages 2 and 3 read both.
      {{[a](In in) mutable { return torch::tanh(a(in[0])); },
        a.ptr(),
        {remat::kGraphInput}},
       {[](In in) { return in[0]; }, nullptr, {0}},
       {[b](In in) mutable { return torch::tanh(b(in[0])) + in[1]; },
        b.ptr(),
        {1, 0}},
       {[](In in) { return in[0] * in[1] + in[2]; }, nullptr, {2, 0, 1}}},
  };
  for (size_t g = 0; g < graphs.size(); ++g) {
    for (int trial = 0; trial < 4; ++trial) {
      SCOPED_TRACE(
          "graph " + std::to_string(g) + ", trial " + std::to_string(trial));
      // Odd trials: an input that is a view of a larger storage (a slice
      // of a batch), which a stage returning it must return as it is, not
      // as a compact copy.
      const torch::Tensor input = trial % 2 == 0
                                      ? torch::randn({5, 6})
                                      : torch::randn({5, 12}).narrow(1, 0, 6);
      expect_every_schedule_matches_the_plain_run(
          graphs[g], *modules, input, true);
    }
  }
}

// As AutoCheckpoint.AnInputGradientTheProfileDidNotMeasureIsRefused, for
// graphs: profiled on images that need no gradient, a training input that
// requires grad ran the peak 24 % above the budget (Conv2d first: 713,728
// bytes measured against 573,440); it is refused, leaving the gradients as
// they were, and the net still trains on inputs like the sample.
TEST(PlannedGraph, AnInputGradientTheProfileDidNotMeasureIsRefused) {
  torch::manual_seed(1);
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(3, 8, 3).padding(1));
  using In = const std::vector<torch::Tensor>&;
  const std::vector<remat::GraphStage> stages = {
      {[conv](In in) mutable { return conv(in[0]); },
       conv.ptr(),
       {remat::kGraphInput}},
      {[](In in) { return torch::relu(in[0]); }, nullptr, {0}}};
  const torch::Tensor images = torch::randn({4, 3, 32, 32});  // no grad
  const remat::Budget budget = remat::Budget::parse("100%");
  remat::PlannedGraph net = remat::auto_checkpoint(stages, images, budget);
  const int64_t limit = budget.resolve_bytes(*net->graph());
  for (auto& p : net->parameters()) {
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
  for (const auto& p : net->parameters()) {
    EXPECT_TRUE(torch::equal(p.grad(), torch::full_like(p, 0.5)));
  }
  remat::MemoryMeter meter;
  torch::Tensor loss = net->forward(images).sum();
  loss.backward();
  EXPECT_LE(
      meter.peak_delta_bytes() - 2 * static_cast<int64_t>(loss.nbytes()) +
          static_cast<int64_t>(images.nbytes()),
      limit);
}

}  // namespace
