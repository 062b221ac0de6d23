// e2_selective.cpp — scenario E2-selective: E2's budget sweep on the GPT,
// the optimal plan with a third way to run each block (keep what
// policies::save_compute_intensive() saves, recompute the rest) against the
// optimal plan with the two ways of rotor.
//
// The GPT's stages (models::gpt_stages, causal mask captured) are profiled
// once with the policy (ProfileOptions::selective_policy); the two-way chain
// is that profile with its selective costs removed, so both plans are solved
// on the same measurements. Per budget of 10%, 20%, ... 100% of the measured
// no-checkpoint peak (input included): both optimal plans, their predicted
// times (simulate()), and their measured steps (PlannedChain, one
// configuration per distinct plan, in one interleaved run). Peaks are in
// simulate()'s units (activation peak plus the input's bytes).
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "harness/scenario.h"
#include "models/gpt.h"
#include "remat/measure/statistics.h"
#include "remat/remat.h"

namespace remat::bench {
namespace {

struct E2SelectiveOptions {
  int64_t layers = 4;
  int64_t hidden = 256;
  int64_t heads = 4;
  int64_t seq = 128;
  int64_t batch = 8;
  double dropout = 0.1;
};

/// The chain with every stage's selective cost removed.
planner::Chain without_selective(const planner::Chain& chain) {
  std::vector<planner::StageCost> stages = chain.stages();
  for (planner::StageCost& stage : stages) {
    stage.selective.reset();
  }
  return planner::Chain(std::move(stages), chain.input_bytes())
      .with_cold_write_ms_per_mib(chain.cold_write_ms_per_mib());
}

int64_t selective_ops(const planner::Plan& plan) {
  int64_t count = 0;
  for (const planner::Op& op : plan.ops) {
    count += op.kind == planner::OpKind::kForwardSelective;
  }
  return count;
}

/// The GPT of a run, its token batches and its stages (causal mask
/// captured), with the policy of the selective third way.
struct SelectiveGpt {
  models::GptOptions gpt;
  int64_t batch = 0;
  torch::nn::Sequential model;
  torch::Tensor tokens;
  torch::Tensor targets;
  std::vector<Stage> stages;
  Policy policy;
};

// The GPT (seed 13) and its batch on the run's device; --quick: the
// smallest sizes.
SelectiveGpt build_gpt(
    const E2SelectiveOptions& options, const Context& context) {
  const bool quick = context.quick;
  SelectiveGpt run;
  run.gpt = models::GptOptions()
                .layers(quick ? 2 : options.layers)
                .hidden(quick ? 64 : options.hidden)
                .heads(quick ? 2 : options.heads)
                .seq_len(quick ? 32 : options.seq)
                .dropout(options.dropout);
  run.batch = quick ? 2 : options.batch;
  torch::manual_seed(13);
  run.model = models::gpt(run.gpt);
  const torch::Device device = context.torch_device();
  run.model->to(device);
  run.model->train();
  const auto long_options =
      torch::TensorOptions().dtype(torch::kLong).device(device);
  run.tokens = torch::randint(
      run.gpt.vocab(), {run.batch, run.gpt.seq_len()}, long_options);
  run.targets = torch::randint(
      run.gpt.vocab(), {run.batch, run.gpt.seq_len()}, long_options);
  const torch::Tensor mask = models::causal_mask(run.gpt.seq_len()).to(device);
  run.stages = models::gpt_stages(run.model, mask);
  run.policy = policies::save_compute_intensive();
  return run;
}

/// The two chains both plans are solved on: one profile, with and without
/// its selective costs.
struct ProfiledChains {
  planner::Chain three;  // with the selective third way
  planner::Chain two;    // the same, selective costs removed (rotor's)
  int64_t three_minimum_bytes = 0;  // min_feasible_budget_bytes(three)
  int64_t two_minimum_bytes = 0;    // min_feasible_budget_bytes(two)
};

ProfiledChains profile_both_ways(const SelectiveGpt& run, bool quick) {
  // More timed runs than the default: the plans follow the times.
  planner::Chain three = profile_chain(
      run.stages,
      run.tokens,
      ProfileOptions()
          .warmup(3)
          .repeats(quick ? 3 : 11)
          .selective_policy(run.policy));
  planner::Chain two = without_selective(three);
  const int64_t three_minimum = planner::min_feasible_budget_bytes(three);
  const int64_t two_minimum = planner::min_feasible_budget_bytes(two);
  return {std::move(three), std::move(two), three_minimum, two_minimum};
}

/// The configurations of the interleaved run: the plain model first, then
/// one PlannedChain per distinct plan.
class PlanConfigurations {
 public:
  explicit PlanConfigurations(const SelectiveGpt& run) : run_(run) {
    torch::nn::Sequential model = run.model;
    configurations_.push_back(
        {"no checkpointing", [model](const torch::Tensor& x) mutable {
           return model->forward(x);
         }});
  }

  /// The index of `plan`'s configuration, added under `name` if no equal
  /// plan has one yet.
  size_t configuration_for(const planner::Plan& plan, const std::string& name) {
    const std::string key = plan.to_string();
    if (!configuration_of_plan_.count(key)) {
      configuration_of_plan_[key] = configurations_.size();
      PlannedChain planned(
          run_.stages,
          plan,
          PlannedChainOptions().selective_policy(run_.policy));
      configurations_.push_back(
          {name, [planned](const torch::Tensor& x) mutable {
             return planned->forward(x);
           }});
    }
    return configuration_of_plan_[key];
  }

  const std::vector<Configuration>& all() const {
    return configurations_;
  }

 private:
  const SelectiveGpt& run_;
  std::vector<Configuration> configurations_;
  std::map<std::string, size_t> configuration_of_plan_;
};

/// One budget of the sweep and the plans that fit it.
struct BudgetRow {
  int percent = 0;
  int64_t budget = 0;
  std::optional<planner::Plan> two_ways;
  std::optional<planner::Plan> three_ways;
  std::optional<size_t> two_configuration;
  std::optional<size_t> three_configuration;
};

// Both optimal plans at 10%, 20%, ... 100% of the baseline peak, each with
// its configuration.
std::vector<BudgetRow> plan_budgets(
    const ProfiledChains& chains,
    int64_t baseline_peak_bytes,
    PlanConfigurations& configurations) {
  std::vector<BudgetRow> rows;
  for (int percent = 10; percent <= 100; percent += 10) {
    BudgetRow row;
    row.percent = percent;
    row.budget = baseline_peak_bytes * percent / 100;
    const std::string at = "@" + std::to_string(percent) + "%";
    if (row.budget >= chains.two_minimum_bytes) {
      row.two_ways = planner::solve_optimal(chains.two, row.budget);
      row.two_configuration =
          configurations.configuration_for(*row.two_ways, "two ways" + at);
    }
    if (row.budget >= chains.three_minimum_bytes) {
      row.three_ways = planner::solve_optimal(chains.three, row.budget);
      row.three_configuration =
          configurations.configuration_for(*row.three_ways, "three ways" + at);
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

/// The interleaved run's measurements, with peaks in simulate()'s units.
struct Measured {
  const RunResult& result;
  int64_t input_bytes = 0;

  const Measurement& operator[](size_t c) const {
    return result.configurations[c];
  }
  /// Configuration c's activation peak plus the input's bytes.
  int64_t peak(size_t c) const {
    return result.configurations[c].peak_bytes + input_bytes;
  }
};

/// The counts the summary states, gathered while the budgets table is built.
struct Comparison {
  int64_t compared = 0;      // budgets where both plans fit
  int64_t never_slower = 0;  // ... three ways predicted at least as fast
  int64_t faster = 0;        // ... three ways predicted strictly faster
  std::vector<RatioInterval> measured_ratios;  // three / two, measured
};

std::string about_text(
    const SelectiveGpt& run,
    const ProfiledChains& chains,
    const Measured& measured) {
  const models::GptOptions& gpt = run.gpt;
  std::ostringstream about;
  about << "Model: the built-in GPT, " << gpt.layers() << " layers, hidden "
        << gpt.hidden() << ", " << gpt.heads() << " heads, sequence "
        << gpt.seq_len() << ", batch " << run.batch << ", dropout "
        << gpt.dropout() << "; " << chains.three.size()
        << " stages (embedding, blocks, head), profiled once with "
           "`ProfileOptions::selective_policy(save_compute_intensive())`. "
           "\"Two ways\" is `solve_optimal` on that profile with its "
           "selective costs removed (keep everything or only the input, as "
           "rotor); \"three ways\" may also run a stage selectively (S). "
           "Budgets are fractions of the measured no-checkpoint peak "
        << planner::format_bytes(measured.peak(0))
        << " (input included); minimum feasible budget "
        << planner::format_bytes(chains.two_minimum_bytes) << " with two ways, "
        << planner::format_bytes(chains.three_minimum_bytes)
        << " with three. Baseline step "
        << Cell::ms(measured.result.baseline().step().median).markdown()
        << " ms interleaved.";
  return about.str();
}

// One row of the budgets table; a budget where both plans fit counts in
// `comparison`.
std::vector<Cell> budget_cells(
    const BudgetRow& row,
    const ProfiledChains& chains,
    const Measured& measured,
    Comparison& comparison) {
  std::vector<Cell> cells{
      Cell::text(std::to_string(row.percent) + "%"), Cell::bytes(row.budget)};
  if (!row.three_ways) {
    cells.push_back(Cell::text("no plan fits"));
    for (int k = 0; k < 4; ++k) {
      cells.push_back(Cell::empty());
    }
    return cells;
  }
  cells.push_back(Cell::integer(selective_ops(*row.three_ways)));
  const size_t c3 = *row.three_configuration;
  if (row.two_ways) {
    const double t3 = planner::simulate(chains.three, *row.three_ways).step_ms;
    const double t2 = planner::simulate(chains.two, *row.two_ways).step_ms;
    ++comparison.compared;
    comparison.never_slower += t3 <= t2 * (1 + 1e-6);
    comparison.faster += t3 < t2 * (1 - 1e-6);
    const RatioInterval ratio =
        measured[c3].step_ratio(measured[*row.two_configuration]);
    comparison.measured_ratios.push_back(ratio);
    cells.push_back(Cell::ratio(t3 / t2));
    cells.push_back(Cell::ratio_interval(ratio));
  } else {
    cells.push_back(Cell::text("only three ways fit"));
    cells.push_back(Cell::text("—"));
  }
  cells.push_back(Cell::bytes(measured.peak(c3)));
  cells.push_back(Cell::text(measured.peak(c3) <= row.budget ? "yes" : "NO"));
  return cells;
}

Table budgets_table(
    const std::vector<BudgetRow>& rows,
    const ProfiledChains& chains,
    const Measured& measured,
    Comparison& comparison) {
  Table table;
  table.name = "budgets";
  table.columns = {
      "budget (of the measured no-checkpoint peak)",
      "budget bytes",
      "S stages",
      "predicted time, three / two",
      "measured step, three / two [95% CI]",
      "measured peak, three ways",
      "within budget"};
  for (const BudgetRow& row : rows) {
    table.add_row(budget_cells(row, chains, measured, comparison));
  }
  return table;
}

Table configurations_table(
    const std::vector<Configuration>& configurations,
    const Measured& measured) {
  Table all;
  all.name = "configurations";
  all.caption = "every configuration (one per distinct plan)";
  all.columns = {"configuration", "measured peak"};
  for (const std::string& column : step_time_columns()) {
    all.columns.push_back(column);
  }
  for (size_t c = 0; c < configurations.size(); ++c) {
    std::vector<Cell> cells{
        Cell::text(configurations[c].name), Cell::bytes(measured.peak(c))};
    for (Cell& cell : step_time_cells(measured[c], measured[0])) {
      cells.push_back(std::move(cell));
    }
    all.add_row(std::move(cells));
  }
  return all;
}

std::string summary_text(const Comparison& comparison) {
  std::ostringstream summary;
  summary << "**Summary:** at " << comparison.never_slower << " of "
          << comparison.compared
          << " budgets where both fit, three ways are predicted at least as "
             "fast as two, strictly faster at "
          << comparison.faster << ".";
  if (!comparison.measured_ratios.empty()) {
    int64_t measured_faster = 0;
    int64_t measured_slower = 0;
    std::vector<double> medians;
    for (const RatioInterval& ratio : comparison.measured_ratios) {
      measured_faster += ratio.excludes_one() && ratio.high < 1;
      measured_slower += ratio.excludes_one() && ratio.low > 1;
      medians.push_back(ratio.median);
    }
    summary << " Measured, three ways were faster at " << measured_faster
            << " and slower at " << measured_slower << " of "
            << comparison.measured_ratios.size()
            << " budgets (interval of the paired ratio below or above 1), "
               "indistinguishable at the others; geometric mean of the "
               "median ratios "
            << Cell::ratio(geometric_mean(medians)).markdown() << ".";
  }
  return summary.str();
}

Section run_e2_selective(
    const E2SelectiveOptions& options, const Context& context) {
  SelectiveGpt run = build_gpt(options, context);
  const ProfiledChains chains = profile_both_ways(run, context.quick);
  const int64_t input_bytes = chains.three.input_bytes();

  const torch::Tensor targets = run.targets;
  Runner runner(
      {run.model.get(),
       run.tokens,
       [targets](const torch::Tensor& logits) {
         return models::gpt_loss(logits, targets);
       }},
      context.runner_options());
  PlanConfigurations configurations(run);
  const int64_t baseline_peak_bytes =
      runner.step(configurations.all().front().forward, 0).peak_bytes +
      input_bytes;
  const std::vector<BudgetRow> rows =
      plan_budgets(chains, baseline_peak_bytes, configurations);
  const RunResult result = runner.run(configurations.all());
  const Measured measured{result, input_bytes};

  Section section;
  section.title = "E2-selective — a third way per stage on the GPT";
  section.add_text(about_text(run, chains, measured));
  Comparison comparison;
  section.add_table(budgets_table(rows, chains, measured, comparison));
  section.add_table(configurations_table(configurations.all(), measured));
  section.add_text(summary_text(comparison));
  return section;
}

}  // namespace

const bool kE2SelectiveRegistered = register_scenario(
    {"E2-selective",
     "GPT budget sweep: optimal plans with and without a selective third way "
     "per stage",
     27,
     [](CLI::App& command) -> ScenarioRun {
       auto options = std::make_shared<E2SelectiveOptions>();
       command.add_option("--layers", options->layers, "GPT blocks")
           ->capture_default_str();
       command.add_option("--hidden", options->hidden, "GPT width")
           ->capture_default_str();
       command.add_option("--heads", options->heads, "Attention heads")
           ->capture_default_str();
       command.add_option("--seq", options->seq, "Sequence length")
           ->capture_default_str();
       command.add_option("--batch", options->batch, "Batch size")
           ->capture_default_str();
       command.add_option("--dropout", options->dropout, "Dropout")
           ->capture_default_str();
       return [options](const Context& context) {
         return run_e2_selective(*options, context);
       };
     }});

}  // namespace remat::bench
