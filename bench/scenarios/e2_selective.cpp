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
#include "remat/measure/statistics.h"
#include "models/gpt.h"
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
  return planner::Chain(std::move(stages), chain.input_bytes());
}

int64_t selective_ops(const planner::Plan& plan) {
  int64_t count = 0;
  for (const planner::Op& op : plan.ops) {
    count += op.kind == planner::OpKind::kForwardSelective;
  }
  return count;
}

Section run_e2_selective(
    const E2SelectiveOptions& options, const Context& context) {
  const bool quick = context.quick;
  const auto gpt = models::GptOptions()
                       .layers(quick ? 2 : options.layers)
                       .hidden(quick ? 64 : options.hidden)
                       .heads(quick ? 2 : options.heads)
                       .seq_len(quick ? 32 : options.seq)
                       .dropout(options.dropout);
  const int64_t batch = quick ? 2 : options.batch;
  torch::manual_seed(13);
  torch::nn::Sequential model = models::gpt(gpt);
  const torch::Device device = context.torch_device();
  model->to(device);
  model->train();
  const auto long_options =
      torch::TensorOptions().dtype(torch::kLong).device(device);
  const auto tokens =
      torch::randint(gpt.vocab(), {batch, gpt.seq_len()}, long_options);
  const auto targets =
      torch::randint(gpt.vocab(), {batch, gpt.seq_len()}, long_options);
  const torch::Tensor mask = models::causal_mask(gpt.seq_len()).to(device);
  const std::vector<Stage> stages = models::gpt_stages(model, mask);
  const Policy policy = policies::save_compute_intensive();
  // More timed runs than the default: the plans follow the times.
  const planner::Chain three = profile_chain(
      stages,
      tokens,
      ProfileOptions()
          .warmup(3)
          .repeats(quick ? 3 : 11)
          .selective_policy(policy));
  const planner::Chain two = without_selective(three);
  const int64_t input_bytes = three.input_bytes();

  Runner runner(
      {model.get(),
       tokens,
       [targets](const torch::Tensor& logits) {
         return models::gpt_loss(logits, targets);
       }},
      context.runner_options());
  std::vector<Configuration> configurations{
      {"no checkpointing",
       [model](const torch::Tensor& x) mutable { return model->forward(x); }}};
  const int64_t baseline_peak_bytes =
      runner.step(configurations.front().forward, 0).peak_bytes + input_bytes;

  struct Row {
    int percent = 0;
    int64_t budget = 0;
    std::optional<planner::Plan> two_ways;
    std::optional<planner::Plan> three_ways;
    std::optional<size_t> two_configuration;
    std::optional<size_t> three_configuration;
  };
  std::map<std::string, size_t> configuration_of_plan;
  const auto configuration_for = [&](const planner::Plan& plan,
                                     const std::string& name) {
    const std::string key = plan.to_string();
    if (!configuration_of_plan.count(key)) {
      configuration_of_plan[key] = configurations.size();
      PlannedChain planned(
          stages, plan, PlannedChainOptions().selective_policy(policy));
      configurations.push_back(
          {name, [planned](const torch::Tensor& x) mutable {
             return planned->forward(x);
           }});
    }
    return configuration_of_plan[key];
  };
  const int64_t two_minimum = planner::min_feasible_budget_bytes(two);
  const int64_t three_minimum = planner::min_feasible_budget_bytes(three);
  std::vector<Row> rows;
  for (int percent = 10; percent <= 100; percent += 10) {
    Row row;
    row.percent = percent;
    row.budget = baseline_peak_bytes * percent / 100;
    const std::string at = "@" + std::to_string(percent) + "%";
    if (row.budget >= two_minimum) {
      row.two_ways = planner::solve_optimal(two, row.budget);
      row.two_configuration = configuration_for(*row.two_ways, "two ways" + at);
    }
    if (row.budget >= three_minimum) {
      row.three_ways = planner::solve_optimal(three, row.budget);
      row.three_configuration =
          configuration_for(*row.three_ways, "three ways" + at);
    }
    rows.push_back(std::move(row));
  }
  const RunResult result = runner.run(configurations);
  const auto& measured = result.configurations;
  const auto peak = [&](size_t c) {
    return measured[c].peak_bytes + input_bytes;
  };

  Section section;
  section.title = "E2-selective — a third way per stage on the GPT";
  std::ostringstream about;
  about << "Model: the built-in GPT, " << gpt.layers() << " layers, hidden "
        << gpt.hidden() << ", " << gpt.heads() << " heads, sequence "
        << gpt.seq_len() << ", batch " << batch << ", dropout " << gpt.dropout()
        << "; " << three.size()
        << " stages (embedding, blocks, head), profiled once with "
           "`ProfileOptions::selective_policy(save_compute_intensive())`. "
           "\"Two ways\" is `solve_optimal` on that profile with its "
           "selective costs removed (keep everything or only the input, as "
           "rotor); \"three ways\" may also run a stage selectively (S). "
           "Budgets are fractions of the measured no-checkpoint peak "
        << planner::format_bytes(peak(0))
        << " (input included); minimum feasible budget "
        << planner::format_bytes(two_minimum) << " with two ways, "
        << planner::format_bytes(three_minimum) << " with three. Baseline step "
        << Cell::ms(result.baseline().step().median).markdown()
        << " ms interleaved.";
  section.add_text(about.str());

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
  int64_t compared = 0;
  int64_t never_slower = 0;
  int64_t faster = 0;
  std::vector<RatioInterval> measured_ratios;
  for (const Row& row : rows) {
    std::vector<Cell> cells{
        Cell::text(std::to_string(row.percent) + "%"), Cell::bytes(row.budget)};
    if (!row.three_ways) {
      cells.push_back(Cell::text("no plan fits"));
      for (int k = 0; k < 4; ++k) {
        cells.push_back(Cell::empty());
      }
      table.add_row(std::move(cells));
      continue;
    }
    cells.push_back(Cell::integer(selective_ops(*row.three_ways)));
    const size_t c3 = *row.three_configuration;
    if (row.two_ways) {
      const double t3 = planner::simulate(three, *row.three_ways).time_ms;
      const double t2 = planner::simulate(two, *row.two_ways).time_ms;
      ++compared;
      never_slower += t3 <= t2 * (1 + 1e-6);
      faster += t3 < t2 * (1 - 1e-6);
      const RatioInterval ratio =
          measured[c3].step_ratio(measured[*row.two_configuration]);
      measured_ratios.push_back(ratio);
      cells.push_back(Cell::ratio(t3 / t2));
      cells.push_back(Cell::ratio_interval(ratio));
    } else {
      cells.push_back(Cell::text("only three ways fit"));
      cells.push_back(Cell::text("—"));
    }
    cells.push_back(Cell::bytes(peak(c3)));
    cells.push_back(Cell::text(peak(c3) <= row.budget ? "yes" : "NO"));
    table.add_row(std::move(cells));
  }
  section.add_table(std::move(table));

  Table all;
  all.name = "configurations";
  all.caption = "every configuration (one per distinct plan)";
  all.columns = {"configuration", "measured peak"};
  for (const std::string& column : step_time_columns()) {
    all.columns.push_back(column);
  }
  for (size_t c = 0; c < configurations.size(); ++c) {
    std::vector<Cell> cells{
        Cell::text(configurations[c].name), Cell::bytes(peak(c))};
    for (Cell& cell : step_time_cells(measured[c], measured[0])) {
      cells.push_back(std::move(cell));
    }
    all.add_row(std::move(cells));
  }
  section.add_table(std::move(all));

  std::ostringstream summary;
  summary << "**Summary:** at " << never_slower << " of " << compared
          << " budgets where both fit, three ways are predicted at least as "
             "fast as two, strictly faster at "
          << faster << ".";
  if (!measured_ratios.empty()) {
    int64_t measured_faster = 0;
    int64_t measured_slower = 0;
    std::vector<double> medians;
    for (const RatioInterval& ratio : measured_ratios) {
      measured_faster += ratio.excludes_one() && ratio.high < 1;
      measured_slower += ratio.excludes_one() && ratio.low > 1;
      medians.push_back(ratio.median);
    }
    summary << " Measured, three ways were faster at " << measured_faster
            << " and slower at " << measured_slower << " of "
            << measured_ratios.size()
            << " budgets (interval of the paired ratio below or above 1), "
               "indistinguishable at the others; geometric mean of the "
               "median ratios "
            << Cell::ratio(geometric_mean(medians)).markdown() << ".";
  }
  section.add_text(summary.str());
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
