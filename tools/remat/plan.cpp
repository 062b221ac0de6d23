// plan.cpp: `remat plan`: read a chain or graph JSON, solve for a budget,
// print the plan with its predicted peak and time (text or --json).
//
// Torch-free in substance: only the planner and remat::Budget are used (100%
// of a budget is the simulated store-all peak).
#include <iomanip>
#include <sstream>

#include <nlohmann/json.hpp>

#include <remat/budget.h>
#include "cli_error.h"
#include "commands.h"
#include "strategy.h"

namespace remat::cli {
namespace {

double ratio(double value, double reference) {
  return reference > 0 ? value / reference : 0;
}

}  // namespace

CLI::App* add_plan_command(CLI::App& app, PlanOptions& options) {
  CLI::App* command = app.add_subcommand(
      "plan",
      "Solve a chain or graph JSON (from `remat profile`) for a budget; print "
      "the plan with its predicted peak and time");
  // The file is positional or --chain (one option, as explain's). Not
  // marked required, so that the help does not list it as required twice;
  // run_plan says what is missing.
  command->add_option(
      "chain,--chain",
      options.chain_path,
      "Chain or graph JSON file (from remat profile --out), positional or "
      "--chain");
  add_budget_flags(*command, options.budget);
  command->add_flag("--json", options.json, "Print JSON instead of text");
  command->add_option(
      "--plan-out",
      options.plan_out,
      "Also write the plan alone as planner JSON to this file");
  return command;
}

void run_plan(const PlanOptions& options, const CommandIo& io) {
  if (options.chain_path.empty()) {
    throw UsageError(
        "expected a chain or graph JSON file: remat plan CHAIN.json (or "
        "--chain CHAIN.json); `remat profile --out CHAIN.json` writes one");
  }
  const StageCosts costs = read_costs_file("--chain", options.chain_path);
  const std::string strategy = strategy_name(costs, options.budget);
  const PlanChoice choice =
      choose_plan_for(costs, options.budget, /*encoder_stages=*/0);
  const int64_t stages =
      std::visit([](const auto& model) { return model.size(); }, costs);
  const int64_t input_bytes =
      std::visit([](const auto& model) { return model.input_bytes(); }, costs);
  if (!options.plan_out.empty()) {
    write_text_file(
        "--plan-out", options.plan_out, planner::to_json(choice.plan));
  }
  const double memory_ratio = ratio(
      static_cast<double>(choice.simulation.peak_bytes),
      static_cast<double>(choice.store_all_peak_bytes));
  const double time_ratio =
      ratio(choice.simulation.step_ms, choice.store_all_step_ms);

  if (options.json) {
    nlohmann::json report;
    report[kind_of(costs)] = {
        {"path", options.chain_path},
        {"stages", stages},
        {"input_bytes", input_bytes}};
    report["strategy"] = strategy;
    report["budget"] = choice.budget_text;
    report["budget_bytes"] = choice.budget_bytes
                                 ? nlohmann::json(*choice.budget_bytes)
                                 : nlohmann::json(nullptr);
    report["min_feasible_bytes"] =
        choice.min_feasible_bytes ? nlohmann::json(*choice.min_feasible_bytes)
                                  : nlohmann::json(nullptr);
    report["store_all"] = {
        {"peak_bytes", choice.store_all_peak_bytes},
        {"time_ms", choice.store_all_step_ms}};
    report["predicted"] = {
        {"peak_bytes", choice.simulation.peak_bytes},
        {"time_ms", choice.simulation.step_ms},
        {"memory_ratio", memory_ratio},
        {"time_ratio", time_ratio}};
    report["extra_forwards"] = extra_forwards(choice.plan);
    report["plan"] = choice.plan.to_string();
    report["ops"] = nlohmann::json::parse(planner::to_json(choice.plan))["ops"];
    io.out << report_text(report) << '\n';
    return;
  }
  std::ostringstream text;
  text << std::fixed << std::setprecision(2);
  text << kind_of(costs) << "     " << options.chain_path << ": " << stages
       << " stages, input " << planner::format_bytes(input_bytes) << '\n';
  text << "store-all peak "
       << planner::format_bytes(choice.store_all_peak_bytes) << ", time "
       << choice.store_all_step_ms << " ms; minimum feasible "
       << (choice.min_feasible_bytes
               ? planner::format_bytes(*choice.min_feasible_bytes)
               : "not computed (more than " +
                     std::to_string(planner::kMaxExactStages) + " stages)")
       << '\n';
  text << "strategy  " << strategy << ", budget " << choice.budget_text;
  if (choice.budget_bytes) {
    text << " = " << planner::format_bytes(*choice.budget_bytes) << " ("
         << *choice.budget_bytes << " bytes)";
  }
  text << '\n';
  text << "plan      " << choice.plan.to_string() << '\n';
  text << "predicted peak "
       << planner::format_bytes(choice.simulation.peak_bytes) << " ("
       << choice.simulation.peak_bytes << " bytes, " << memory_ratio
       << "x store-all), time " << choice.simulation.step_ms << " ms ("
       << time_ratio << "x), " << extra_forwards(choice.plan)
       << " stage forwards recomputed\n";
  io.out << text.str();
}

}  // namespace remat::cli
