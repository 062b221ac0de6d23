// profile.cpp: `remat profile`: profile a built-in model; print the memory
// of its training step by kind (parameters, gradients, optimizer state,
// activations) and its stages' costs, or (--json, --out) its chain JSON (a
// graph JSON for a U-Net), the input of `remat plan` and `remat explain
// --chain`.
//
// The sample is the workload's first batch, so the chain describes exactly
// the batch shape `remat train` with the same flags would run.
#include <iomanip>
#include <sstream>
#include <variant>
#include <vector>

#include <remat/profile.h>

#include <remat/planner/units.h>
#include "cli_error.h"
#include "commands.h"
#include "runtime.h"

namespace remat::cli {

CLI::App* add_profile_command(CLI::App& app, ProfileCommandOptions& options) {
  CLI::App* command = app.add_subcommand(
      "profile",
      "Profile a built-in model: the memory of its training step by kind "
      "(parameters, gradients, optimizer state, activations) and whether "
      "checkpointing can help; per stage: times, output, saved and transient "
      "bytes. --json or --out: its chain JSON (a U-Net: its graph JSON)");
  add_model_flags(*command, options.model);
  command
      ->add_option(
          "-o,--out",
          options.out,
          "Also write the chain JSON (the input of plan and explain) to this "
          "file")
      ->capture_default_str();
  command->add_flag(
      "--json",
      options.json,
      "Print the chain JSON instead of the readable report");
  command
      ->add_option(
          "--optimizer",
          options.optimizer,
          "The optimizer whose state the step's memory counts (adamw: 2x the "
          "trainable parameters, sgd: none)")
      ->check(CLI::IsMember({"adamw", "sgd"}))
      ->capture_default_str();
  command
      ->add_option("--warmup", options.warmup, "Untimed runs per measurement")
      ->check(CLI::Range(int64_t{0}, int64_t{1000}))
      ->capture_default_str();
  command
      ->add_option(
          "--repeats", options.repeats, "Timed runs per measurement (median)")
      ->check(CLI::Range(int64_t{1}, int64_t{1000}))
      ->capture_default_str();
  add_precision_flag(*command, options.precision);
  add_selective_flag(*command, options.selective);
  add_run_flags(*command, options.threads, options.seed);
  return command;
}

void run_profile(const ProfileCommandOptions& options, const CommandIo& io) {
  apply_threads(options.threads);
  const Precision precision = cpu_precision(options.precision);
  if (!options.out.empty()) {
    check_output_file("--out", options.out);  // before profiling
  }
  Workload workload(options.model, options.seed);
  const Batch sample = workload.next_batch();
  ProfileOptions profile_options =
      ProfileOptions()
          .warmup(options.warmup)
          .repeats(options.repeats)
          .optimizer_state_ratio(
              OptimizerChoice{options.optimizer, 1e-3}.state_ratio());
  const StageCosts costs = [&]() -> StageCosts {
    if (workload.is_graph()) {
      if (options.selective) {
        throw UsageError(
            "--selective: not supported with --model " + options.model.model +
            " (a U-Net's stages are profiled whole)");
      }
      return profile_training_graph(
          workload.training_graph(), sample, precision, profile_options);
    }
    const torch::nn::Sequential model = workload.training_model();  // + loss
    set_targets(model, sample);
    AutocastGuard autocast(c10::kCPU, precision);
    return profile_chain(
        model,
        sample.inputs,
        profile_options.selective_policy(selective_policy(options.selective)));
  }();
  const auto* graph = std::get_if<planner::Graph>(&costs);
  const std::vector<planner::StageCost>& stages = std::visit(
      [](const auto& model) -> const std::vector<planner::StageCost>& {
        return model.stages();
      },
      costs);
  const std::string json = std::visit(
      [](const auto& model) { return planner::to_json(model); }, costs);
  if (!options.out.empty()) {
    write_text_file("--out", options.out, json + "\n");
  }
  if (options.json) {
    io.out << json << '\n';
    return;
  }
  std::ostringstream text;
  text << "model  " << workload.description() << "; "
       << precision_name(precision) << '\n';
  if (!options.out.empty()) {
    text << "wrote  " << options.out << ": " << kind_of(costs) << " of "
         << stages.size() << " stages, input "
         << planner::format_bytes(std::visit(
                [](const auto& model) { return model.input_bytes(); }, costs))
         << '\n';
  }
  text << "\nmemory of one training step (predicted):\n"
       << planner::to_text(
              std::visit(
                  [](const auto& model) { return planner::step_memory(model); },
                  costs),
              options.optimizer)
       << "\nstages (times in ms, median of " << options.repeats << "):\n";
  text << std::left << std::setw(7) << "stage" << std::right << std::setw(12)
       << "forward ms" << std::setw(13) << "backward ms" << std::setw(12)
       << "output" << std::setw(12) << "saved" << std::setw(13) << "no-grad tmp"
       << std::setw(13) << "record tmp" << std::setw(12) << "bwd tmp";
  if (options.selective) {
    text << std::setw(12) << "sel saved" << std::setw(13) << "sel bwd tmp"
         << std::setw(14) << "recompute ms";
  }
  if (graph != nullptr) {
    text << "  reads";
  }
  text << '\n';
  text << std::fixed << std::setprecision(3);
  for (size_t index = 0; index < stages.size(); ++index) {
    const planner::StageCost& stage = stages[index];
    text << std::left << std::setw(7) << index << std::right << std::setw(12)
         << stage.forward_ms << std::setw(13) << stage.backward_ms
         << std::setw(12) << planner::format_bytes(stage.output_bytes)
         << std::setw(12) << planner::format_bytes(stage.saved_bytes)
         << std::setw(13) << planner::format_bytes(stage.forward_tmp_bytes)
         << std::setw(13) << planner::format_bytes(stage.record_transient())
         << std::setw(12) << planner::format_bytes(stage.backward_tmp_bytes);
    if (stage.selective) {
      text << std::setw(12)
           << planner::format_bytes(stage.selective->saved_bytes)
           << std::setw(13)
           << planner::format_bytes(stage.selective->backward_tmp_bytes)
           << std::setw(14) << stage.selective->recompute_ms;
    }
    if (graph != nullptr) {
      text << "  ";
      const char* separator = "";
      for (int64_t read : graph->inputs(static_cast<int64_t>(index))) {
        text << separator
             << (read == planner::kGraphInput ? std::string("in")
                                              : std::to_string(read));
        separator = ",";
      }
    }
    text << '\n';
  }
  io.out << text.str();
}

}  // namespace remat::cli
