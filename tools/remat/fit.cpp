// fit.cpp: `remat fit`: the largest batch, or sequence length, of a built-in
// model that trains under a memory cap, with no checkpointing, the best
// checkpoint_sequential and the optimal plan (remat::fit_batch,
// remat::fit_size), each confirmed by a measured step.
//
// --over batch: the chain is the workload's model; inputs of batch b come
// from a workload made with the same flags and seed but --batch b (the same
// kind of data). --over seq-len (gpt only): the model has positions up to
// --max-seq-len (at least 4 --probe-seq-len, the largest profiled length);
// at length n its stages are models::gpt_stages with the causal mask of n,
// and the input comes from a workload with --seq n, at the fixed --batch.
#include <algorithm>
#include <iomanip>
#include <sstream>

#include <models/gpt.h>
#include <remat/fit.h>
#include <remat/planner/units.h>
#include <nlohmann/json.hpp>

#include "cli_error.h"
#include "commands.h"

namespace remat::cli {
namespace {

/// The answers of `options`, and the workload whose model was fitted.
struct Fitted {
  std::vector<FitAnswer> answers;
  std::string description;
};

Fitted fit_over_batch(const FitCommandOptions& options, int64_t cap_bytes) {
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
  return {
      fit_batch(
          make_input,
          stages_of(workload.model()),
          cap_bytes,
          FitOptions()
              .probe_batch(options.probe_batch)
              .max_batch(options.max_batch)
              .max_time_ratio(options.max_time_ratio)),
      workload.description()};
}

Fitted fit_over_seq_len(const FitCommandOptions& options, int64_t cap_bytes) {
  if (options.model.model != "gpt") {
    throw UsageError(
        "--over seq-len: only --model gpt has a sequence length, got --model " +
        options.model.model);
  }
  if (options.max_seq_len < options.probe_seq_len) {
    throw UsageError(
        "--max-seq-len: expected at least --probe-seq-len (" +
        std::to_string(options.probe_seq_len) + "), got " +
        std::to_string(options.max_seq_len));
  }
  ModelFlags model_flags = options.model;
  model_flags.seq = std::max(options.max_seq_len, 4 * options.probe_seq_len);
  Workload workload(model_flags, options.seed);
  auto make_problem = [&](int64_t length) {
    ModelFlags flags = options.model;
    flags.seq = length;
    return FitProblem{
        models::gpt_stages(workload.model(), models::causal_mask(length)),
        Workload(flags, options.seed).next_batch().inputs};
  };
  return {
      fit_size(
          make_problem,
          cap_bytes,
          FitSizeOptions()
              .probe_size(options.probe_seq_len)
              .max_size(options.max_seq_len)
              .size_model(SizeModel::kQuadratic)
              .max_time_ratio(options.max_time_ratio)),
      workload.description()};
}

}  // namespace

CLI::App* add_fit_command(CLI::App& app, FitCommandOptions& options) {
  CLI::App* command = app.add_subcommand(
      "fit",
      "Find the largest batch (or, for the gpt, sequence length) of a "
      "built-in model that trains under a memory cap (activations plus "
      "input), with no checkpointing, the best checkpoint_sequential and the "
      "optimal plan; each answer is confirmed by a measured step");
  add_model_flags(*command, options.model);
  command->add_option("--cap", options.cap, "Memory cap in bytes (e.g. 64MiB)")
      ->required();
  command
      ->add_option(
          "--over",
          options.over,
          "What to fit: batch (at --seq for the gpt) or seq-len (gpt only, at "
          "--batch; --seq is not used)")
      ->check(CLI::IsMember({"batch", "seq-len"}))
      ->capture_default_str();
  command
      ->add_option(
          "--probe-batch",
          options.probe_batch,
          "--over batch: the smaller of the two profiled batches (the other "
          "is twice it)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  command
      ->add_option(
          "--max-batch",
          options.max_batch,
          "--over batch: largest batch considered")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24))
      ->capture_default_str();
  command
      ->add_option(
          "--probe-seq-len",
          options.probe_seq_len,
          "--over seq-len: the smallest of the three profiled lengths (the "
          "others are 2 and 4 times it)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16))
      ->capture_default_str();
  command
      ->add_option(
          "--max-seq-len",
          options.max_seq_len,
          "--over seq-len: largest length considered")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 18))
      ->capture_default_str();
  command
      ->add_option(
          "--max-time-ratio",
          options.max_time_ratio,
          "Checkpointing may cost at most this multiple of no checkpointing's "
          "measured time per sample (per position for seq-len; 0: no limit)")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  command->add_flag("--json", options.json, "Print JSON instead of text");
  add_run_flags(*command, options.threads, options.seed);
  return command;
}

void run_fit(const FitCommandOptions& options, const CommandIo& io) {
  apply_threads(options.threads);
  auto refuse = [&options](const std::string& why) {
    return UsageError(
        "--cap: expected a positive number of bytes with a unit (64MiB, "
        "1GiB, 500MB), got '" +
        options.cap + "'" + why);
  };
  Budget cap;
  try {
    cap = Budget::parse(options.cap);
  } catch (const c10::Error&) {
    throw refuse("");
  }
  if (cap.kind() != Budget::Kind::kBytes) {
    throw refuse(" (a cap is bytes, not a percentage of a plan's peak)");
  }
  const bool over_batch = options.over == "batch";
  if (!over_batch && options.over != "seq-len") {
    throw UsageError(
        "--over: expected batch or seq-len, got '" + options.over + "'");
  }
  const Fitted fitted = over_batch
                            ? fit_over_batch(options, cap.budget_bytes())
                            : fit_over_seq_len(options, cap.budget_bytes());
  const std::vector<FitAnswer>& answers = fitted.answers;
  const FitAnswer& none = answers.front();
  // The sequence length of an answer: the fitted size, or the fixed --seq
  // of a gpt fitted over the batch (null for the other models).
  auto seq_len_of = [&](const FitAnswer& answer) -> nlohmann::json {
    if (!over_batch) {
      return answer.size;
    }
    return options.model.model == "gpt" ? nlohmann::json(options.model.seq)
                                        : nlohmann::json(nullptr);
  };

  if (options.json) {
    nlohmann::json report;
    report["model"] = fitted.description;
    report["over"] = options.over;
    report["cap_bytes"] = cap.budget_bytes();
    report["answers"] = nlohmann::json::array();
    for (const FitAnswer& answer : answers) {
      report["answers"].push_back(
          {{"strategy", answer.strategy},
           {"segments", answer.segments},
           {"size", answer.size},
           {"batch", answer.batch},
           {"seq_len", seq_len_of(answer)},
           {"plan", answer.plan.to_string()},
           {"predicted",
            {{"peak_bytes", answer.predicted_peak_bytes},
             {"step_ms", answer.predicted_step_ms}}},
           {"measured",
            {{"peak_bytes", answer.measured_peak_bytes},
             {"step_ms", answer.measured_step_ms},
             {"ms_per_sample", answer.ms_per_sample()}}}});
    }
    io.out << report.dump(2) << '\n';
    return;
  }

  std::ostringstream text;
  text << "model  " << fitted.description << '\n'
       << "cap    " << planner::format_bytes(cap.budget_bytes())
       << " (activations plus the input, measured)\n"
       << "fit    "
       << (over_batch ? "the batch"
                      : "the sequence length, at batch " +
                            std::to_string(options.model.batch))
       << "\n\n";
  // Per unit of what is fitted: per sample, or per token of a sequence.
  auto ms_per_unit = [&](const FitAnswer& answer) {
    return over_batch
               ? answer.ms_per_sample()
               : answer.ms_per_sample() / static_cast<double>(answer.size);
  };
  text << std::left << std::setw(24) << "strategy" << std::right << std::setw(8)
       << (over_batch ? "batch" : "seq-len") << std::setw(10) << "vs none"
       << std::setw(14) << "measured" << std::setw(14) << "predicted"
       << std::setw(14) << (over_batch ? "ms/sample" : "ms/token")
       << std::setw(10) << "vs none" << '\n';
  text << std::fixed;
  for (const FitAnswer& answer : answers) {
    std::string name = answer.strategy;
    if (answer.segments > 0) {
      name += "(" + std::to_string(answer.segments) + ")";
    }
    text << std::left << std::setw(24) << name << std::right << std::setw(8)
         << answer.size;
    if (answer.size == 0) {
      text
          << (over_batch ? "  (not even --probe-batch fits)\n"
                         : "  (not even --probe-seq-len fits)\n");
      continue;
    }
    const bool relative = none.size > 0;
    text << std::setw(10) << std::setprecision(2)
         << (relative ? static_cast<double>(answer.size) / none.size : 0)
         << std::setw(14) << planner::format_bytes(answer.measured_peak_bytes)
         << std::setw(14) << planner::format_bytes(answer.predicted_peak_bytes)
         << std::setw(14) << std::setprecision(4) << ms_per_unit(answer)
         << std::setw(10) << std::setprecision(2)
         << (relative ? ms_per_unit(answer) / ms_per_unit(none) : 0) << '\n';
  }
  io.out << text.str();
}

}  // namespace remat::cli
