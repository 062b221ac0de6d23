// bench.cpp: `remat bench`: sweep budgets x strategies on a built-in model,
// print a table, and write a report folder: bench.csv (the same rows),
// plot.png (step time against measured activation peak, one curve per
// strategy, drawn by gnuplot) and README.md (summary linking both).
//
// Protocol (bench-protocol.md): one model, one fixed batch and one seed for
// every configuration, so that every step computes the same thing; rounds of
// warm-up and timed steps interleave the configurations (A B C A B C ...);
// the no-checkpoint configuration ("none") is always measured, it is the
// reference of every ratio and of the correctness gate: the gradients of each
// configuration must equal its gradients (the maximum difference is
// reported; bitwise for deterministic CPU ops). No optimizer step is taken.
// Budget-driven strategies (optimal, chen) get one row per budget; fixed ones
// (sqrt, uniform:K, none) one row. 100% of a budget is the simulated
// store-all peak; measured peaks are reported in the same units (activation
// peak plus the input's bytes).
#include <algorithm>
#include <chrono>
#include <ctime>
#include <fstream>
#include <iomanip>
#include <map>
#include <sstream>
#include <thread>

#include <remat/profile.h>
#include <torch/version.h>
#include <nlohmann/json.hpp>

#include <remat/budget.h>
#include "cli_error.h"
#include "commands.h"
#include "gnuplot.h"
#include "runtime.h"
#include "strategy.h"

namespace remat::cli {
namespace {

// One configuration of the sweep and what was measured.
struct BenchRow {
  planner::Strategy strategy;
  std::string budget_label;  // "50%", "512 MiB", or "-" for fixed strategies
  std::optional<int64_t> budget_bytes;
  std::optional<PlanChoice> choice;  // nullopt: infeasible
  std::string status = "ok";
  std::unique_ptr<Trainer> trainer;
  std::vector<double> step_ms, forward_ms, backward_ms;
  int64_t peak_bytes = 0;
  double grad_max_difference = 0;
  double loss = 0;

  int64_t predicted_peak_bytes() const {
    return choice->simulation.peak_bytes;
  }
};

std::string fixed(double value, int digits) {
  std::ostringstream text;
  text << std::fixed << std::setprecision(digits) << value;
  return text.str();
}

std::vector<torch::Tensor> gradients(const torch::nn::Sequential& model) {
  std::vector<torch::Tensor> grads;
  for (const auto& parameter : model->parameters()) {
    grads.push_back(
        parameter.grad().defined() ? parameter.grad().clone()
                                   : torch::Tensor());
  }
  return grads;
}

double max_difference(
    const std::vector<torch::Tensor>& lhs,
    const std::vector<torch::Tensor>& rhs) {
  double difference = 0;
  for (size_t index = 0; index < lhs.size() && index < rhs.size(); ++index) {
    if (lhs[index].defined() && rhs[index].defined()) {
      difference = std::max(
          difference, (lhs[index] - rhs[index]).abs().max().item<double>());
    }
  }
  return difference;
}

std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        return line.substr(colon + 2);
      }
    }
  }
  return "unknown CPU";
}

std::string today() {
  const std::time_t now = std::time(nullptr);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%d", std::localtime(&now));
  return text;
}

std::string file_stem(const planner::Strategy& strategy) {
  std::string stem = strategy.to_string();
  std::replace(stem.begin(), stem.end(), ':', '_');
  return stem;
}

std::string join(const std::vector<std::string>& values) {
  std::string text;
  for (const std::string& value : values) {
    text += (text.empty() ? "" : ",") + value;
  }
  return text;
}

std::string command_line(const BenchOptions& options) {
  std::ostringstream text;
  const ModelFlags& model = options.model;
  text << "remat bench --model " << model.model << " --layers " << model.layers
       << " --hidden " << model.hidden;
  if (model.model == "gpt") {
    text << " --heads " << model.heads << " --seq " << model.seq;
  }
  if (model.model == "resnet") {
    text << " --image " << model.image;
  }
  text << " --batch " << model.batch << " --dropout " << model.dropout
       << " --budgets " << join(options.budgets) << " --strategies "
       << join(options.strategies) << " --warmup " << options.warmup
       << " --repeats " << options.repeats << " --threads " << options.threads
       << " --seed " << options.seed << " --out " << options.out;
  return text.str();
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
      ->check(parsing_validator(
          [](const std::string& text) { Budget::parse(text); }, "BUDGET"))
      ->capture_default_str();
  command
      ->add_option(
          "--strategies",
          options.strategies,
          "Strategies (comma-separated); none is always measured")
      ->delimiter(',')
      ->check(parsing_validator(
          [](const std::string& text) { planner::Strategy::parse(text); },
          "STRATEGY"))
      ->capture_default_str();
  command->add_option("--warmup", options.warmup, "Untimed rounds")
      ->check(CLI::Range(int64_t{0}, int64_t{1000}))
      ->capture_default_str();
  command->add_option("--repeats", options.repeats, "Timed rounds (median)")
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
  add_run_flags(*command, options.threads, options.seed);
  command->add_flag("--json", options.json, "Print the rows as JSON");
  return command;
}

void run_bench(const BenchOptions& options, const CommandIo& io) {
  apply_threads(options.threads);
  const Mode mode = parse_mode(options.mode);
  if (options.out.empty()) {
    throw UsageError("--out: expected a folder, got an empty value");
  }
  std::vector<planner::Strategy> strategies;
  bool has_none = false;
  for (const std::string& text : options.strategies) {
    strategies.push_back(planner::Strategy::parse(text));
    has_none =
        has_none || strategies.back().kind == planner::Strategy::Kind::kNone;
  }
  if (!has_none) {
    strategies.push_back(planner::Strategy::parse("none"));
  }
  std::vector<Budget> budgets;
  for (const std::string& text : options.budgets) {
    budgets.push_back(Budget::parse(text));
  }

  Workload workload(options.model, options.seed);
  torch::nn::Sequential model = workload.model();
  const Batch batch = workload.next_batch();
  for (const planner::Strategy& strategy : strategies) {
    check_trainable(
        strategy, mode, static_cast<int64_t>(model->size()), batch.inputs);
  }
  const uint64_t seed = options.seed * 1000003ULL + 1;
  const planner::Chain chain = profile_chain(model, batch.inputs);
  const int64_t store_all_peak =
      Budget::none().resolve_bytes(chain);  // predicted, input included
  if (!options.json) {
    io.out << "model     " << workload.description() << '\n'
           << "no-checkpoint activation peak "
           << planner::format_bytes(store_all_peak) << " (predicted); "
           << options.warmup << " warm-up + " << options.repeats
           << " timed rounds, interleaved\n";
  }

  std::vector<BenchRow> rows;
  for (const planner::Strategy& strategy : strategies) {
    std::vector<std::pair<std::string, Budget>> row_budgets;
    if (strategy.uses_budget()) {
      for (size_t index = 0; index < budgets.size(); ++index) {
        row_budgets.emplace_back(options.budgets[index], budgets[index]);
      }
    } else {
      row_budgets.emplace_back("-", Budget::none());
    }
    for (const auto& [label, budget] : row_budgets) {
      BenchRow row;
      row.strategy = strategy;
      row.budget_label = label;
      try {
        row.choice = choose_plan(chain, strategy, budget, false, options.slots);
        row.budget_bytes = row.choice->budget_bytes;
        row.trainer = std::make_unique<Trainer>(model, *row.choice, mode, 1e-3);
      } catch (const InfeasibleBudgetError& error) {
        row.budget_bytes = budget.resolve_bytes(chain);
        row.status = "infeasible (minimum " +
                     planner::format_bytes(error.min_feasible_bytes()) + ")";
      }
      rows.push_back(std::move(row));
    }
  }

  // Reference gradients: the no-checkpoint configuration.
  BenchRow* reference = nullptr;
  for (BenchRow& row : rows) {
    if (row.strategy.kind == planner::Strategy::Kind::kNone) {
      reference = &row;
    }
  }
  TORCH_INTERNAL_ASSERT(reference != nullptr);
  reference->trainer->step(workload, batch, seed, /*update=*/false);
  const std::vector<torch::Tensor> reference_grads = gradients(model);

  for (int64_t round = 0; round < options.warmup + options.repeats; ++round) {
    for (BenchRow& row : rows) {
      if (!row.trainer) {
        continue;
      }
      const StepResult result =
          row.trainer->step(workload, batch, seed, /*update=*/false);
      if (round == 0) {
        row.grad_max_difference =
            max_difference(gradients(model), reference_grads);
        row.loss = result.loss;
      }
      if (round >= options.warmup) {
        row.step_ms.push_back(result.step_ms());
        row.forward_ms.push_back(result.forward_ms);
        row.backward_ms.push_back(result.backward_ms);
        row.peak_bytes = std::max(
            row.peak_bytes, result.activation_peak_bytes + chain.input_bytes());
      }
    }
  }
  const double reference_ms = planner::median(reference->step_ms);
  const auto reference_peak = static_cast<double>(reference->peak_bytes);

  // Table and CSV share the columns.
  const std::vector<std::string> header = {
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
  std::vector<std::vector<std::string>> cells;
  nlohmann::json json_rows = nlohmann::json::array();
  for (const BenchRow& row : rows) {
    std::vector<std::string> line = {
        row.strategy.to_string(),
        row.budget_label,
        row.budget_bytes ? std::to_string(*row.budget_bytes) : "",
    };
    nlohmann::json json_row = {
        {"strategy", row.strategy.to_string()},
        {"budget", row.budget_label},
        {"budget_bytes",
         row.budget_bytes ? nlohmann::json(*row.budget_bytes)
                          : nlohmann::json(nullptr)},
        {"status", row.status}};
    if (row.trainer) {
      const double step = planner::median(row.step_ms);
      const double memory_ratio =
          static_cast<double>(row.peak_bytes) / std::max(1.0, reference_peak);
      const double time_ratio = step / std::max(1e-9, reference_ms);
      const auto [min_ms, max_ms] =
          std::minmax_element(row.step_ms.begin(), row.step_ms.end());
      line.insert(
          line.end(),
          {std::to_string(row.predicted_peak_bytes()),
           std::to_string(row.peak_bytes),
           fixed(memory_ratio, 3),
           fixed(step, 2),
           fixed(*min_ms, 2),
           fixed(*max_ms, 2),
           fixed(planner::median(row.forward_ms), 2),
           fixed(planner::median(row.backward_ms), 2),
           fixed(time_ratio, 3),
           std::to_string(extra_forwards(row.choice->plan)),
           fixed(row.grad_max_difference, 9),
           row.status});
      json_row["predicted_peak_bytes"] = row.predicted_peak_bytes();
      json_row["measured_peak_bytes"] = row.peak_bytes;
      json_row["memory_ratio"] = memory_ratio;
      json_row["step_ms_median"] = step;
      json_row["step_ms_min"] = *min_ms;
      json_row["step_ms_max"] = *max_ms;
      json_row["forward_ms"] = planner::median(row.forward_ms);
      json_row["backward_ms"] = planner::median(row.backward_ms);
      json_row["time_ratio"] = time_ratio;
      json_row["extra_forwards"] = extra_forwards(row.choice->plan);
      json_row["grad_max_diff"] = row.grad_max_difference;
      json_row["plan"] = row.choice->plan.to_string();
    } else {
      line.resize(header.size() - 1);
      line.push_back(row.status);
    }
    cells.push_back(line);
    json_rows.push_back(json_row);
  }

  make_folder("--out", options.out);
  std::ostringstream csv;
  for (size_t column = 0; column < header.size(); ++column) {
    csv << (column ? "," : "") << header[column];
  }
  csv << '\n';
  for (const auto& line : cells) {
    for (size_t column = 0; column < line.size(); ++column) {
      csv << (column ? "," : "") << line[column];
    }
    csv << '\n';
  }
  write_text_file("--out", options.out + "/bench.csv", csv.str());

  // Plot data: one file per strategy, points sorted by measured peak.
  std::map<std::string, std::vector<const BenchRow*>> curves;
  std::vector<std::string> curve_order;
  for (const BenchRow& row : rows) {
    if (!row.trainer) {
      continue;
    }
    const std::string name = row.strategy.to_string();
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
                std::to_string(model->size()) + " stages, batch " +
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
          return lhs->peak_bytes < rhs->peak_bytes;
        });
    std::ostringstream data;
    data << "# peak_MiB step_ms budget\n" << std::setprecision(10);
    for (const BenchRow* row : points) {
      data << static_cast<double>(row->peak_bytes) / (1024.0 * 1024.0) << ' '
           << planner::median(row->step_ms) << ' ' << row->budget_label << '\n';
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
  const std::string plot_error = run_gnuplot(options.out + "/plot.gp");

  // Human table (the CSV's rows, readable units).
  std::ostringstream table;
  table << std::left << std::setw(11) << "strategy" << std::setw(8) << "budget"
        << std::right << std::setw(11) << "budget" << std::setw(11)
        << "predicted" << std::setw(11) << "measured" << std::setw(7) << "mem"
        << std::setw(10) << "step ms" << std::setw(7) << "time" << std::setw(7)
        << "extra" << std::setw(11) << "grad diff"
        << "  status\n";
  for (const BenchRow& row : rows) {
    table << std::left << std::setw(11) << row.strategy.to_string()
          << std::setw(8) << row.budget_label << std::right << std::setw(11)
          << (row.budget_bytes ? planner::format_bytes(*row.budget_bytes)
                               : "-");
    if (row.trainer) {
      table << std::setw(11)
            << planner::format_bytes(row.predicted_peak_bytes())
            << std::setw(11) << planner::format_bytes(row.peak_bytes)
            << std::setw(7)
            << fixed(
                   static_cast<double>(row.peak_bytes) /
                       std::max(1.0, reference_peak),
                   2)
            << std::setw(10) << fixed(planner::median(row.step_ms), 1)
            << std::setw(7)
            << fixed(
                   planner::median(row.step_ms) / std::max(1e-9, reference_ms),
                   2)
            << std::setw(7) << extra_forwards(row.choice->plan) << std::setw(11)
            << std::setprecision(2) << std::scientific
            << row.grad_max_difference << std::defaultfloat;
    } else {
      table << std::setw(11 + 11 + 7 + 10 + 7 + 7 + 11) << "";
    }
    table << "  " << row.status << '\n';
  }

  std::ostringstream summary;
  summary << "# remat bench report\n\n"
          << "Date " << today() << "; " << std::thread::hardware_concurrency()
          << " CPU cores (" << cpu_model() << "), LibTorch " << TORCH_VERSION
          << ", " << options.threads << " threads.\n\n"
          << "Command:\n\n```\n"
          << command_line(options) << "\n```\n\n"
          << "Model: " << workload.description() << ". No-checkpoint "
          << "activation peak " << planner::format_bytes(store_all_peak)
          << " (measured). Ratios are against the no-checkpoint row of this "
          << "run; `grad diff` is the largest gradient difference to it.\n\n"
          << (plot_error.empty()
                  ? std::string(
                        "![step time against activation peak](plot.png)\n\n")
                  : "No plot: " + plot_error + "\n\n")
          << "Rows: [bench.csv](bench.csv).\n\n```\n"
          << table.str() << "```\n";
  write_text_file("--out", options.out + "/README.md", summary.str());

  if (options.json) {
    nlohmann::json report;
    report["model"] = workload.description();
    report["no_checkpoint_peak_bytes"] = store_all_peak;
    report["rows"] = json_rows;
    report["csv"] = options.out + "/bench.csv";
    report["plot"] = plot_error.empty()
                         ? nlohmann::json(options.out + "/plot.png")
                         : nlohmann::json(nullptr);
    report["summary"] = options.out + "/README.md";
    io.out << report.dump(2) << '\n';
  } else {
    io.out << table.str() << "report    " << options.out
           << "/README.md, bench.csv"
           << (plot_error.empty() ? ", plot.png" : "") << '\n';
  }
  if (!plot_error.empty()) {
    io.err << "warning: no plot: " << plot_error << "; the data and script are "
           << "in " << options.out << " (curve-*.dat, plot.gp)\n";
  }
}

}  // namespace remat::cli
