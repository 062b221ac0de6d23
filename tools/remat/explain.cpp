// explain.cpp: `remat explain`: for a chain or a graph (a JSON file or a
// profiled built-in model; a U-Net is a graph) and a budget, what each stage
// keeps and the predicted memory over one training step, as a table
// (remat::explain) and a plot.
//
// The memory series is simulate()'s step-by-step report: the live bytes after
// each op and the running peak (which includes transients inside ops). It is
// written as explain.dat with a gnuplot script, and drawn to explain.png.
// 100% of a budget is the simulated store-all peak. --shard N plans one rank
// of `remat train --nproc N --shard`: the rank's slice of the batch,
// profiled unsharded, with each stage's gathered parameters and the resident
// shards counted (distributed::sharded_chain).
#include <fstream>
#include <iomanip>
#include <sstream>

#include <remat/config.h>
#if REMAT_WITH_DISTRIBUTED
#include <remat/distributed.h>
#endif
#include <remat/planned_sequential.h>
#include <remat/profile.h>
#include <nlohmann/json.hpp>

#include <remat/budget.h>
#include "cli_error.h"
#include "commands.h"
#include "gnuplot.h"
#include "runtime.h"
#include "strategy.h"

namespace remat::cli {
namespace {

struct TimelinePoint {
  std::string op;
  int64_t live_bytes = 0;     ///< live after the op
  int64_t op_peak_bytes = 0;  ///< highest live bytes inside the op
  int64_t peak_bytes = 0;     ///< running peak up to and including the op
};

/// The report's op timeline as plot points, after a "start" point.
std::vector<TimelinePoint> memory_timeline(
    const planner::ExplainReport& report) {
  std::vector<TimelinePoint> points;
  const int64_t start = report.start_bytes;
  points.push_back({"start", start, start, start});
  for (const planner::ExplainOp& row : report.ops) {
    points.push_back(
        {planner::op_kind_letter(row.op.kind) + std::to_string(row.op.stage),
         row.live_after_bytes,
         row.op_peak_bytes,
         row.running_peak_bytes});
  }
  return points;
}

double mib(int64_t bytes) {
  return static_cast<double>(bytes) / (1024.0 * 1024.0);
}

// Writes explain.dat and explain.gp into `folder` and runs gnuplot.
// Returns "" or why the PNG could not be drawn.
std::string write_plot(
    const std::string& folder,
    const std::vector<TimelinePoint>& points,
    const PlanChoice& choice,
    const std::string& strategy) {
  make_folder("--out", folder);
  std::ostringstream data;
  data << "# op_index op live_MiB peak_MiB\n" << std::setprecision(10);
  for (size_t index = 0; index < points.size(); ++index) {
    data << index << ' ' << points[index].op << ' '
         << mib(points[index].live_bytes) << ' '
         << mib(points[index].peak_bytes) << '\n';
  }
  write_text_file("--out", folder + "/explain.dat", data.str());
  std::ostringstream script;
  script << std::setprecision(10);
  script
      << "set terminal pngcairo size 1000,560 noenhanced font ',10'\n"
      << "set output 'explain.png'\n"
      << "set title "
      << gnuplot_quote(
             "Predicted memory over one step: " + strategy + " (" +
             std::to_string(points.size() - 1) + " ops)")
      << "\n"
      << "set xlabel 'operation (forwards, then backward with recomputation)'\n"
      << "set ylabel 'MiB'\n"
      << "set key top right\n"
      << "set grid\n"
      << "set yrange [0:*]\n";
  if (points.size() <= 40) {
    script << "set xtics rotate by -60 font ',8'\n";
  }
  script << "plot 'explain.dat' using 1:3"
         << (points.size() <= 40 ? ":xtic(2)" : "")
         << " with steps lw 2 title 'live after op', "
         << "'explain.dat' using 1:4 with lines dt 2 lw 2 title 'running peak'";
  script << ", " << mib(choice.store_all_peak_bytes)
         << " with lines lc 'gray' title 'store-all peak'";
  if (choice.budget_bytes) {
    script << ", " << mib(*choice.budget_bytes)
           << " with lines lc 'red' title 'budget'";
  }
  script << '\n';
  write_text_file("--out", folder + "/explain.gp", script.str());
  return run_gnuplot(folder + "/explain.gp");
}

}  // namespace

CLI::App* add_explain_command(CLI::App& app, ExplainOptions& options) {
  CLI::App* command = app.add_subcommand(
      "explain",
      "Show what each stage keeps under a budget and the predicted memory "
      "over one step (table and plot), for a chain JSON or a built-in model");
  command->add_option(
      "chain,--chain",
      options.chain_path,
      "Chain or graph JSON file; without it, the built-in model is "
      "profiled");
  add_model_flags(*command, options.model);
  add_budget_flags(*command, options.budget);
  command
      ->add_option(
          "--out",
          options.out,
          "Folder for explain.png (and its data and gnuplot script); empty: "
          "no plot")
      ->capture_default_str();
  command->add_flag("--json", options.json, "Print JSON instead of text");
  add_precision_flag(*command, options.precision);
  add_selective_flag(*command, options.selective);
  command
      ->add_option(
          "--shard",
          options.shard,
          "Plan one rank of sharded training over N ranks (remat train "
          "--nproc N --shard): --batch is the global batch; parameters "
          "gathered per stage and the resident shards count in the budget")
      ->check(CLI::Range(int64_t{1}, int64_t{1024}));
  add_run_flags(*command, options.threads, options.seed);
  return command;
}

namespace {

/// The chain explain plans: read from --chain, or the built-in model
/// profiled (one rank's share of it with --shard).
struct ExplainedModel {
  StageCosts costs;
  std::string source;  ///< what it is, for the report's first line
  /// A graph model's encoder stages (--strategy encoder); 0 otherwise.
  int64_t encoder_stages = 0;
};

// A U-Net (--model unet2d|unet3d) profiled as its graph.
ExplainedModel graph_to_explain(const ExplainOptions& options) {
  for (const auto& [flag, given] :
       {std::pair<const char*, bool>{"--shard", options.shard > 0},
        std::pair<const char*, bool>{"--selective", options.selective}}) {
    if (given) {
      throw UsageError(
          std::string(flag) + ": not supported with --model " +
          options.model.model +
          " (a U-Net is planned with --strategy optimal, none, per-block or "
          "encoder)");
    }
  }
  const Precision precision = cpu_precision(options.precision);
  Workload workload(options.model, options.seed);
  const TrainingGraph& graph = workload.training_graph();
  return {
      profile_training_graph(
          graph, workload.next_batch(), precision, ProfileOptions()),
      workload.description() + "; " + precision_name(precision),
      graph.encoder_stages};
}

ExplainedModel model_to_explain(const ExplainOptions& options) {
#if !REMAT_WITH_DISTRIBUTED
  if (options.shard > 0) {
    throw_without_distributed("--shard");
  }
#endif
  if (!options.chain_path.empty()) {  // no model flags (run_cli refuses them)
    return {read_costs_file("--chain", options.chain_path), options.chain_path};
  }
  if (is_graph_model(options.model.model)) {
    return graph_to_explain(options);
  }
  const Precision precision = cpu_precision(options.precision);
  if (options.shard > 0 && options.model.batch % options.shard != 0) {
    throw UsageError(
        "--batch: the global batch must divide by --shard " +
        std::to_string(options.shard) + ", got " +
        std::to_string(options.model.batch));
  }
  Workload workload(options.model, options.seed);
  Batch batch = workload.next_batch();
  if (options.shard > 0) {
    const int64_t local = options.model.batch / options.shard;
    batch.inputs = batch.inputs.narrow(0, 0, local);
    batch.targets = batch.targets.narrow(0, 0, local);
  }
  const torch::nn::Sequential model = workload.training_model();  // + loss
  set_targets(model, batch);
  AutocastGuard autocast(c10::kCPU, precision);
  planner::Chain chain = profile_chain(
      model,
      batch.inputs,
      ProfileOptions().selective_policy(selective_policy(options.selective)));
  std::string source =
      workload.description() + "; " + precision_name(precision);
#if REMAT_WITH_DISTRIBUTED
  if (options.shard > 0) {
    chain = distributed::sharded_chain(chain, stages_of(model), options.shard);
    source += "; one rank of " + std::to_string(options.shard) +
              ", sharded (local batch " +
              std::to_string(options.model.batch / options.shard) + ")";
  }
#endif
  return {std::move(chain), std::move(source)};
}

/// The report as JSON: the choice, the stage rows and the op timeline.
nlohmann::json explain_json(
    const ExplainedModel& explained,
    const std::string& strategy,
    const PlanChoice& choice,
    const planner::ExplainReport& report,
    const std::vector<TimelinePoint>& points,
    const std::string& plot_path,
    const std::string& table) {
  nlohmann::json json;
  json["source"] = explained.source;
  json["kind"] = kind_of(explained.costs);
  json["strategy"] = strategy;
  json["budget"] = choice.budget_text;
  json["budget_bytes"] = choice.budget_bytes
                             ? nlohmann::json(*choice.budget_bytes)
                             : nlohmann::json(nullptr);
  json["min_feasible_bytes"] = choice.min_feasible_bytes
                                   ? nlohmann::json(*choice.min_feasible_bytes)
                                   : nlohmann::json(nullptr);
  json["resident_bytes"] = report.resident_bytes;
  json["plan"] = choice.plan.to_string();
  json["predicted"] = {
      {"peak_bytes", report.peak_bytes}, {"time_ms", report.step_ms}};
  json["store_all"] = {
      {"peak_bytes", report.store_all_peak_bytes},
      {"time_ms", report.store_all_step_ms}};
  nlohmann::json stages = nlohmann::json::array();
  for (const planner::ExplainStage& row : report.stages) {
    stages.push_back(
        {{"stage", row.stage},
         {"first_forward",
          row.first_forward ? planner::op_kind_name(*row.first_forward)
                            : std::string()},
         {"forwards", row.forwards},
         {"keeps", row.keeps},
         {"reads", row.reads},
         {"output_bytes", row.cost.output_bytes},
         {"saved_bytes", row.cost.saved_bytes},
         {"gathered_bytes", row.cost.gathered_bytes}});
  }
  json["stages"] = stages;
  nlohmann::json timeline = nlohmann::json::array();
  for (const TimelinePoint& point : points) {
    timeline.push_back(
        {{"op", point.op},
         {"live_bytes", point.live_bytes},
         {"op_peak_bytes", point.op_peak_bytes},
         {"peak_bytes", point.peak_bytes}});
  }
  json["timeline"] = timeline;
  json["plot"] =
      plot_path.empty() ? nlohmann::json(nullptr) : nlohmann::json(plot_path);
  json["table"] = table;
  return json;
}

}  // namespace

void run_explain(const ExplainOptions& options, const CommandIo& io) {
  apply_threads(options.threads);
  if (!options.out.empty()) {
    make_folder("--out", options.out);  // before profiling a built-in model
  }
  const ExplainedModel explained = model_to_explain(options);
  const std::string strategy = strategy_name(explained.costs, options.budget);
  const PlanChoice choice = choose_plan_for(
      explained.costs, options.budget, explained.encoder_stages);
  const planner::ExplainReport report = std::visit(
      [&](const auto& model) {
        return planner::explain_report(model, choice.plan);
      },
      explained.costs);
  const std::vector<TimelinePoint> points = memory_timeline(report);
  std::string plot_error;
  std::string plot_path;
  if (!options.out.empty()) {
    plot_error = write_plot(options.out, points, choice, strategy);
    if (plot_error.empty()) {
      plot_path = options.out + "/explain.png";
    }
  }
  const std::string table = planner::to_text(report);
  if (options.json) {
    io.out
        << report_text(explain_json(
               explained, strategy, choice, report, points, plot_path, table))
        << '\n';
  } else {
    io.out << kind_of(explained.costs) << "     " << explained.source << '\n';
    io.out << "strategy  " << strategy << ", budget " << choice.budget_text;
    if (choice.budget_bytes) {
      io.out << " = " << planner::format_bytes(*choice.budget_bytes);
    }
    io.out << '\n' << table;
    if (!table.empty() && table.back() != '\n') {
      io.out << '\n';
    }
    if (!plot_path.empty()) {
      io.out << "plot      " << plot_path << '\n';
    }
  }
  if (!plot_error.empty()) {
    io.err << "warning: no plot: " << plot_error << "; the data and script are "
           << "in " << options.out << " (explain.dat, explain.gp)\n";
  }
}

}  // namespace remat::cli
