// e1_chain.cpp — scenario E1: a homogeneous chain, optimality of the plans.
//
// Model: n blocks of Linear(width->width)+ReLU (models::uniform_mlp_chain),
// batch `batch`, fp32, for each n of --blocks. Budgets: the minimum feasible,
// fractions 0.05, 1/sqrt(n), 2/sqrt(n), 0.5 and 1 of the way from it to the
// store-all peak, and "about 2 sqrt(n) activations kept" (store-all minus
// n - ceil(2 sqrt(n)) activations). Per budget, solve_optimal's plan (500
// slots) on the profiled chain with equal stage times; its executed stage
// forwards next to the fewest any plan needs at that budget (the same DP on
// the chain with every forward costing 1 and every backward 0: exact here,
// the sizes share one factor). Every plan runs as a PlannedSequential in one
// interleaved Runner run with plain forward as the baseline. Peaks are in
// simulate()'s units: activation peak plus the input's bytes.
// Rule of thumb the time ratio is compared with: 1 + extra_forwards / (3 n)
// (a stage's backward costs about two forwards).
#include <algorithm>
#include <cmath>
#include <iomanip>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "chain_plans.h"
#include "harness/scenario.h"
#include "models/models.h"

namespace remat::bench {
namespace {

struct E1Options {
  std::vector<int64_t> blocks{32, 64};  // chain lengths n
  int64_t width = 512;                  // Linear width
  int64_t batch = 1024;                 // rows of the input (--quick: 64)
};

Table run_chain(
    const E1Options& options,
    int64_t batch,
    int64_t blocks,
    const Context& context,
    std::string* note,
    std::vector<PredictedRatio>* predictions) {
  torch::manual_seed(7);
  auto model = remat::models::uniform_mlp_chain(blocks, options.width);
  const auto input = torch::randn({batch, options.width});
  const planner::Chain chain =
      with_equal_stage_times(profile_for_planning(model, input));
  const int64_t minimum = planner::min_feasible_budget_bytes(chain);
  const planner::Plan store_all_plan = planner::solve_store_all(chain);
  const planner::Simulation store_all =
      planner::simulate(chain, store_all_plan);

  const double root = std::sqrt(static_cast<double>(blocks));
  const int64_t activation_bytes = chain.stage(0).output_bytes;
  const int64_t two_root_kept =
      store_all.peak_bytes -
      (blocks - static_cast<int64_t>(std::ceil(2.0 * root))) * activation_bytes;
  std::vector<int64_t> budgets{two_root_kept};
  for (const double fraction : {0.0, 0.05, 1.0 / root, 2.0 / root, 0.5, 1.0}) {
    budgets.push_back(
        minimum +
        static_cast<int64_t>(
            fraction * static_cast<double>(store_all.peak_bytes - minimum)));
  }
  std::sort(budgets.begin(), budgets.end());
  budgets.erase(std::unique(budgets.begin(), budgets.end()), budgets.end());

  std::vector<planner::StageCost> unit_stages = chain.stages();
  for (planner::StageCost& stage : unit_stages) {
    stage.forward_ms = 1;
    stage.backward_ms = 0;
  }
  const planner::Chain counting(unit_stages, chain.input_bytes());

  std::vector<Configuration> configurations{
      {"none",
       [model](const torch::Tensor& x) mutable { return model->forward(x); }}};
  std::vector<planner::Plan> plans{store_all_plan};
  std::vector<int64_t> least_forwards{blocks};
  for (const int64_t budget : budgets) {
    const auto plan = planner::solve_optimal(chain, budget);
    TORCH_CHECK(
        plan.has_value(), "E1: no plan at a budget of ", budget, " bytes");
    plans.push_back(*plan);
    least_forwards.push_back(
        stage_forwards(*planner::solve_optimal(counting, budget)));
    remat::PlannedSequential planned(model, *plan);
    configurations.push_back(
        {"optimal@" + std::to_string(budget),
         [planned](const torch::Tensor& x) mutable {
           return planned->forward(x);
         }});
  }

  Runner runner({model.get(), input, {}}, context.runner_options());
  const RunResult result = runner.run(configurations);
  const Measurement& baseline = result.baseline();
  const int64_t input_bytes = static_cast<int64_t>(input.nbytes());

  Table table;
  table.name = "n" + std::to_string(blocks);
  table.caption = "n = " + std::to_string(blocks);
  table.columns = {
      "budget",
      "predicted peak",
      "measured peak",
      "memory ratio",
      "stage forwards",
      "least forwards"};
  for (const std::string& column : step_time_columns()) {
    table.columns.push_back(column);
  }
  table.columns.push_back("rule 1 + extra/(3n)");
  table.columns.push_back("predicted time ratio");
  int64_t at_least = 0;
  for (size_t c = 0; c < configurations.size(); ++c) {
    const Measurement& measured = result.configurations[c];
    const planner::Simulation simulation = planner::simulate(chain, plans[c]);
    const int64_t forwards = stage_forwards(plans[c]);
    at_least += forwards == least_forwards[c] ? 1 : 0;
    std::vector<Cell> row;
    if (c == 0) {
      row.push_back(Cell::text("none (plain forward)"));
    } else {
      const int64_t budget = budgets[c - 1];
      row.push_back(
          budget == two_root_kept
              ? Cell::text(planner::format_bytes(budget) + " (2√n kept)")
              : Cell::bytes(budget));
    }
    row.push_back(Cell::bytes(simulation.peak_bytes));
    row.push_back(Cell::bytes(measured.peak_bytes + input_bytes));
    row.push_back(Cell::ratio(
        static_cast<double>(measured.peak_bytes + input_bytes) /
        static_cast<double>(baseline.peak_bytes + input_bytes)));
    row.push_back(Cell::integer(forwards));
    row.push_back(Cell::integer(least_forwards[c]));
    for (Cell& cell : step_time_cells(measured, baseline)) {
      row.push_back(std::move(cell));
    }
    row.push_back(Cell::ratio(
        1.0 + static_cast<double>(forwards - blocks) / (3.0 * blocks)));
    row.push_back(Cell::ratio(simulation.step_ms / store_all.step_ms));
    table.add_row(std::move(row));
    if (c > 0) {
      predictions->push_back(
          {simulation.step_ms / store_all.step_ms,
           measured.step_ratio(baseline)});
    }
  }
  std::ostringstream summary;
  summary << "n = " << blocks << ": stage forwards equal the least possible on "
          << at_least << " of " << configurations.size()
          << " rows; baseline step "
          << Cell::ms(baseline.step().median).markdown() << " ms interleaved, "
          << Cell::ms(result.baseline_rerun.step().median).markdown()
          << " ms re-run alone at the end; profiled cold writes " << std::fixed
          << std::setprecision(3) << chain.cold_write_ms_per_mib()
          << " ms per MiB (simulate()'s step time adds them per MiB of the "
             "peak).";
  *note = summary.str();
  return table;
}

}  // namespace

const bool kE1Registered = register_scenario(
    {"E1",
     "homogeneous chain: optimal plans' recomputation and time per budget",
     10,
     [](CLI::App& command) -> ScenarioRun {
       auto options = std::make_shared<E1Options>();
       command.add_option("--blocks", options->blocks, "Chain lengths n")
           ->capture_default_str()
           ->delimiter(',');
       command.add_option("--width", options->width, "Linear width")
           ->capture_default_str();
       command
           .add_option(
               "--batch", options->batch, "Input rows (--quick: at most 64)")
           ->capture_default_str();
       return [options](const Context& context) {
         const int64_t batch = context.quick
                                   ? std::min<int64_t>(options->batch, 64)
                                   : options->batch;
         Section section;
         section.title = "E1 — homogeneous chain, optimality";
         std::ostringstream about;
         about << "Model: n blocks of Linear(" << options->width << "→"
               << options->width << ")+ReLU, batch " << batch
               << ", fp32. Budgets from the minimum feasible to store-all, "
                  "plus one keeping about 2√n activations; plans from "
                  "`solve_optimal` ("
               << planner::SolverOptions{}.memory_slots
               << " slots) on the profiled chain with "
                  "every stage's times set to the median over the stages. "
                  "`least forwards`: the fewest stage forwards any plan "
                  "needs at the budget (n = none recomputed). Peaks include "
                  "the input (simulate()'s units); time ratios against the "
                  "plain forward in the same run.";
         section.add_text(about.str());
         std::vector<PredictedRatio> predictions;
         for (const int64_t blocks : options->blocks) {
           std::string note;
           section.add_table(run_chain(
               *options, batch, blocks, context, &note, &predictions));
           section.add_text(note);
         }
         section.add_text(prediction_summary(
             predictions,
             "the " + std::to_string(predictions.size()) +
                 " plans of every n"));
         return section;
       };
     }});

}  // namespace remat::bench
