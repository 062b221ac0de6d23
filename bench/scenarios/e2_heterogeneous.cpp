// e2_heterogeneous.cpp — scenario E2: heterogeneous chains, the optimal plan
// against checkpoint_sequential at equal memory.
//
// Models: a ResNet-style chain (channels 16-32-64-128, 2 blocks per stage,
// 32x32 images) and an MLP of 16 stages whose widths vary (256 ... 2048).
// Configurations of one interleaved Runner run per model: plain forward (the
// baseline), remat::checkpoint_sequential(k) for every k (non-reentrant), and
// the optimal plan (solve_optimal, 500 slots, on the profiled chain) per
// budget of 10%, 20%, ... 100% of the measured no-checkpoint peak (input
// included), one configuration per distinct plan. Per budget, the optimal
// plan's step time over the fastest checkpoint_sequential(k) whose measured
// peak fits the budget; "predicted" is the same ratio by simulate(). Peaks
// are in simulate()'s units (activation peak plus the input's bytes).
#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "chain_plans.h"
#include "harness/scenario.h"
#include "models/models.h"

namespace remat::bench {
namespace {

// What a configuration runs, as the planner sees it.
struct Predicted {
  int64_t stage_forwards = 0;
  int64_t peak_bytes = 0;
  double step_ms = 0;  // simulate()'s predicted step
};

struct E2Ratios {
  std::vector<RatioInterval>
      measured;                   // optimal / best k, per comparable budget
  std::vector<double> predicted;  // the same pairs by simulate()
  // Every configuration but the baseline: simulate()'s time ratio against
  // no checkpointing, and the measured one.
  std::vector<PredictedRatio> against_none;
};

Predicted predict(const planner::Chain& chain, const planner::Plan& plan) {
  const planner::Simulation simulation = planner::simulate(chain, plan);
  return {stage_forwards(plan), simulation.peak_bytes, simulation.step_ms};
}

// The summary: what the intervals support, budget by budget, then the
// averages of the medians for scale.
std::string e2_summary(const E2Ratios& ratios) {
  int64_t faster = 0;
  int64_t slower = 0;
  int64_t at_most_one = 0;
  std::vector<double> medians;
  const RatioInterval* worst = nullptr;
  for (const RatioInterval& ratio : ratios.measured) {
    faster += ratio.excludes_one() && ratio.high < 1;
    at_most_one += ratio.has_interval && ratio.high <= 1;
    slower += ratio.excludes_one() && ratio.low > 1;
    medians.push_back(ratio.median);
    if (worst == nullptr || ratio.median > worst->median) {
      worst = &ratio;
    }
  }
  const int64_t compared = static_cast<int64_t>(ratios.measured.size());
  std::ostringstream summary;
  summary << "**Summary:** optimal against the best checkpoint_sequential at "
          << compared << " budgets: faster at " << faster << " (interval below "
          << "1), slower at " << slower << " (interval above 1), "
          << "indistinguishable at " << compared - faster - slower
          << " (interval containing 1). Geometric mean of the median ratios "
          << Cell::ratio(geometric_mean(medians)).markdown()
          << "; the highest median " << Cell::ratio_interval(*worst).markdown()
          << "; intervals whose upper end is at most 1.00: " << at_most_one
          << " of " << compared
          << " (targets: a geometric mean ≤ 0.90, every upper end ≤ 1.00). "
             "Predicted by "
             "simulate() for the same pairs: geometric mean "
          << Cell::ratio(geometric_mean(ratios.predicted)).markdown()
          << ", highest "
          << Cell::ratio(*std::max_element(
                             ratios.predicted.begin(), ratios.predicted.end()))
                 .markdown()
          << ".";
  return summary.str();
}

void run_model(
    const std::string& id,
    const std::string& description,
    torch::nn::Sequential model,
    const torch::Tensor& input,
    const Context& context,
    Section& section,
    E2Ratios& ratios) {
  const planner::Chain chain = profile_for_planning(model, input);
  const int64_t stages = chain.size();
  const int64_t input_bytes = static_cast<int64_t>(input.nbytes());
  Runner runner({model.get(), input, {}}, context.runner_options());

  std::vector<Configuration> configurations{
      {"no checkpointing",
       [model](const torch::Tensor& x) mutable { return model->forward(x); }}};
  std::vector<Predicted> predicted{
      predict(chain, planner::solve_store_all(chain))};
  for (int64_t k = 1; k <= stages; ++k) {
    configurations.push_back(
        {"checkpoint_sequential(" + std::to_string(k) + ")",
         [model, k](const torch::Tensor& x) mutable {
           return remat::checkpoint_sequential(model, k, x);
         }});
    predicted.push_back(predict(chain, planner::solve_uniform(chain, k)));
  }
  // Budgets: fractions of the no-checkpoint peak measured now.
  const int64_t baseline_peak_bytes =
      runner.step(configurations.front().forward, 0).peak_bytes + input_bytes;
  const int64_t minimum = planner::min_feasible_budget_bytes(chain);
  std::vector<int64_t> budgets;
  std::vector<std::optional<size_t>> optimal_of_budget;
  std::map<std::string, size_t> configuration_of_plan;
  for (int percent = 10; percent <= 100; percent += 10) {
    const int64_t budget = baseline_peak_bytes * percent / 100;
    budgets.push_back(budget);
    const auto plan = budget >= minimum ? planner::solve_optimal(chain, budget)
                                        : std::nullopt;
    if (!plan) {
      optimal_of_budget.push_back(std::nullopt);
      continue;
    }
    const std::string key = plan->to_string();
    if (!configuration_of_plan.count(key)) {
      configuration_of_plan[key] = configurations.size();
      remat::PlannedSequential planned(model, *plan);
      configurations.push_back(
          {"optimal@" + std::to_string(percent) + "%",
           [planned](const torch::Tensor& x) mutable {
             return planned->forward(x);
           }});
      predicted.push_back(predict(chain, *plan));
    }
    optimal_of_budget.push_back(configuration_of_plan[key]);
  }
  const RunResult result = runner.run(configurations);
  const auto& measured = result.configurations;
  const auto peak = [&](size_t c) {
    return measured[c].peak_bytes + input_bytes;
  };

  std::ostringstream about;
  about << "**" << description << "**: " << stages << " stages; "
        << "no-checkpoint peak " << planner::format_bytes(peak(0))
        << ", minimum feasible budget " << planner::format_bytes(minimum)
        << "; baseline step "
        << Cell::ms(result.baseline().step().median).markdown()
        << " ms interleaved, "
        << Cell::ms(result.baseline_rerun.step().median).markdown()
        << " ms re-run alone at the end.";
  section.add_text(about.str());

  Table budget_table;
  budget_table.name = id + "-budgets";
  budget_table.columns = {
      "budget (of the measured no-checkpoint peak)",
      "budget bytes",
      "optimal peak",
      "optimal forward ms",
      "optimal backward ms",
      "optimal step ms",
      "optimal stage forwards",
      "best k",
      "best-k peak",
      "best-k forward ms",
      "best-k backward ms",
      "best-k step ms",
      "time ratio optimal / best k [95% CI]",
      "predicted ratio",
      "optimal within budget"};
  for (size_t b = 0; b < budgets.size(); ++b) {
    const int64_t budget = budgets[b];
    std::optional<size_t> best_k;
    for (int64_t k = 1; k <= stages; ++k) {
      const size_t c = static_cast<size_t>(k);
      if (peak(c) <= budget &&
          (!best_k ||
           measured[c].step().median < measured[*best_k].step().median)) {
        best_k = c;
      }
    }
    std::vector<Cell> row{
        Cell::text(std::to_string((b + 1) * 10) + "%"), Cell::bytes(budget)};
    const auto times = [&](size_t c) {
      row.push_back(Cell::ms(measured[c].forward().median));
      row.push_back(Cell::ms(measured[c].backward().median));
      row.push_back(Cell::ms(measured[c].step().median));
    };
    if (const auto c = optimal_of_budget[b]) {
      row.push_back(Cell::bytes(peak(*c)));
      times(*c);
      row.push_back(Cell::integer(predicted[*c].stage_forwards));
    } else {
      row.push_back(Cell::text("infeasible"));
      row.insert(row.end(), 4, Cell::empty());
    }
    if (best_k) {
      row.push_back(Cell::integer(static_cast<int64_t>(*best_k)));
      row.push_back(Cell::bytes(peak(*best_k)));
      times(*best_k);
    } else {
      row.push_back(Cell::text("none fits"));
      row.insert(row.end(), 4, Cell::empty());
    }
    const auto optimal = optimal_of_budget[b];
    if (optimal && best_k) {
      // Paired: both ran in every round, next to each other.
      const RatioInterval ratio =
          measured[*optimal].step_ratio(measured[*best_k]);
      const double predicted_ratio =
          predicted[*optimal].step_ms / predicted[*best_k].step_ms;
      ratios.measured.push_back(ratio);
      ratios.predicted.push_back(predicted_ratio);
      row.push_back(Cell::ratio_interval(ratio));
      row.push_back(Cell::ratio(predicted_ratio));
    } else {
      row.insert(row.end(), 2, Cell::empty());
    }
    row.push_back(
        optimal ? Cell::text(peak(*optimal) <= budget ? "yes" : "NO")
                : Cell::empty());
    budget_table.add_row(std::move(row));
  }
  section.add_table(std::move(budget_table));

  Table all;
  all.name = id + "-configurations";
  all.caption = description + ": every configuration";
  all.columns = {
      "configuration",
      "stage forwards",
      "predicted peak",
      "measured peak",
      "predicted time ratio"};
  for (const std::string& column : step_time_columns()) {
    all.columns.push_back(column);
  }
  for (size_t c = 0; c < configurations.size(); ++c) {
    std::vector<Cell> row{
        Cell::text(configurations[c].name),
        Cell::integer(predicted[c].stage_forwards),
        Cell::bytes(predicted[c].peak_bytes),
        Cell::bytes(peak(c)),
        Cell::ratio(predicted[c].step_ms / predicted[0].step_ms)};
    if (c > 0) {
      ratios.against_none.push_back(
          {predicted[c].step_ms / predicted[0].step_ms,
           measured[c].step_ratio(measured[0])});
    }
    for (Cell& cell : step_time_cells(measured[c], measured[0])) {
      row.push_back(std::move(cell));
    }
    all.add_row(std::move(row));
  }
  section.add_table(std::move(all));
}

Section run_e2(const E2Sizes& sizes, const Context& context) {
  Section section;
  section.title = "E2 — heterogeneous chains vs checkpoint_sequential";
  section.add_text(
      "Budgets are fractions of the measured no-checkpoint peak (input "
      "included). Per budget: the optimal plan (`solve_optimal`, " +
      std::to_string(planner::SolverOptions{}.memory_slots) +
      " slots, on the profiled chain) against the fastest "
      "`remat::checkpoint_sequential(k)` (non-reentrant) whose measured peak "
      "fits, every k measured in the same interleaved run. Predicted = "
      "simulate() on the profiled chain; time ratios in the configuration "
      "tables are against no checkpointing, predicted ones against "
      "store-all.");
  E2Ratios ratios;
  for (const E2Chain& chain :
       {sizes.resnet_chain(context), sizes.mlp_chain(context)}) {
    run_model(
        chain.id,
        chain.description,
        chain.model,
        chain.input,
        context,
        section,
        ratios);
  }
  if (!ratios.measured.empty()) {
    section.add_text(e2_summary(ratios));
  }
  if (!ratios.against_none.empty()) {
    section.add_text(prediction_summary(
        ratios.against_none,
        "the " + std::to_string(ratios.against_none.size()) +
            " configurations of both chains"));
  }
  return section;
}

}  // namespace

const bool kE2Registered = register_scenario(
    {"E2",
     "heterogeneous chains: optimal plan vs checkpoint_sequential(k) per "
     "budget",
     20,
     [](CLI::App& command) -> ScenarioRun {
       auto sizes = std::make_shared<E2Sizes>();
       sizes->add_flags(command);
       return
           [sizes](const Context& context) { return run_e2(*sizes, context); };
     }});

}  // namespace remat::bench
