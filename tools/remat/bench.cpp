// bench.cpp: `remat bench`: sweep budgets x strategies on a built-in model,
// print a table, and write a report folder: bench.csv (the same rows),
// plot.png (step time against measured activation peak, one curve per
// strategy, drawn by gnuplot) and README.md (summary linking both).
//
// Three steps, each a function: plan_rows (one row per strategy and budget,
// its plan chosen or its infeasibility stated), measure (the rows' executors
// run by remat::measure's interleaved Runner: gradient gate, warm-up and
// timed rounds A B C A B C ..., the no-checkpoint row as the baseline; each
// time ratio paired by round, with its 95 % interval) and render (one
// report::Table of the rows, written as the terminal table, the CSV, the
// JSON rows and the README's Markdown, plus the plot). The measuring
// protocol is remat/measure/runner.h's; no optimizer step is taken.
// The no-checkpoint configuration ("none") is always measured: it is the
// reference of every ratio and of the correctness gate (gradients bitwise
// equal on CPU, or the command fails). Budget-driven strategies (optimal,
// chen) get one row per budget; fixed ones (sqrt, uniform:K, none) one row.
// 100% of a budget is the simulated store-all peak; measured peaks are in the
// same units (activation peak plus the input's bytes).
#include <algorithm>
#include <iomanip>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <variant>

#include <remat/profile.h>
#include <nlohmann/json.hpp>

#include <remat/budget.h>
#include "cli_error.h"
#include "commands.h"
#include "gnuplot.h"
#include "remat/measure/machine.h"
#include "remat/measure/runner.h"
#include "report/report.h"
#include "runtime.h"
#include "strategy.h"

namespace remat::cli {
namespace {

// One configuration of the sweep and, once measured, what was measured.
struct BenchRow {
  std::string strategy;      // as reports name it: "uniform:2", "per-block"
  std::string budget_label;  // "50%", "512 MiB", or "-" for fixed strategies
  std::optional<int64_t> budget_bytes;
  std::optional<PlanChoice> choice;  // nullopt: infeasible
  std::string status = "ok";
  std::optional<measure::Measurement> measured;
  /// The no-checkpoint row: the reference of every ratio.
  bool baseline() const {
    return strategy == "none";
  }
};

std::string file_stem(std::string strategy) {
  std::replace(strategy.begin(), strategy.end(), ':', '_');
  return strategy;
}

// What the sweep plans and runs: a chain model (its stages and the loss, a
// Sequential) or a U-Net's training graph, with the stage costs profiled on
// the batch (whose targets are set).
struct BenchModel {
  torch::nn::Sequential chain_model{nullptr};
  std::optional<TrainingGraph> graph;
  StageCosts costs;
  Mode mode = Mode::kNonReentrant;

  int64_t stages() const {
    return std::visit([](const auto& model) { return model.size(); }, costs);
  }
  /// Bytes of the last stage's output: the loss value.
  int64_t loss_bytes() const {
    if (graph) {
      const auto& costs_of_graph = std::get<planner::Graph>(costs);
      return costs_of_graph.value_bytes(costs_of_graph.size());
    }
    const auto& chain = std::get<planner::Chain>(costs);
    return chain.stage(chain.size() - 1).output_bytes;
  }
  /// The module that owns every parameter trained.
  torch::nn::Module* module() const {
    if (graph) {
      return graph->unet.ptr().get();
    }
    return chain_model.ptr().get();
  }
  /// Whether `strategy` (as reports name it) gets one row per budget.
  bool budget_driven(const std::string& strategy) const {
    return graph ? strategy == "optimal"
                 : planner::Strategy::parse(strategy).uses_budget();
  }
  /// The plan of `strategy` within `budget`, bound as a sweep's.
  PlanChoice choose(
      const std::string& strategy,
      const Budget& budget,
      const planner::SolverOptions& solver) const {
    if (graph) {
      return choose_graph_plan(
          std::get<planner::Graph>(costs),
          parse_graph_strategy(strategy),
          graph->encoder_stages,
          budget,
          BudgetOrigin::kSweep,
          solver);
    }
    return choose_plan(
        std::get<planner::Chain>(costs),
        planner::Strategy::parse(strategy),
        budget,
        BudgetOrigin::kSweep,
        solver);
  }
  /// The executor of a feasible row.
  std::shared_ptr<Executor> executor(const BenchRow& row) const {
    if (graph) {
      return std::make_shared<Executor>(*graph, *row.choice, row.baseline());
    }
    return std::make_shared<Executor>(chain_model, *row.choice, mode);
  }
};

// The model of `workload` profiled on `batch`; the strategies' names
// checked against it (a chain's or a U-Net's).
BenchModel bench_model(
    const BenchOptions& options,
    Workload& workload,
    const Batch& batch,
    const std::vector<std::string>& strategies) {
  if (workload.is_graph()) {
    if (options.mode_given) {
      throw UsageError(
          "--mode: not supported with --model " + options.model.model +
          " (a U-Net's rows run by PlannedGraph)");
    }
    for (const std::string& strategy : strategies) {
      if (strategy != "optimal" && strategy != "none" &&
          strategy != "per-block" && strategy != "encoder") {
        throw UsageError(
            "--strategies: a U-Net is swept with optimal, none, per-block or "
            "encoder, got '" +
            strategy + "'");
      }
    }
    TrainingGraph graph = workload.training_graph();
    StageCosts costs = profile_training_graph(
        graph, batch, Precision::kFloat32, ProfileOptions());
    return {torch::nn::Sequential(nullptr), std::move(graph), std::move(costs)};
  }
  const Mode mode = parse_mode(options.mode);
  torch::nn::Sequential model = workload.training_model();  // + loss
  set_targets(model, batch);
  for (const std::string& strategy : strategies) {
    if (strategy == "per-block" || strategy == "encoder") {
      throw UsageError(
          "--strategies: " + strategy +
          " is a U-Net's strategy (--model unet2d or unet3d); a chain's are "
          "optimal, chen, sqrt, uniform:K and none");
    }
    check_trainable(
        planner::Strategy::parse(strategy),
        mode,
        static_cast<int64_t>(model->size()),
        batch.inputs);
  }
  StageCosts costs = profile_chain(model, batch.inputs);
  return {model, std::nullopt, std::move(costs), mode};
}

std::string join(const std::vector<std::string>& values) {
  std::string text;
  for (const std::string& value : values) {
    text += (text.empty() ? "" : ",") + value;
  }
  return text;
}

// Refuses a value given twice in `flag`'s list (each row would be measured
// and reported twice).
void refuse_repeats(const std::string& flag, std::vector<std::string> values) {
  std::sort(values.begin(), values.end());
  const auto repeat = std::adjacent_find(values.begin(), values.end());
  if (repeat != values.end()) {
    throw UsageError(flag + ": '" + *repeat + "' is given twice");
  }
}

std::string command_line(
    const BenchOptions& options, const std::vector<std::string>& strategies) {
  std::ostringstream text;
  const ModelFlags& model = options.model;
  text << "remat bench --model " << model.model;
  if (is_graph_model(model.model)) {
    text << " --levels " << model.levels << " --hidden " << model.hidden
         << " --image " << model.image;
  } else {
    text << " --layers " << model.layers << " --hidden " << model.hidden;
  }
  if (model.model == "gpt") {
    text << " --heads " << model.heads << " --seq " << model.seq;
  }
  if (model.model == "resnet") {
    text << " --image " << model.image;
  }
  text << " --batch " << model.batch << " --dropout " << model.dropout
       << " --budgets " << join(options.budgets) << " --strategies "
       << join(strategies) << " --warmup " << options.warmup << " --repeats "
       << options.repeats << " --threads " << options.threads << " --seed "
       << options.seed << " --out " << options.out;
  return text.str();
}

std::vector<BenchRow> plan_rows(
    const BenchOptions& options,
    const BenchModel& model,
    const std::vector<std::string>& strategies) {
  std::vector<BenchRow> rows;
  for (const std::string& strategy : strategies) {
    std::vector<std::pair<std::string, Budget>> row_budgets;
    if (model.budget_driven(strategy)) {
      for (const std::string& text : options.budgets) {
        row_budgets.emplace_back(text, Budget::parse(text));
      }
    } else {
      row_budgets.emplace_back("-", Budget::none());
    }
    for (const auto& [label, budget] : row_budgets) {
      BenchRow row;
      row.strategy = strategy;
      row.budget_label = label;
      try {
        planner::SolverOptions solver;
        solver.memory_slots = options.slots;
        solver.graph_search_work = options.search_work;
        row.choice = model.choose(strategy, budget, solver);
        row.budget_bytes = row.choice->budget_bytes;
      } catch (const InfeasibleBudgetError& error) {
        row.budget_bytes = std::visit(
            [&](const auto& costs) { return budget.resolve_bytes(costs); },
            model.costs);
        row.status =
            error.min_feasible_bytes()
                ? "infeasible (minimum " +
                      planner::format_bytes(*error.min_feasible_bytes()) + ")"
                : std::string("infeasible");
      }
      rows.push_back(std::move(row));
    }
  }
  return rows;
}

// Runs every feasible row with remat::measure's Runner, "none" as the
// baseline; fills row.measured (peaks in the chain's units: input bytes
// included). Returns the warning of a machine that was not idle, if any.
std::optional<std::string> measure(
    std::vector<BenchRow>& rows,
    const BenchOptions& options,
    const BenchModel& model,
    const Batch& batch,
    int64_t input_bytes) {
  std::vector<size_t> order;  // rows in run order, the baseline first
  for (size_t index = 0; index < rows.size(); ++index) {
    if (rows[index].choice) {
      order.insert(rows[index].baseline() ? order.begin() : order.end(), index);
    }
  }
  TORCH_INTERNAL_ASSERT(!order.empty() && rows[order.front()].baseline());
  std::vector<measure::Configuration> configurations;
  for (const size_t index : order) {
    std::shared_ptr<Executor> executor = model.executor(rows[index]);
    configurations.push_back(
        {rows[index].strategy + "@" + rows[index].budget_label,
         [executor](const torch::Tensor& input) {
           return executor->forward(input);
         }});
  }
  measure::RunnerOptions runner_options;
  runner_options.warmup = static_cast<int>(options.warmup);
  runner_options.rounds = static_cast<int>(options.repeats);
  runner_options.seed = options.seed * 1000003ULL + 1;
  measure::Runner runner(
      {model.module(),
       batch.inputs,
       [](const torch::Tensor& loss) { return loss; }},  // the last stage
      runner_options);
  measure::RunResult result = runner.run(configurations);
  // The Runner's peaks are the meter's; the loss value and the gradient
  // that seeds backward are left out, as measure_step's activation peak
  // leaves them out for `remat train` (remat/measure/step.h), and the input
  // is added: the units of simulate() and of `remat train`.
  const int64_t loss_and_seed_bytes = 2 * model.loss_bytes();
  for (size_t position = 0; position < order.size(); ++position) {
    measure::Measurement measured = std::move(result.configurations[position]);
    measured.peak_bytes += input_bytes - loss_and_seed_bytes;
    rows[order[position]].measured = std::move(measured);
  }
  return measure::busy_machine_warning(result, torch::get_num_threads());
}

// The rows as one table: the CSV's columns, the JSON's keys.
report::Table rows_table(const std::vector<BenchRow>& rows) {
  const measure::Measurement* reference = nullptr;
  for (const BenchRow& row : rows) {
    if (row.baseline() && row.measured) {
      reference = &*row.measured;
    }
  }
  TORCH_INTERNAL_ASSERT(reference != nullptr);
  report::Table table;
  table.name = "bench";
  table.columns = {
      "strategy",
      "budget",
      "budget_bytes",
      "predicted_peak_bytes",
      "measured_peak_bytes",
      "memory_ratio",
      "step_ms_median",
      "step_ms_min",
      "step_ms_max",
      "forward_ms",
      "backward_ms",
      "time_ratio",
      "extra_forwards",
      "grad_max_diff",
      "status"};
  using report::Cell;
  for (const BenchRow& row : rows) {
    std::vector<Cell> cells{
        Cell::text(row.strategy),
        Cell::text(row.budget_label),
        row.budget_bytes ? Cell::bytes(*row.budget_bytes) : Cell::empty()};
    if (row.measured) {
      const measure::Measurement& measured = *row.measured;
      const measure::Summary step = measured.step();
      cells.insert(
          cells.end(),
          {Cell::bytes(row.choice->simulation.peak_bytes),
           Cell::bytes(measured.peak_bytes),
           Cell::ratio(
               static_cast<double>(measured.peak_bytes) /
               static_cast<double>(
                   std::max<int64_t>(1, reference->peak_bytes))),
           Cell::number(step.median, 2),
           Cell::number(step.min, 2),
           Cell::number(step.max, 2),
           Cell::number(measured.forward().median, 2),
           Cell::number(measured.backward().median, 2),
           Cell::ratio_interval(measured.step_ratio(*reference)),
           Cell::integer(extra_forwards(row.choice->plan)),
           Cell::number(measured.max_grad_diff, 9)});
    } else {
      cells.resize(table.columns.size() - 1);
    }
    cells.push_back(Cell::text(row.status));
    table.add_row(std::move(cells));
  }
  return table;
}

// The terminal view of the rows: the columns a reader compares, with
// headers in words, in under 100 columns; the CSV keeps every column (the
// step times in ms among them).
report::Table terminal_table(const report::Table& full) {
  const std::vector<std::pair<std::string, std::string>> shown = {
      {"strategy", "strategy"},
      {"budget", "budget"},
      {"predicted_peak_bytes", "predicted"},
      {"measured_peak_bytes", "measured"},
      {"memory_ratio", "memory"},
      {"time_ratio", "time [95% CI]"},
      {"status", "status"}};
  report::Table table;
  table.name = full.name;
  std::vector<size_t> indices;
  for (const auto& [column, header] : shown) {
    const auto found =
        std::find(full.columns.begin(), full.columns.end(), column);
    TORCH_INTERNAL_ASSERT(found != full.columns.end(), column);
    indices.push_back(static_cast<size_t>(found - full.columns.begin()));
    table.columns.push_back(header);
  }
  for (const std::vector<report::Cell>& row : full.rows) {
    std::vector<report::Cell> cells;
    for (const size_t index : indices) {
      cells.push_back(row[index]);
    }
    table.add_row(std::move(cells));
  }
  return table;
}

// plot.gp and its data files in `out`; returns run_gnuplot's error or "".
std::string write_plot(
    const std::vector<BenchRow>& rows,
    const BenchOptions& options,
    int64_t stages) {
  std::map<std::string, std::vector<const BenchRow*>> curves;
  std::vector<std::string> curve_order;
  for (const BenchRow& row : rows) {
    if (!row.measured) {
      continue;
    }
    const std::string& name = row.strategy;
    if (curves.find(name) == curves.end()) {
      curve_order.push_back(name);
    }
    curves[name].push_back(&row);
  }
  std::ostringstream script;
  script << "set terminal pngcairo size 1000,640 noenhanced font ',11'\n"
         << "set output 'plot.png'\n"
         << "set title "
         << gnuplot_quote(
                "remat bench: " + options.model.model + ", " +
                std::to_string(stages) + " stages, batch " +
                std::to_string(options.model.batch) + " (details: README.md)")
         << "\nset xlabel 'activation peak (MiB, measured)'\n"
         << "set ylabel 'step time (ms, median of the timed rounds)'\n"
         << "set key outside right top\n"
         << "set grid\n"
         << "set xrange [0:*]\n";
  std::string plot_clauses;
  for (const std::string& name : curve_order) {
    std::vector<const BenchRow*> points = curves[name];
    std::sort(
        points.begin(), points.end(), [](const auto* lhs, const auto* rhs) {
          return lhs->measured->peak_bytes < rhs->measured->peak_bytes;
        });
    std::ostringstream data;
    data << "# peak_MiB step_ms budget\n" << std::setprecision(10);
    for (const BenchRow* row : points) {
      data << static_cast<double>(row->measured->peak_bytes) / (1024.0 * 1024.0)
           << ' ' << row->measured->step().median << ' ' << row->budget_label
           << '\n';
    }
    const std::string file =
        "curve-" + file_stem(points.front()->strategy) + ".dat";
    write_text_file("--out", options.out + "/" + file, data.str());
    plot_clauses += std::string(plot_clauses.empty() ? "plot " : ", ") +
                    gnuplot_quote(file) +
                    " using 1:2 with linespoints lw 2 pt 7 ps 1.4 " + "title " +
                    gnuplot_quote(name);
    if (points.size() > 1) {
      plot_clauses += ", " + gnuplot_quote(file) +
                      " using 1:2:3 with labels offset 0,1 notitle";
    }
  }
  script << plot_clauses << '\n';
  write_text_file("--out", options.out + "/plot.gp", script.str());
  return run_gnuplot(options.out + "/plot.gp");
}

}  // namespace

CLI::App* add_bench_command(CLI::App& app, BenchOptions& options) {
  CLI::App* command = app.add_subcommand(
      "bench",
      "Sweep budgets x strategies on a built-in model: table, CSV, PNG plot "
      "of step time against activation peak, markdown summary");
  add_model_flags(*command, options.model);
  command
      ->add_option(
          "--budgets",
          options.budgets,
          "Budgets for optimal and chen (comma-separated)")
      ->delimiter(',')
      ->check(budget_validator())
      ->capture_default_str();
  command
      ->add_option(
          "--strategies",
          options.strategies,
          "Strategies (comma-separated); none is always measured. A U-Net: "
          "optimal, per-block, encoder, none (its default)")
      ->delimiter(',')
      ->check(parsing_validator(
          [](const std::string& text) {
            if (text != "per-block" && text != "encoder") {
              planner::Strategy::parse(text);
            }
          },
          "STRATEGY"))
      ->capture_default_str();
  command->add_option("--warmup", options.warmup, "Untimed rounds")
      ->check(CLI::Range(int64_t{0}, int64_t{1000}))
      ->capture_default_str();
  command
      ->add_option(
          "--repeats",
          options.repeats,
          "Timed rounds (median; 6 or more for 95 % intervals of the ratios)")
      ->check(CLI::Range(int64_t{1}, int64_t{1000}))
      ->capture_default_str();
  command
      ->add_option(
          "--out",
          options.out,
          "Report folder (bench.csv, plot.png, README.md)")
      ->capture_default_str();
  command->add_option("--mode", options.mode, "Checkpoint mode of uniform:K")
      ->check(CLI::IsMember({"reentrant", "nonreentrant"}))
      ->capture_default_str();
  command
      ->add_option(
          "--slots", options.slots, "Memory slots of the optimal solver")
      ->check(CLI::Range(int64_t{1}, int64_t{1000000}))
      ->capture_default_str();
  add_search_work_flag(*command, options.search_work);
  add_run_flags(*command, options.threads, options.seed);
  command->add_flag("--json", options.json, "Print the rows as JSON");
  return command;
}

void run_bench(const BenchOptions& options, const CommandIo& io) {
  apply_threads(options.threads);
  if (options.out.empty()) {
    throw UsageError("--out: expected a folder, got an empty value");
  }
  // Before any measurement: a folder that cannot be made would otherwise
  // fail only after the whole sweep, losing its results.
  make_folder("--out", options.out);
  Workload workload(options.model, options.seed);
  std::vector<std::string> strategies = options.strategies;
  if (workload.is_graph() && !options.strategies_given) {
    strategies = {"optimal", "per-block", "encoder", "none"};
  }
  if (std::find(strategies.begin(), strategies.end(), "none") ==
      strategies.end()) {
    strategies.push_back("none");
  }
  for (std::string& strategy : strategies) {  // as reports name them
    if (strategy != "per-block" && strategy != "encoder") {
      strategy = planner::Strategy::parse(strategy).to_string();
    }
  }
  refuse_repeats("--strategies", strategies);
  std::vector<std::string> budgets;
  for (const std::string& text : options.budgets) {
    budgets.push_back(Budget::parse(text).to_string());
  }
  refuse_repeats("--budgets", budgets);
  const Batch batch = workload.next_batch();
  const BenchModel model = bench_model(options, workload, batch, strategies);
  const int64_t store_all_peak = std::visit(
      [](const auto& costs) { return Budget::none().resolve_bytes(costs); },
      model.costs);  // predicted, input included
  const int64_t input_bytes = std::visit(
      [](const auto& costs) { return costs.input_bytes(); }, model.costs);
  if (!options.json) {
    io.out << "model     " << workload.description() << '\n'
           << "no-checkpoint activation peak "
           << planner::format_bytes(store_all_peak) << " (predicted); "
           << options.warmup << " warm-up + " << options.repeats
           << " timed rounds, interleaved\n";
  }

  // Measure, then rows, then render.
  std::vector<BenchRow> rows = plan_rows(options, model, strategies);
  const std::optional<std::string> busy =
      measure(rows, options, model, batch, input_bytes);
  if (busy) {
    io.err << "warning: " << *busy << '\n';
  }
  const report::Table table = rows_table(rows);

  make_folder("--out", options.out);
  write_text_file("--out", options.out + "/bench.csv", report::to_csv(table));
  const std::string plot_error = write_plot(rows, options, model.stages());
  const std::string text_table =
      report::to_text(terminal_table(table)) +
      "memory and time: ratios to none (activations + input; step time).\n"
      "A time interval that contains 1.00 is noise, not a difference. "
      "Every column is in bench.csv.\n";

  std::ostringstream summary;
  summary << "# remat bench report\n\n"
          << "Run " << measure::describe_machine().to_string() << ".\n\n"
          << "Command:\n\n```\n"
          << command_line(options, strategies) << "\n```\n\n"
          << "Model: " << workload.description() << ". No-checkpoint "
          << "activation peak " << planner::format_bytes(store_all_peak)
          << " (predicted). Ratios are against the no-checkpoint row of this "
          << "run (medians of the timed rounds); every row's gradients were "
          << "checked against it before timing (`grad_max_diff`).\n\n"
          << (plot_error.empty()
                  ? std::string(
                        "![step time against activation peak](plot.png)\n\n")
                  : "No plot: " + plot_error + "\n\n")
          << "Rows: [bench.csv](bench.csv).\n\n"
          << report::to_markdown(table);
  write_text_file("--out", options.out + "/README.md", summary.str());

  if (options.json) {
    nlohmann::json json_rows = nlohmann::json::array();
    for (size_t index = 0; index < rows.size(); ++index) {
      nlohmann::json json_row;
      for (size_t column = 0; column < table.columns.size(); ++column) {
        json_row[table.columns[column]] = table.rows[index][column].json();
      }
      if (rows[index].choice) {
        json_row["plan"] = rows[index].choice->plan.to_string();
      }
      json_rows.push_back(std::move(json_row));
    }
    nlohmann::json report;
    report["model"] = workload.description();
    report["no_checkpoint_peak_bytes"] = store_all_peak;
    report["rows"] = json_rows;
    report["csv"] = options.out + "/bench.csv";
    report["plot"] = plot_error.empty()
                         ? nlohmann::json(options.out + "/plot.png")
                         : nlohmann::json(nullptr);
    report["summary"] = options.out + "/README.md";
    io.out << report_text(report) << '\n';
  } else {
    io.out << text_table << "report    " << options.out
           << "/README.md, bench.csv"
           << (plot_error.empty() ? ", plot.png" : "") << '\n';
  }
  if (!plot_error.empty()) {
    io.err << "warning: no plot: " << plot_error << "; the data and script are "
           << "in " << options.out << " (curve-*.dat, plot.gp)\n";
  }
}

}  // namespace remat::cli
