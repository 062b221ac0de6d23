// e4_capacity.cpp — scenario E4: the largest batch under a fixed memory cap.
//
// Model: a residual FFN stack (models::residual_ffn_stack; defaults 16
// blocks, width 128, inner width 512, dropout 0.1; cap 32 MiB).
// remat::fit_batch finds, for no checkpointing, the fastest
// checkpoint_sequential(k) and the optimal plan, the largest batch whose
// training step stays under --cap (activations plus input, the planner's
// units); each answer is confirmed by one measured step there (its peak and
// time are what the table shows). Then every answer's plan is timed at its
// batch in interleaved rounds; time per sample = step time / batch, paired
// by round with no checkpointing's.
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "harness/scenario.h"
#include "models/models.h"
#include "remat/measure/statistics.h"
#include "remat/measure/step.h"
#include "remat/remat.h"

namespace remat::bench {
namespace {

struct E4Options {
  int64_t blocks = 16;
  int64_t dim = 128;
  int64_t hidden = 512;
  double dropout = 0.1;
  std::string cap = "32MiB";
  int64_t max_batch = 4096;
  std::vector<double> time_ratios{0, 1.3};  // FitOptions::max_time_ratio
};

Section run_e4(const E4Options& options, const Context& context) {
  const bool quick = context.quick;
  const auto model_options = models::ResidualFfnStackOptions()
                                 .blocks(quick ? 6 : options.blocks)
                                 .dim(quick ? 32 : options.dim)
                                 .hidden(quick ? 64 : options.hidden)
                                 .dropout(options.dropout);
  const Budget cap = Budget::parse(quick ? "2MiB" : options.cap);
  TORCH_CHECK(
      cap.kind() == Budget::Kind::kBytes,
      "E4: expected --cap in bytes, got ",
      options.cap);
  torch::manual_seed(5);
  torch::nn::Sequential model = models::residual_ffn_stack(model_options);
  const torch::Device device = context.torch_device();
  model->to(device);
  model->train();
  const int64_t dim = model_options.dim();
  const auto stages = stages_of(model);
  auto make_input = [dim, device](int64_t batch) {
    return torch::randn({batch, dim}, torch::TensorOptions().device(device));
  };
  // One row per answer: fit_batch's runs first, then every answer's plan
  // timed at its batch in interleaved rounds (A B C A B C ...), so that each
  // time per sample is paired with no checkpointing's of the same round.
  struct Answer {
    FitAnswer answer;
    std::string name;
    std::string limit;
    std::vector<double> step_ms;  // this scenario's timed rounds
  };
  std::vector<Answer> rows;
  bool none_listed = false;
  for (const double ratio : options.time_ratios) {
    const auto answers = fit_batch(
        make_input,
        stages,
        cap.budget_bytes(),
        FitOptions()
            .probe_batch(8)
            .max_batch(options.max_batch)
            .max_time_ratio(ratio));
    for (const FitAnswer& answer : answers) {
      if (answer.strategy == "none" && none_listed) {
        continue;  // the same in every run
      }
      none_listed = none_listed || answer.strategy == "none";
      Answer row;
      row.answer = answer;
      row.name = answer.strategy;
      if (answer.segments > 0) {
        row.name += "(" + std::to_string(answer.segments) + ")";
      }
      std::ostringstream limit;
      if (ratio > 0 && answer.strategy != "none") {
        limit << "≤ " << ratio << "× predicted per sample";
      } else {
        limit << "none";
      }
      row.limit = limit.str();
      rows.push_back(std::move(row));
    }
  }
  std::vector<std::pair<PlannedChain, torch::Tensor>> runs;
  for (const Answer& row : rows) {
    runs.emplace_back(
        row.answer.batch > 0 ? PlannedChain(stages, row.answer.plan)
                             : PlannedChain(nullptr),
        row.answer.batch > 0 ? make_input(row.answer.batch) : torch::Tensor());
  }
  for (int round = 0; round < context.warmup + context.rounds; ++round) {
    for (size_t r = 0; r < rows.size(); ++r) {
      if (rows[r].answer.batch == 0) {
        continue;
      }
      zero_gradients(model->parameters());
      const StepMeasurement step = measure_step(
          device, [&] { return runs[r].first->forward(runs[r].second).sum(); });
      if (round >= context.warmup) {
        rows[r].step_ms.push_back(step.step_ms());
      }
    }
  }
  runs.clear();

  Table table;
  table.name = "capacity";
  table.columns = {
      "strategy",
      "time limit",
      "batch",
      "batch ratio",
      "measured peak",
      "predicted peak",
      "step ms",
      "spread ms",
      "ms per sample",
      "time per sample ratio [95% CI]",
      "fit's predicted time per sample ratio",
      "fit's measured time per sample ratio [95% CI]"};
  const auto per_sample = [](const Answer& row) {
    std::vector<double> times = row.step_ms;
    for (double& time : times) {
      time /= static_cast<double>(row.answer.batch);
    }
    return times;
  };
  const Answer* none = nullptr;
  for (const Answer& row : rows) {
    if (row.answer.strategy == "none" && row.answer.batch > 0) {
      none = &row;
    }
  }
  for (const Answer& row : rows) {
    std::vector<Cell> cells{
        Cell::text(row.name),
        Cell::text(row.limit),
        Cell::integer(row.answer.batch)};
    if (row.answer.batch == 0) {
      while (cells.size() < table.columns.size()) {
        cells.push_back(Cell::empty());
      }
      table.add_row(std::move(cells));
      continue;
    }
    const Summary step = summarize(row.step_ms);
    cells.push_back(
        none != nullptr ? Cell::ratio(
                              static_cast<double>(row.answer.batch) /
                              static_cast<double>(none->answer.batch))
                        : Cell::empty());
    cells.push_back(Cell::bytes(row.answer.measured_peak_bytes));
    cells.push_back(Cell::bytes(row.answer.predicted_peak_bytes));
    cells.push_back(Cell::ms(step.median));
    cells.push_back(Cell::ms(step.spread()));
    cells.push_back(
        Cell::number(step.median / static_cast<double>(row.answer.batch), 4));
    cells.push_back(
        none != nullptr ? paired_ratio_cell(per_sample(row), per_sample(*none))
                        : Cell::empty());
    // What the limit was applied to, and fit_batch's own confirmation.
    cells.push_back(
        row.answer.predicted_time_ratio > 0
            ? Cell::ratio(row.answer.predicted_time_ratio)
            : Cell::empty());
    cells.push_back(
        row.answer.measured_time_ratio.rounds > 0
            ? Cell::ratio_interval(row.answer.measured_time_ratio)
            : Cell::empty());
    table.add_row(std::move(cells));
  }

  Section section;
  section.title = "E4 — capacity under a fixed cap";
  std::ostringstream about;
  about << "Model: residual FFN stack, " << model_options.blocks()
        << " blocks x + fc2(dropout(gelu(fc1(norm(x))))), width "
        << model_options.dim() << ", inner width " << model_options.hidden()
        << ", dropout " << model_options.dropout() << ", fp32. Cap "
        << cap.to_string()
        << " (activations plus the input, the planner's units). "
           "`remat::fit_batch`: the chain profiled at batch 8 and 16, every "
           "stage cost modelled as affine in the batch, the largest batch "
           "each strategy fits on that model (up to "
        << options.max_batch
        << "), checked by a profile at the answer and confirmed by one "
           "measured training step there (a step over the cap moves the "
           "answer down): the peaks shown are that step's. Step time: "
           "median of the timed rounds of the answer's plan at its batch, "
           "after the warm-up rounds (forward, sum, backward). "
           "`checkpoint_sequential(k)`: the fastest k that fits. Time "
           "limit: `FitOptions::max_time_ratio`, the largest batch whose "
           "predicted time per sample (simulate() on the chain profiled at "
           "that batch) is at most that multiple of no checkpointing's at "
           "its own answer (none: the largest batch that fits at any cost); "
           "fit_batch then times its answers against no checkpointing's in "
           "10 paired rounds. The last two columns are fit_batch's: the "
           "predicted ratio the limit was applied to and its measured "
           "confirmation; the `time per sample ratio` column is the same "
           "ratio from this scenario's own timed rounds. Ratios against no "
           "checkpointing.";
  section.add_text(about.str());
  section.add_table(std::move(table));
  return section;
}

}  // namespace

const bool kE4Registered = register_scenario(
    {"E4",
     "the largest batch under a fixed cap: none, checkpoint_sequential, "
     "optimal",
     40,
     [](CLI::App& command) -> ScenarioRun {
       auto options = std::make_shared<E4Options>();
       command.add_option("--blocks", options->blocks, "Residual FFN blocks")
           ->capture_default_str();
       command.add_option("--dim", options->dim, "Model width")
           ->capture_default_str();
       command.add_option("--hidden", options->hidden, "Inner width")
           ->capture_default_str();
       command.add_option("--dropout", options->dropout, "Dropout probability")
           ->capture_default_str();
       command.add_option("--cap", options->cap, "Memory cap in bytes")
           ->capture_default_str();
       command.add_option("--max-batch", options->max_batch, "Largest batch")
           ->capture_default_str();
       command
           .add_option(
               "--time-ratios",
               options->time_ratios,
               "FitOptions::max_time_ratio of each run (0: no limit)")
           ->capture_default_str()
           ->delimiter(',');
       return [options](const Context& context) {
         return run_e4(*options, context);
       };
     }});

}  // namespace remat::bench
