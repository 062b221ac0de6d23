// fit.cpp: `remat fit`: the largest batch of a built-in model that trains
// under a memory cap, with no checkpointing, the best checkpoint_sequential
// and the optimal plan (remat::fit_batch), each confirmed by a measured step.
//
// The chain is the workload's model; inputs of batch b come from a workload
// made with the same flags and seed but --batch b (the same kind of data).
#include <iomanip>
#include <sstream>

#include <remat/fit.h>
#include <remat/planner/units.h>

#include "cli_error.h"
#include "commands.h"

namespace remat::cli {

CLI::App* add_fit_command(CLI::App& app, FitCommandOptions& options) {
  CLI::App* command = app.add_subcommand(
      "fit",
      "Find the largest batch of a built-in model that trains under a memory "
      "cap (activations plus input), with no checkpointing, the best "
      "checkpoint_sequential and the optimal plan; each answer is confirmed "
      "by a measured step");
  add_model_flags(*command, options.model);
  command->add_option("--cap", options.cap, "Memory cap in bytes (e.g. 64MiB)")
      ->required();
  command
      ->add_option(
          "--probe-batch",
          options.probe_batch,
          "The smaller of the two profiled batches (the other is twice it)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  command
      ->add_option("--max-batch", options.max_batch, "Largest batch considered")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24))
      ->capture_default_str();
  command
      ->add_option(
          "--max-time-ratio",
          options.max_time_ratio,
          "Checkpointing may cost at most this multiple of no checkpointing's "
          "predicted time per sample (0: no limit)")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  add_run_flags(*command, options.threads, options.seed);
  return command;
}

void run_fit(const FitCommandOptions& options, const CommandIo& io) {
  apply_threads(options.threads);
  const Budget cap = Budget::parse(options.cap);
  if (cap.kind() != Budget::Kind::kBytes) {
    throw UsageError(
        "--cap: expected a number of bytes (e.g. 64MiB), got '" + options.cap +
        "'");
  }
  if (options.max_batch < options.probe_batch) {
    throw UsageError(
        "--max-batch: expected at least --probe-batch (" +
        std::to_string(options.probe_batch) + "), got " +
        std::to_string(options.max_batch));
  }
  Workload workload(options.model, options.seed);
  auto make_input = [&](int64_t batch) {
    ModelFlags flags = options.model;
    flags.batch = batch;
    return Workload(flags, options.seed).next_batch().inputs;
  };
  const auto answers = fit_batch(
      make_input,
      stages_of(workload.model()),
      cap.budget_bytes(),
      FitOptions()
          .probe_batch(options.probe_batch)
          .max_batch(options.max_batch)
          .max_time_ratio(options.max_time_ratio));
  const FitAnswer& none = answers.front();
  std::ostringstream text;
  text << "model  " << workload.description() << '\n'
       << "cap    " << planner::format_bytes(cap.budget_bytes())
       << " (activations plus the input, measured)\n\n";
  text << std::left << std::setw(24) << "strategy" << std::right << std::setw(8)
       << "batch" << std::setw(10) << "vs none" << std::setw(14) << "measured"
       << std::setw(14) << "predicted" << std::setw(14) << "ms/sample"
       << std::setw(10) << "vs none" << '\n';
  text << std::fixed;
  for (const FitAnswer& answer : answers) {
    std::string name = answer.strategy;
    if (answer.segments > 0) {
      name += "(" + std::to_string(answer.segments) + ")";
    }
    text << std::left << std::setw(24) << name << std::right << std::setw(8)
         << answer.batch;
    if (answer.batch == 0) {
      text << "  (not even --probe-batch fits)\n";
      continue;
    }
    const bool relative = none.batch > 0;
    text << std::setw(10) << std::setprecision(2)
         << (relative ? static_cast<double>(answer.batch) / none.batch : 0)
         << std::setw(14) << planner::format_bytes(answer.measured_peak_bytes)
         << std::setw(14) << planner::format_bytes(answer.predicted_peak_bytes)
         << std::setw(14) << std::setprecision(4) << answer.ms_per_sample()
         << std::setw(10) << std::setprecision(2)
         << (relative ? answer.ms_per_sample() / none.ms_per_sample() : 0)
         << '\n';
  }
  io.out << text.str();
}

}  // namespace remat::cli
