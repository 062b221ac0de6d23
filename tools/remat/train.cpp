// train.cpp: `remat train`: train a built-in model under an activation
// budget, with live progress and a summary against a no-checkpoint baseline.
//
// Flow: build the workload; profile its chain on the first batch; measure one
// no-checkpoint step to fix the budget frame (100% = that measured peak; see
// strategy.h); choose the plan; train. The baseline is a deep copy of the
// initial model trained on the same batches with the same per-step seeds,
// interleaved step by step (A B A B, bench-protocol.md) for the first
// --baseline-steps steps: its losses must equal the planned run's (bitwise
// for deterministic CPU ops), and its step time and activation peak are the
// reference of the summary. Warm-up steps (the first 3) are left out of
// the time medians.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <optional>
#include <sstream>

#include <remat/profile.h>
#include <nlohmann/json.hpp>

#include "budget.h"
#include "cli_error.h"
#include "commands.h"
#include "progress.h"
#include "runtime.h"
#include "strategy.h"

namespace remat::cli {
namespace {

constexpr int64_t kWarmupSteps = 3;
constexpr int64_t kLossWindow = 10;

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double mean(const std::vector<double>& values, size_t begin, size_t end) {
  double sum = 0;
  for (size_t i = begin; i < end; ++i) {
    sum += values[i];
  }
  return end > begin ? sum / static_cast<double>(end - begin) : 0;
}

std::string fixed(double value, int digits) {
  std::ostringstream text;
  text << std::fixed << std::setprecision(digits) << value;
  return text.str();
}

uint64_t step_seed(uint64_t seed, int64_t step) {
  return seed * 1000003ULL + static_cast<uint64_t>(step) + 1;
}

}  // namespace

CLI::App* add_train_command(CLI::App& app, TrainOptions& options) {
  CLI::App* command = app.add_subcommand(
      "train",
      "Train a built-in model (default: a character-level GPT on built-in "
      "text) under an activation budget; compare with no checkpointing");
  add_model_flags(*command, options.model);
  add_budget_flags(*command, options.budget);
  command->add_option("--steps", options.steps, "Training steps")
      ->check(CLI::Range(int64_t{1}, int64_t{100000000}))
      ->capture_default_str();
  command->add_option("--lr", options.lr, "AdamW learning rate")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  add_run_flags(*command, options.threads, options.seed);
  command
      ->add_option(
          "--mode",
          options.mode,
          "Checkpoint mode of uniform:K (checkpoint_sequential)")
      ->check(CLI::IsMember({"reentrant", "nonreentrant"}))
      ->capture_default_str();
  command->add_flag(
      "--no-baseline",
      options.no_baseline,
      "Skip the no-checkpoint comparison run");
  command
      ->add_option(
          "--baseline-steps",
          options.baseline_steps,
          "No-checkpoint steps interleaved with the first training steps")
      ->check(CLI::Range(int64_t{0}, int64_t{100000000}))
      ->capture_default_str();
  command
      ->add_option(
          "--log-every",
          options.log_every,
          "When stdout is not a terminal, print progress every N steps "
          "(0: steps / 20)")
      ->check(CLI::Range(int64_t{0}, int64_t{100000000}))
      ->capture_default_str();
  command->add_flag(
      "--json", options.json, "Print only a JSON summary (no progress lines)");
  return command;
}

void run_train(const TrainOptions& options, const CommandIo& io) {
  apply_threads(options.threads);
  const StrategySpec strategy = parse_strategy(options.budget.strategy);
  const BudgetSpec budget = parse_budget(options.budget.budget);
  const Mode mode = parse_mode(options.mode);
  if (options.steps < 1) {
    throw UsageError(
        "--steps: expected a positive integer, got " +
        std::to_string(options.steps));
  }
  const bool human = !options.json;
  const auto start = Clock::now();

  Workload workload(options.model, options.seed);
  torch::nn::Sequential model = workload.model();
  if (human) {
    io.out << "model     " << workload.description() << '\n';
  }
  const Batch probe = workload.next_batch();
  check_trainable(
      strategy, mode, static_cast<int64_t>(model->size()), probe.inputs);
  const planner::Chain chain = profile_chain(model, probe.inputs);
  const MeasuredReference reference = measure_reference(
      chain, model, workload, probe, step_seed(options.seed, -1));
  const int64_t store_all_peak = reference.no_checkpoint_peak_bytes;
  const BudgetFrame frame = reference.frame;
  const PlanChoice choice = choose_plan(
      chain,
      strategy,
      budget,
      options.budget.budget_given,
      frame,
      options.budget.slots);
  const double predicted_peak =
      static_cast<double>(choice.simulation.peak_bytes - frame.offset_bytes);
  if (human) {
    io.out << "budget    "
           << (choice.budget_bytes ? budget.to_string() : std::string("none"));
    if (choice.budget_bytes) {
      io.out << " = " << format_bytes(*choice.budget_bytes);
    }
    io.out << " (no-checkpoint activation peak measured: "
           << format_bytes(store_all_peak) << ")\n";
    io.out << "plan      " << strategy.to_string() << ": "
           << plan_brief(choice.plan) << '\n';
    io.out << "predicted peak "
           << format_bytes(static_cast<int64_t>(predicted_peak)) << " ("
           << fixed(predicted_peak / static_cast<double>(store_all_peak), 2)
           << "x), time "
           << fixed(choice.simulation.time_ms / choice.store_all_time_ms, 2)
           << "x of no checkpointing\n";
  }

  const bool with_baseline = !options.no_baseline && options.baseline_steps > 0;
  const int64_t baseline_steps =
      with_baseline ? std::min(options.baseline_steps, options.steps) : 0;
  std::optional<Trainer> baseline;
  if (with_baseline) {
    const PlanChoice none =
        choose_plan(chain, parse_strategy("none"), BudgetSpec{}, false, frame);
    baseline.emplace(clone_sequential(model), none, mode, options.lr);
  }
  Trainer trainer(model, choice, mode, options.lr);
  if (human) {
    io.out << "executor  " << trainer.executor().description() << "; "
           << options.steps << " steps";
    if (with_baseline) {
      io.out << ", the first " << baseline_steps
             << " interleaved with a no-checkpoint copy";
    }
    io.out << '\n';
  }

  std::vector<double> losses, step_ms, baseline_step_ms, planned_step_ms;
  int64_t peak_max = 0, baseline_peak_max = 0, over_budget_steps = 0;
  double max_loss_difference = 0;
  double planned_wall_s = 0, baseline_wall_s = 0;
  const int64_t log_every = options.log_every > 0
                                ? options.log_every
                                : std::max<int64_t>(1, options.steps / 20);
  ProgressLine progress(io.out, io.live, log_every);
  for (int64_t step = 0; step < options.steps; ++step) {
    const Batch batch = workload.next_batch();
    const uint64_t seed = step_seed(options.seed, step);
    auto step_start = Clock::now();
    const StepResult result = trainer.step(workload, batch, seed);
    planned_wall_s += seconds_since(step_start);
    losses.push_back(result.loss);
    step_ms.push_back(result.step_ms());
    peak_max = std::max(peak_max, result.activation_peak_bytes);
    if (choice.budget_bytes &&
        result.activation_peak_bytes > *choice.budget_bytes) {
      ++over_budget_steps;
    }
    if (step < baseline_steps) {
      step_start = Clock::now();
      const StepResult reference = baseline->step(workload, batch, seed);
      baseline_wall_s += seconds_since(step_start);
      baseline_peak_max =
          std::max(baseline_peak_max, reference.activation_peak_bytes);
      max_loss_difference = std::max(
          max_loss_difference, std::fabs(reference.loss - result.loss));
      if (step >= kWarmupSteps || baseline_steps <= kWarmupSteps) {
        baseline_step_ms.push_back(reference.step_ms());
        planned_step_ms.push_back(result.step_ms());
      }
    }
    if (human) {
      const double per_step = planned_wall_s / static_cast<double>(step + 1);
      const double per_baseline =
          step < baseline_steps
              ? baseline_wall_s / static_cast<double>(step + 1)
              : 0;
      const double left =
          per_step * static_cast<double>(options.steps - step - 1) +
          per_baseline * static_cast<double>(
                             std::max<int64_t>(0, baseline_steps - step - 1));
      std::ostringstream line;
      line << "step " << step + 1 << "/" << options.steps << "  loss "
           << fixed(result.loss, 4) << "  step " << fixed(result.step_ms(), 0)
           << " ms  peak " << format_bytes(result.activation_peak_bytes);
      if (choice.budget_bytes) {
        line << " / budget " << format_bytes(*choice.budget_bytes);
      }
      line << "  left " << format_duration(left);
      progress.update(line.str(), step + 1 == options.steps);
    }
  }
  progress.finish();
  const double total_s = seconds_since(start);

  const size_t window = std::min<size_t>(kLossWindow, losses.size());
  const double first_mean = mean(losses, 0, window);
  const double last_mean = mean(losses, losses.size() - window, losses.size());
  const double median_ms = median(step_ms);

  if (options.json) {
    nlohmann::json report;
    report["model"] = workload.description();
    report["strategy"] = strategy.to_string();
    report["budget"] =
        (choice.budget_bytes ? budget.to_string() : std::string("none"));
    report["budget_bytes"] = choice.budget_bytes
                                 ? nlohmann::json(*choice.budget_bytes)
                                 : nlohmann::json(nullptr);
    report["plan"] = choice.plan.to_string();
    report["predicted_peak_bytes"] = static_cast<int64_t>(predicted_peak);
    report["steps"] = options.steps;
    report["first_loss"] = losses.front();
    report["last_loss"] = losses.back();
    report["first_loss_mean"] = first_mean;
    report["last_loss_mean"] = last_mean;
    report["activation_peak_bytes"] = peak_max;
    report["over_budget_steps"] = over_budget_steps;
    report["step_ms_median"] = median_ms;
    report["no_checkpoint_peak_bytes"] = store_all_peak;
    report["seconds"] = total_s;
    if (with_baseline) {
      report["baseline"] = {
          {"steps", baseline_steps},
          {"activation_peak_bytes", baseline_peak_max},
          {"step_ms_median", median(baseline_step_ms)},
          {"planned_step_ms_median", median(planned_step_ms)},
          {"memory_ratio",
           static_cast<double>(peak_max) /
               static_cast<double>(std::max<int64_t>(1, baseline_peak_max))},
          {"time_ratio",
           median(planned_step_ms) / std::max(1e-9, median(baseline_step_ms))},
          {"max_loss_difference", max_loss_difference}};
    }
    io.out << report.dump(2) << '\n';
  } else {
    io.out << "summary   " << options.steps << " steps in "
           << format_duration(total_s) << '\n';
    io.out << "  loss            first " << fixed(losses.front(), 4)
           << " -> last " << fixed(losses.back(), 4) << "  (mean of first/last "
           << window << ": " << fixed(first_mean, 4) << " -> "
           << fixed(last_mean, 4) << ")\n";
    io.out << "  activation peak " << format_bytes(peak_max) << " max";
    if (choice.budget_bytes) {
      io.out << ", budget " << format_bytes(*choice.budget_bytes) << ": "
             << (over_budget_steps == 0
                     ? std::string("within on every step")
                     : "EXCEEDED on " + std::to_string(over_budget_steps) +
                           " steps");
    }
    io.out << '\n';
    if (with_baseline) {
      const double baseline_ms = median(baseline_step_ms);
      const double planned_ms = median(planned_step_ms);
      io.out << "  vs no checkpointing (" << baseline_steps
             << " interleaved steps):\n";
      io.out << "    memory  " << format_bytes(peak_max) << " vs "
             << format_bytes(baseline_peak_max) << " = "
             << fixed(
                    static_cast<double>(peak_max) /
                        static_cast<double>(
                            std::max<int64_t>(1, baseline_peak_max)),
                    2)
             << "x\n";
      io.out << "    time    " << fixed(planned_ms, 1) << " ms vs "
             << fixed(baseline_ms, 1) << " ms per step (median) = "
             << fixed(planned_ms / std::max(1e-9, baseline_ms), 2) << "x\n";
      io.out << "    losses  "
             << (max_loss_difference == 0
                     ? std::string("identical on every compared step")
                     : "differ by up to " + std::to_string(max_loss_difference))
             << '\n';
    } else {
      io.out << "  step time       " << fixed(median_ms, 1)
             << " ms median (no baseline run)\n";
    }
  }
  if (choice.budget_bytes && over_budget_steps > 0) {
    io.err << "warning: the measured activation peak " << format_bytes(peak_max)
           << " exceeded the budget " << format_bytes(*choice.budget_bytes)
           << " on " << over_budget_steps << " of " << options.steps
           << " steps\n";
  }
}

}  // namespace remat::cli
