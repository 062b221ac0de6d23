// e2_executor.cpp — scenario E2-executor: what executing a plan costs.
//
// At 100 % of the budget the optimal plan is store-all: the same computation
// as plain autograd and as checkpoint_sequential(1), run by the plan executor
// (NOTE: [Plan execution]; its stage backwards run as one autograd pass,
// NOTE: [Linked stages], its forwards stage by stage). This scenario
// measures that plan against both on E2's two chains, and on a chain of 64
// tiny stages where the executor's fixed cost per stage is most of the step.
// One torch thread by default: on this 2-core machine a single-threaded step
// varies far less than a two-threaded one, and the question is the
// executor's own cost, not the kernels' scaling. Rounds are added until
// every ratio's interval is within the target half width or the round limit
// is reached; the section says which.
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "chain_plans.h"
#include "harness/scenario.h"
#include "models/models.h"

namespace remat::bench {
namespace {

struct ExecutorOptions {
  E2Sizes sizes;
  int threads = 1;            // torch threads while measuring
  double half_width = 0.005;  // target relative half width of each interval
  int max_rounds = 150;       // the most timed rounds per model
};

/// Median over rounds of (compared - baseline) in ms.
double median_difference_ms(
    const std::vector<double>& compared, const std::vector<double>& baseline) {
  std::vector<double> differences;
  for (size_t r = 0; r < compared.size() && r < baseline.size(); ++r) {
    differences.push_back(compared[r] - baseline[r]);
  }
  return summarize(differences).median;
}

std::string verdict(const RatioInterval& ratio) {
  if (!ratio.has_interval) {
    return "undecided: too few rounds";
  }
  if (ratio.low >= 0.99 && ratio.high <= 1.01) {
    return "met";
  }
  if (ratio.high < 0.99 || ratio.low > 1.01) {
    return "missed";
  }
  return "undecided";
}

void run_model(
    const std::string& id,
    const std::string& description,
    torch::nn::Sequential model,
    const torch::Tensor& input,
    const ExecutorOptions& options,
    const Context& context,
    Section& section) {
  const planner::Chain chain = profile_for_planning(model, input);
  remat::PlannedSequential store_all(model, planner::solve_store_all(chain));
  RunnerOptions runner_options = context.runner_options();
  runner_options.target_half_width = options.half_width;
  runner_options.max_rounds = options.max_rounds;
  Runner runner({model.get(), input, {}}, runner_options);
  const std::vector<Configuration> configurations{
      {"plain autograd",
       [model](const torch::Tensor& x) mutable { return model->forward(x); }},
      {"checkpoint_sequential(1)",
       [model](const torch::Tensor& x) mutable {
         return remat::checkpoint_sequential(model, 1, x);
       }},
      {"store-all plan (PlannedSequential)",
       [store_all](const torch::Tensor& x) mutable {
         return store_all->forward(x);
       }}};
  const RunResult result = runner.run(configurations);
  const Measurement& plain = result.configurations[0];
  const Measurement& sequential = result.configurations[1];
  const Measurement& planned = result.configurations[2];

  Table table;
  table.name = "E2-executor-" + id;
  table.caption = description + ": " + std::to_string(chain.size()) +
                  " stages, " + std::to_string(result.rounds) +
                  " timed rounds (" +
                  (result.converged ? "every interval within the target"
                                    : "round limit reached") +
                  ")";
  table.columns = {"configuration", "measured peak"};
  for (const std::string& column : step_time_columns()) {
    table.columns.push_back(column);
  }
  for (const Measurement& measurement : result.configurations) {
    std::vector<Cell> row{
        Cell::text(measurement.name), Cell::bytes(measurement.peak_bytes)};
    for (Cell& cell : step_time_cells(measurement, plain)) {
      row.push_back(std::move(cell));
    }
    table.add_row(std::move(row));
  }
  section.add_table(std::move(table));

  const RatioInterval against_plain = planned.step_ratio(plain);
  const RatioInterval against_sequential =
      paired_ratio(planned.step_ms, sequential.step_ms);
  const RatioInterval cpu_against_sequential =
      paired_ratio(planned.cpu_ms, sequential.cpu_ms);
  const double per_stage_us =
      1000 * median_difference_ms(planned.step_ms, plain.step_ms) /
      static_cast<double>(chain.size());
  std::ostringstream text;
  text << "Store-all plan / plain autograd: "
       << Cell::ratio_interval(against_plain).markdown()
       << " (target [0.99, 1.01]: " << verdict(against_plain)
       << "); / checkpoint_sequential(1): "
       << Cell::ratio_interval(against_sequential).markdown() << ", CPU time "
       << Cell::ratio_interval(cpu_against_sequential).markdown() << " ("
       << verdict(against_sequential) << "). Median paired difference to plain "
       << "autograd per stage: " << Cell::number(per_stage_us, 1).markdown()
       << " µs. Peaks: plain " << Cell::bytes(plain.peak_bytes).markdown()
       << ", store-all plan " << Cell::bytes(planned.peak_bytes).markdown()
       << ". Load average " << Cell::number(result.load_before, 2).markdown()
       << " before the rounds, "
       << Cell::number(result.load_after, 2).markdown() << " after.";
  section.add_text(text.str());
}

Section run_e2_executor(
    const ExecutorOptions& options, const Context& context) {
  Section section;
  section.title = "E2-executor — what executing a plan costs";
  const int threads_before = torch::get_num_threads();
  torch::set_num_threads(options.threads);
  section.add_text(
      "The store-all plan (every stage recorded: the optimal plan at 100 % of "
      "the budget) run by `remat::PlannedSequential`, against plain autograd "
      "and `remat::checkpoint_sequential(1)`: the same computation, so any "
      "difference is the executor's own cost. " +
      std::to_string(options.threads) +
      " torch thread(s); after the warm-up, timed rounds are added until "
      "every step-time ratio's 95 % interval has a half width of at most ±" +
      Cell::number(100 * options.half_width, 1).markdown() + " % or " +
      std::to_string(options.max_rounds) +
      " rounds were run. Time ratios against plain autograd; wall-clock step "
      "time, with the process's CPU time beside it. Gradients gated bitwise "
      "against plain autograd.");
  try {
    for (const E2Chain& chain :
         {options.sizes.resnet_chain(context),
          options.sizes.mlp_chain(context)}) {
      run_model(
          chain.id,
          "E2's " + chain.description,
          chain.model,
          chain.input,
          options,
          context,
          section);
    }
    {
      torch::manual_seed(13);
      torch::nn::Sequential model;
      for (int i = 0; i < 64; ++i) {
        model->push_back(torch::nn::Linear(64, 64));
      }
      run_model(
          "tiny",
          "64 stages of Linear(64→64), batch 4 (the executor's fixed cost per "
          "stage dominates)",
          model,
          torch::randn({4, 64}),
          options,
          context,
          section);
    }
  } catch (...) {
    torch::set_num_threads(threads_before);
    throw;
  }
  torch::set_num_threads(threads_before);
  return section;
}

}  // namespace

const bool kE2ExecutorRegistered = register_scenario(
    {"E2-executor",
     "the store-all plan against plain autograd: the plan executor's own cost",
     22,
     [](CLI::App& command) -> ScenarioRun {
       auto options = std::make_shared<ExecutorOptions>();
       options->sizes.add_flags(command);
       command
           .add_option("--executor-threads", options->threads, "torch threads")
           ->capture_default_str()
           ->check(CLI::PositiveNumber);
       command
           .add_option(
               "--target",
               options->half_width,
               "target relative half width of every ratio's interval")
           ->capture_default_str()
           ->check(CLI::Range(0.001, 0.5));
       command
           .add_option("--max-rounds", options->max_rounds, "most timed rounds")
           ->capture_default_str()
           ->check(CLI::PositiveNumber);
       return [options](const Context& context) {
         return run_e2_executor(*options, context);
       };
     }});

}  // namespace remat::bench
