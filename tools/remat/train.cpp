// train.cpp: `remat train`: train a built-in model under an activation
// budget, with live progress and a summary against a no-checkpoint baseline.
//
// Three steps, as every command that measures:
//   measure  build the workload; profile its chain on the first batch; choose
//            the plan for --strategy and --budget (100% = the simulated
//            store-all peak), or, with --recompute other than optimal, keep
//            everything at the plan's level and let the GPT's blocks
//            checkpoint themselves (models::GptRecompute); train, and step by
//            step for the first
//            --baseline-steps steps a deep copy of the initial model without
//            checkpointing on the same batches and per-step seeds (A B A B):
//            its losses must equal the planned run's (bitwise for
//            deterministic CPU ops), and its step time and activation peak
//            are the reference of the summary;
//   summarize  medians (warm-up steps, the first 3, left out), ratios;
//   render   text (progress lines, then a summary) or one JSON object.
// Peaks are compared with the budget in its units: the measured activation
// peak plus the chain input's bytes. A graph model (--model unet2d|unet3d,
// workload.h) runs the same steps on its graph: profile_graph, the plan of
// choose_graph_plan (--strategy optimal|none|per-block|encoder), a
// PlannedGraph (none: the stages run plainly, as the baseline), and, at
// every progress line, the Dice score of the model on a held-out batch.
// --precision bf16 runs profiling and every step of both runs under CPU
// autocast (runtime.h), so the plan is made from bf16 measurements and the
// losses still compare bitwise.
//
// --recompute dynamic (any model): no plan; the planned trainer runs the
// model plainly inside a DynamicRemat scope (Trainer::run_dynamic) whose
// budget is half the run's budget less the input at the first step, then,
// before each step, the budget less the largest overhead a step has shown
// beyond the scope's tracked bytes, never lowered when the scope could not
// keep its budget (retune_dynamic_scope; docs/cli.md).
//
// Self-correction: an optimal plan (--strategy optimal, chain or graph; not
// a GPT recipe, not in a process group, where every rank must run rank 0's
// plan) corrects itself unless --fixed-plan is given (runtime.h,
// SelfCorrection, with the library's default window and threshold): after
// each window of steps the same budget is solved again on the executor's
// measured stage times, and a plan predicted faster by more than the
// threshold replaces the one in force between steps. After the first window the
// command prints the predicted against measured time of every stage and the
// decision, then every later re-plan. The predicted peak reported is the
// highest of the plans that ran.
//
// Data parallel (docs/distributed.md): --nproc N relaunches this command as N
// local workers (distributed::launch_local) and waits; a worker, given
// --rank/--world-size or the environment of torchrun or --nproc, joins the
// group, draws the global --batch and trains on its slice, with the
// gradients averaged over the ranks (distributed::GradientSync). Every rank
// profiles its own slice, but the plan depends on measured times, which
// differ between ranks: rank 0's plan is shared with all (through the
// store), each rank checks that it is valid for its own chain, and the ranks
// check that their models and flags agree. Only rank 0 prints; there is no
// baseline run. --shard trains sharded instead (distributed::ShardedStages):
// the chain the plan is made for also counts each stage's gathered
// parameters and the resident shards, so the budget and the reported peak
// cover parameters and activations together; --save gathers the parameters
// on every rank and rank 0 writes them.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <limits>
#include <optional>
#include <sstream>

#include <remat/config.h>
#if REMAT_WITH_DISTRIBUTED
#include <remat/distributed.h>
#endif
#include <remat/measure/runner.h>
#include <remat/measure/statistics.h>
#include <remat/measure/timer.h>
#include <remat/profile.h>
#include <torch/serialize.h>
#include <nlohmann/json.hpp>

#include <remat/budget.h>
#include "cli_error.h"
#include "commands.h"
#include "models/gpt.h"
#include "models/segmentation_data.h"
#include "progress.h"
#include "runtime.h"
#include "strategy.h"

namespace remat::cli {
namespace {

// Interleaved steps left out of the time medians (remat::measure's warm-up).
constexpr int64_t kWarmupSteps = measure::kDefaultWarmupRounds;
constexpr int64_t kLossWindow = 10;

double seconds_since(const measure::Timer& timer) {
  return timer.elapsed_ms() / 1e3;
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

/// "1 step", "2 steps".
std::string count(int64_t n, const std::string& noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

/// Self-correction's window and threshold (the library's defaults), as
/// "3 steps" and "5%".
std::string correction_window_text() {
  return count(SelfCorrection().correction_steps, "step");
}

std::string correction_threshold_text() {
  return fixed(SelfCorrection().correction_threshold * 100, 0) + "%";
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
  command->add_option("--lr", options.lr, "Learning rate")
      ->check(
          [](const std::string& text) {
            try {
              size_t used = 0;
              const double value = std::stod(text, &used);
              if (used == text.size() && value > 0 && std::isfinite(value)) {
                // The optimizers take it as a float.
                if (value <= std::numeric_limits<float>::max()) {
                  return std::string();
                }
                return "expected at most 3.4e38 (a float), got '" + text + "'";
              }
            } catch (const std::exception&) {
            }
            return "expected a positive number, got '" + text + "'";
          },
          "POSITIVE")
      ->capture_default_str();
  command
      ->add_option(
          "--optimizer",
          options.optimizer,
          "adamw, or sgd (plain SGD) for exact comparisons between runs "
          "(AdamW divides by the gradient's magnitude, which amplifies "
          "rounding)")
      ->check(CLI::IsMember({"adamw", "sgd"}))
      ->capture_default_str();
  add_precision_flag(*command, options.precision);
  add_selective_flag(*command, options.selective);
  add_run_flags(*command, options.threads, options.seed);
  command
      ->add_option(
          "--mode",
          options.mode,
          "Checkpoint mode of uniform:K (checkpoint_sequential)")
      ->check(CLI::IsMember({"reentrant", "nonreentrant"}))
      ->capture_default_str();
  command
      ->add_option(
          "--recompute",
          options.recompute,
          "optimal: the plan of --strategy/--budget; dynamic: no plan, a "
          "DynamicRemat scope keeps the saved activations within --budget "
          "(any model); none, full (each block), attention (each attention "
          "core) or selective (each block, matmul outputs kept): the GPT's "
          "own recipe, no plan")
      ->check(CLI::IsMember(
          {"optimal", "dynamic", "none", "full", "attention", "selective"}))
      ->capture_default_str();
  command
      ->add_option(
          "--compress",
          options.compress,
          "Store saved activations outside checkpointed regions as bf16, fp16 "
          "or int8 (lossy; the baseline copy is not compressed)")
      ->check(CLI::IsMember({"none", "bf16", "fp16", "int8"}))
      ->capture_default_str();
  command->add_flag(
      "--no-baseline",
      options.no_baseline,
      "Skip the no-checkpoint comparison run");
  command->add_flag(
      "--fixed-plan",
      options.fixed_plan,
      "Keep the plan chosen before training (reproducible schedules). "
      "Without it, --strategy optimal re-solves the same budget on the "
      "stage times measured every " +
          correction_window_text() +
          " and switches, between steps, to a plan predicted more than " +
          correction_threshold_text() +
          " faster; the run prints the profiled against the measured time of "
          "every stage after the first window, and every re-plan (not in "
          "data-parallel runs, which keep rank 0's plan)");
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
  command->add_option(
      "--save",
      options.save,
      "Write the trained parameters to this file (torch::save of "
      "model->parameters(); rank 0 only)");
  command
      ->add_option(
          "--nproc",
          options.nproc,
          "Data parallel: run N workers of this command on this machine "
          "(loopback); --batch is the global batch")
      ->check(CLI::Range(int64_t{1}, int64_t{1024}));
  command
      ->add_option(
          "--rank",
          options.rank,
          "Data parallel: this worker's rank in a multi-machine job "
          "(with --world-size, --master-addr, --master-port)")
      ->check(CLI::NonNegativeNumber);
  command->add_option("--world-size", options.world_size, "Ranks of the job")
      ->check(CLI::PositiveNumber);
  command->add_option("--master-addr", options.master_addr, "Address of rank 0")
      ->capture_default_str();
  command
      ->add_option(
          "--master-port", options.master_port, "Rendezvous port on rank 0")
      ->check(CLI::Range(int64_t{1}, int64_t{65535}))
      ->capture_default_str();
  command->add_flag(
      "--shard",
      options.shard,
      "Sharded training (with --nproc or --rank): each rank keeps a shard "
      "of every block's parameters, gradients and AdamW state; a block's "
      "parameters are gathered for its forwards and its backward; the "
      "budget covers parameters and activations");
  command
      ->add_option(
          "--timeout",
          options.timeout_s,
          "Data parallel: seconds to wait for the other ranks to join and for "
          "each collective (a failed rank makes the others exit within it)")
      ->check(finite_number())
      ->check(CLI::Range(0.001, 1e7))
      ->capture_default_str();
  return command;
}

namespace {

/// Writes `model`'s parameters to `path` (torch::save of the list).
void save_parameters(const torch::nn::Module& model, const std::string& path) {
  std::vector<torch::Tensor> values;
  for (const auto& parameter : model.parameters()) {
    values.push_back(parameter.detach());
  }
  try {
    torch::save(values, path);
  } catch (const c10::Error& error) {
    throw UsageError(
        "--save: cannot write '" + path +
        "': " + error.what_without_backtrace());
  }
}

/// Refuses a --save path that could not be written, before any training:
/// its folder is made (as --out's is) and must be writable, and the path
/// must not be a folder.
void check_save_path(const std::string& path) {
  if (path.empty()) {
    return;
  }
  const std::filesystem::path file(path);
  const std::string folder =
      file.has_parent_path() ? file.parent_path().string() : ".";
  make_folder("--save", folder);
  std::error_code error;
  if (std::filesystem::is_directory(file, error)) {
    throw UsageError("--save: '" + path + "' is a folder, expected a file");
  }
  if (::access(folder.c_str(), W_OK) != 0) {
    throw UsageError(
        "--save: cannot write in folder '" + folder +
        "': " + std::strerror(errno));
  }
}

#if REMAT_WITH_DISTRIBUTED
/// The command line of a local worker: `arguments` without --nproc.
std::vector<std::string> worker_arguments(
    const std::vector<std::string>& arguments) {
  std::vector<std::string> kept;
  for (size_t index = 0; index < arguments.size(); ++index) {
    const std::string& argument = arguments[index];
    if (argument == "--nproc") {
      ++index;  // and its value
    } else if (argument.rfind("--nproc=", 0) != 0) {
      kept.push_back(argument);
    }
  }
  return kept;
}
#endif

/// This process's part in data-parallel training.
struct Parallel {
#if REMAT_WITH_DISTRIBUTED
  std::optional<distributed::ProcessGroup> group;
#endif
  int64_t rank = 0;
  int64_t world_size = 1;

  /// Whether this process trains in a group.
  bool joined() const {
#if REMAT_WITH_DISTRIBUTED
    return group.has_value();
#else
    return false;
#endif
  }

  /// This rank's slice of a global batch.
  Batch slice(const Batch& batch) const {
#if REMAT_WITH_DISTRIBUTED
    if (group) {
      return {
          distributed::local_slice(batch.inputs, *group),
          distributed::local_slice(batch.targets, *group)};
    }
#endif
    return batch;
  }
};

/// Joins the group named by --rank or by the environment, if any.
Parallel join_group(const TrainOptions& options) {
  Parallel parallel;
#if !REMAT_WITH_DISTRIBUTED
  // Built without remat::distributed: the flags that ask for a group say so,
  // and so does an environment set up by torchrun (else each worker would
  // train alone, unaware of the others).
  if (options.rank >= 0) {
    throw_without_distributed("--rank");
  }
  if (options.world_size > 0) {
    throw_without_distributed("--world-size");
  }
  if (options.shard) {
    throw_without_distributed("--shard");
  }
  if (std::getenv("WORLD_SIZE") != nullptr) {
    throw_without_distributed("the environment's WORLD_SIZE (torchrun)");
  }
  return parallel;
#else
  const auto timeout = std::chrono::milliseconds(
      static_cast<int64_t>(std::llround(options.timeout_s * 1000)));
  distributed::GroupOptions group_options;
  if (options.rank >= 0) {
    if (options.world_size < 1) {
      throw UsageError(
          "--rank: expected --world-size too, got --rank " +
          std::to_string(options.rank) + " alone");
    }
    if (options.rank >= options.world_size) {
      throw UsageError(
          "--rank: expected a rank in [0, --world-size " +
          std::to_string(options.world_size) + "), got " +
          std::to_string(options.rank));
    }
    group_options.rank(options.rank)
        .world_size(options.world_size)
        .master_addr(options.master_addr)
        .master_port(options.master_port)
        .timeout(timeout);
  } else if (distributed::environment_names_a_group()) {
    group_options = distributed::group_options_from_env(
        distributed::GroupOptions().timeout(timeout));
  } else {
    if (options.world_size > 0) {
      throw UsageError(
          "--world-size: expected --rank too (or --nproc for local workers)");
    }
    if (options.shard) {
      throw UsageError(
          "--shard: shards over a group of workers; expected --nproc N or "
          "--rank/--world-size too");
    }
    return parallel;
  }
  if (options.model.batch % group_options.world_size() != 0) {
    throw UsageError(
        "--batch: the global batch must divide by the world size " +
        std::to_string(group_options.world_size()) + ", got " +
        std::to_string(options.model.batch));
  }
  parallel.group.emplace(group_options);
  parallel.rank = parallel.group->rank();
  parallel.world_size = parallel.group->world_size();
  return parallel;
#endif
}

/// What one `remat train` run measured.
struct TrainRun {
  std::string model;
  std::string recompute;                      ///< --recompute
  std::string compress;                       ///< --compress
  std::string optimizer;                      ///< --optimizer
  Precision precision = Precision::kFloat32;  ///< --precision
  planner::Strategy strategy;
  /// --strategy as reports name it (a graph strategy for a graph model).
  std::string strategy_name;
  /// A graph model (workload.h): planned as a planner::Graph.
  bool graph = false;
  /// Graph models: the Dice score on the held-out batch, by step (0: before
  /// training), at every progress line.
  std::vector<std::pair<int64_t, double>> dice;
  /// Graph models: the held-out batch's size.
  int64_t dice_batch = 0;
  Budget budget;
  PlanChoice choice;
  int64_t input_bytes = 0;
  /// The chain's resident bytes (sharded: this rank's shards and their
  /// gradients), in every peak of the budget's units.
  int64_t resident_bytes = 0;
  /// The model state the profile predicts (parameters, gradients, optimizer
  /// state; planner::ModelState), what a total budget subtracts.
  planner::ModelState predicted_state;
  int64_t steps = 0;
  /// The optimal plan corrects itself (not --fixed-plan).
  bool self_correct = false;
  /// Self-correction's measurements and re-plans at the end of the run.
  std::optional<CorrectionReport> correction;
  /// The highest predicted peak of the plans that ran (the plan chosen
  /// before training and every plan self-correction switched to).
  int64_t predicted_peak_bytes = 0;
  std::vector<double> losses;
  std::vector<double> step_ms;
  /// Highest activation peak over the steps (forward + loss + backward).
  int64_t activation_peak_bytes = 0;
  /// The same plus the input bytes (plus, when sharded, the resident
  /// parameter shards and their gradients): the budget's units.
  int64_t peak_bytes = 0;
  bool sharded = false;
  /// Bytes of the model's parameters (all of them, unsharded).
  int64_t parameter_bytes = 0;
  /// Parameter memory held through a step (parameters, buffers and
  /// gradients, or their shards), measured; the highest over the steps.
  int64_t parameter_state_bytes = 0;
  /// The optimizer's state held through a step, measured; the highest.
  int64_t optimizer_state_bytes = 0;
  /// The optimizer's state after an update, measured; the highest (what a
  /// one-step run reports: its update creates the state after the step's
  /// activations are freed).
  int64_t optimizer_state_after_bytes = 0;
  /// Highest activation peak + input + parameter_state_bytes: parameters
  /// and activations together, comparable between sharded and not.
  int64_t peak_with_parameters_bytes = 0;
  /// Highest activation peak + input + parameter and optimizer state: the
  /// whole step's memory, a total budget's units.
  int64_t total_peak_bytes = 0;
  int64_t over_budget_steps = 0;
  /// The highest amount by which a step exceeded the budget (0: none did).
  int64_t most_over_budget_bytes = 0;
  double seconds = 0;
  // The interleaved no-checkpoint baseline (baseline_steps == 0: none).
  int64_t baseline_steps = 0;
  int64_t baseline_peak_bytes = 0;
  std::vector<double> baseline_step_ms;
  std::vector<double> compared_step_ms;  ///< the planned run, same steps
  double max_loss_difference = 0;
  /// --recompute dynamic: the scope's budget and what it did.
  struct Dynamic {
    /// The scope's budget at the first step (dynamic_scope) and now
    /// (retune_dynamic_scope).
    int64_t first_scope_budget_bytes = 0;
    int64_t scope_budget_bytes = 0;
    /// The most a step's peak (activations + input) has exceeded what the
    /// scope held, in bytes and per byte of the step's batch input
    /// (observe_dynamic_step).
    int64_t overhead_bytes = 0;
    double overhead_per_input_byte = 0;
    /// The highest tracked peak over the steps.
    int64_t tracked_peak_bytes = 0;
    /// The last step's tracked peak.
    int64_t last_tracked_peak_bytes = 0;
    /// The most bytes one recorded call saved in any step: the scope's
    /// budget never goes below it.
    int64_t largest_call_bytes = 0;
    /// Per step: operator calls recorded, storages evicted, recorded calls
    /// re-run.
    std::vector<double> recorded_calls;
    std::vector<double> evictions;
    std::vector<double> rematerializations;
  };
  std::optional<Dynamic> dynamic;
};

/// The numbers the renderers print.
struct TrainSummary {
  /// Steps in each of the first and last loss windows: at most 10 and at
  /// most half the run, so they never overlap (0 for a one-step run).
  size_t window = 0;
  double first_loss_mean = 0;
  double last_loss_mean = 0;
  double step_ms_median = 0;
  double baseline_step_ms_median = 0;
  double compared_step_ms_median = 0;
  double memory_ratio = 0;
  /// Planned step time over the baseline's, step by step (the two run
  /// interleaved): the median of the per-step ratios with its 95 % interval.
  measure::RatioInterval time_ratio;
};

/// Whether this command trains data parallel: by its flags, or as a worker
/// that --nproc or torchrun started (the group in the environment).
bool data_parallel(const TrainOptions& options) {
  if (options.nproc > 0 || options.rank >= 0 || options.shard) {
    return true;
  }
#if REMAT_WITH_DISTRIBUTED
  return distributed::environment_names_a_group();
#else
  return false;
#endif
}

/// Refuses the flags a graph model does not take, before any work.
void check_graph_flags(const TrainOptions& options) {
  auto refuse = [&](const std::string& flag) {
    return UsageError(
        flag + ": not supported with --model " + options.model.model +
        " (a U-Net trains with --strategy optimal, none, per-block or "
        "encoder)");
  };
  if (options.compress != "none") {
    throw refuse("--compress " + options.compress);
  }
  if (options.selective) {
    throw refuse("--selective");
  }
  if (data_parallel(options)) {
    throw refuse("--nproc, --rank and --shard");
  }
}

/// Refuses flag combinations of --recompute and --budget before any work.
void check_recompute_flags(const TrainOptions& options, bool recipe) {
  if (options.recompute == "dynamic") {
    // The scope refuses autocast and other saved-tensor hooks.
    auto refuse = [&](const std::string& flag, const std::string& why) {
      return UsageError(
          flag + ": not supported with --recompute dynamic (" + why + ")");
    };
    if (options.precision != "fp32") {
      throw refuse(
          "--precision " + options.precision,
          "a DynamicRemat scope refuses autocast");
    }
    if (options.compress != "none") {
      throw refuse(
          "--compress " + options.compress,
          "the scope's saved-tensor hooks are the only ones");
    }
    if (options.selective) {
      throw refuse("--selective", "there is no plan to choose it");
    }
    if (data_parallel(options)) {
      throw refuse("--nproc, --rank and --shard", "one process only");
    }
  }
  if (recipe && options.model.model != "gpt") {
    throw UsageError(
        "--recompute " + options.recompute +
        ": expected --model gpt (the recipes are the GPT's), got --model " +
        options.model.model);
  }
  if (options.shard &&
      Budget::parse(options.budget.budget).kind() == Budget::Kind::kTotal) {
    throw UsageError(
        "--budget " + options.budget.budget +
        ": a total budget is not supported with --shard (the resident shards "
        "are already in the budget); give the activation budget instead");
  }
}

#if REMAT_WITH_DISTRIBUTED
/// Checks that every rank runs the same model and flags, and gives them
/// rank 0's initial parameters.
void agree_on_model(
    const TrainOptions& options,
    const std::string& description,
    torch::nn::Sequential& model,
    distributed::ProcessGroup& group) {
  group.check_same(
      "the model and its flags",
      description + "; " + options.recompute + ", " + options.mode + ", " +
          options.precision + ", compress " + options.compress +
          ", selective " + (options.selective ? "on" : "off") + ", shard " +
          (options.shard ? "on" : "off") + ", steps " +
          std::to_string(options.steps) + ", " + options.optimizer + ", seed " +
          std::to_string(options.seed));
  distributed::broadcast_parameters(model->parameters(), group);
}
#endif

/// The training model's chain on `probe`, profiled in the run's precision
/// with the optimizer's state ratio. Profiled unsharded (every rank still
/// holds the whole model here); when sharded, the planner also counts the
/// parameters each stage gathers and the shards every rank keeps, so the
/// budget covers both.
planner::Chain profile_training_chain(
    const TrainOptions& options,
    const TrainRun& run,
    const torch::nn::Sequential& model,
    const Batch& probe,
    const Parallel& parallel) {
  AutocastGuard autocast(c10::kCPU, run.precision);
  const planner::Chain profiled = profile_chain(
      model,
      probe.inputs,
      ProfileOptions()
          .selective_policy(selective_policy(options.selective))
          .optimizer_state_ratio(
              OptimizerChoice{options.optimizer, options.lr}.state_ratio()));
#if REMAT_WITH_DISTRIBUTED
  if (options.shard) {
    return distributed::sharded_chain(
        profiled, stages_of(model), parallel.world_size);
  }
#else
  (void)parallel;
#endif
  return profiled;
}

/// The plan for `chain`; in a group, rank 0's, checked on this rank's chain.
/// With a GPT recipe (`recipe`), no plan: a given budget is only checked
/// against the measured peaks.
PlanChoice plan_training(
    const TrainOptions& options,
    const TrainRun& run,
    const planner::Chain& chain,
    bool recipe,
    Parallel& parallel) {
  if (recipe || run.dynamic) {
    PlanChoice choice = choose_plan(
        chain, run.strategy, Budget::none(), BudgetOrigin::kDefault);
    if (run.dynamic) {
      choice.budget_bytes = run.budget.resolve_bytes(chain);
      choice.budget_text = run.budget.to_string();
    } else if (options.budget.budget_given && !run.budget.is_none()) {
      choice.budget_bytes = run.budget.resolve_bytes(chain);
      choice.budget_text = run.budget.to_string() +
                           ", checked (the recipe decides what is kept)";
    }
    return choice;
  }
  PlanChoice choice = choose_plan(
      chain,
      run.strategy,
      run.budget,
      options.budget.origin(),
      options.budget.solver());
  choice.selective_policy = selective_policy(options.selective);
#if REMAT_WITH_DISTRIBUTED
  if (parallel.group) {
    choice.plan = planner::plan_from_json(
        parallel.group->share(planner::to_json(choice.plan)));
    choice.simulation = planner::simulate(chain, choice.plan);
    if (!choice.simulation.valid) {
      throw UsageError(
          "rank " + std::to_string(parallel.rank) +
          ": rank 0's plan is not valid for this rank's chain: " +
          choice.simulation.error);
    }
  }
#else
  (void)parallel;
#endif
  return choice;
}

/// --recompute dynamic's scope budget at the first step: half of the run's
/// budget less the input. Throws UsageError naming the budget if it does
/// not exceed the input.
TrainRun::Dynamic dynamic_scope(int64_t input_bytes, const PlanChoice& choice) {
  const int64_t budget = *choice.budget_bytes;
  if (budget <= input_bytes) {
    throw UsageError(
        "--budget " + choice.budget_text + " = " + count(budget, "byte") +
        ": --recompute dynamic needs more than the input's " +
        count(input_bytes, "byte"));
  }
  TrainRun::Dynamic dynamic;
  dynamic.scope_budget_bytes = (budget - input_bytes) / 2;
  dynamic.first_scope_budget_bytes = dynamic.scope_budget_bytes;
  return dynamic;
}

/// Records what a dynamic step (fed `batch_input_bytes` of input) needed
/// beyond the scope's tracked bytes: its overhead, the most its peak
/// (activations + input) held beyond what the scope held (the input,
/// gradients in flight, temporaries, tensors the running code holds),
/// measured against the scope's budget when it evicted, else against its
/// tracked peak.
void observe_dynamic_step(
    TrainRun& run, const StepResult& result, int64_t batch_input_bytes) {
  TrainRun::Dynamic& dynamic = *run.dynamic;
  const int64_t peak = result.activation_peak_bytes + run.input_bytes;
  const int64_t held = result.dynamic->evictions > 0
                           ? dynamic.scope_budget_bytes
                           : result.dynamic->tracked_peak_bytes;
  const int64_t overhead = peak - held;
  dynamic.overhead_bytes = std::max(dynamic.overhead_bytes, overhead);
  dynamic.last_tracked_peak_bytes = result.dynamic->tracked_peak_bytes;
  dynamic.largest_call_bytes =
      std::max(dynamic.largest_call_bytes, result.dynamic->largest_call_bytes);
  dynamic.overhead_per_input_byte = std::max(
      dynamic.overhead_per_input_byte,
      static_cast<double>(overhead) /
          static_cast<double>(std::max<int64_t>(1, batch_input_bytes)));
}

/// Before a dynamic step after the first, sets the scope's budget: the
/// run's budget less the overhead expected (the largest seen, or, for a
/// larger batch than seen, the largest per byte of input times this one's
/// `batch_input_bytes`) and a margin of 1/32 of the budget. Never below a
/// quarter of the first step's budget (a budget the overhead alone fills is
/// not kept: the summary says by how much) nor below what the largest
/// recorded call has saved (the scope would refuse that call), nor above the
/// budget less the input; and never lowered after a step whose tracked peak
/// exceeded the scope's budget by more than that margin: what the scope
/// could not evict then was held by the running code, and a lower budget
/// would only recompute more for the same peak.
void retune_dynamic_scope(
    TrainRun& run, int64_t batch_input_bytes, Trainer& trainer) {
  TrainRun::Dynamic& dynamic = *run.dynamic;
  const int64_t budget = *run.choice.budget_bytes;
  const auto overhead = std::max<int64_t>(
      dynamic.overhead_bytes,
      static_cast<int64_t>(std::ceil(
          dynamic.overhead_per_input_byte *
          static_cast<double>(batch_input_bytes))));
  const int64_t margin = budget / 32;
  int64_t retuned = std::clamp<int64_t>(
      budget - overhead - margin,
      std::max<int64_t>(
          {1,
           dynamic.first_scope_budget_bytes / 4,
           dynamic.largest_call_bytes}),
      budget - run.input_bytes);
  if (retuned < dynamic.scope_budget_bytes &&
      dynamic.last_tracked_peak_bytes > dynamic.scope_budget_bytes + margin) {
    retuned = dynamic.scope_budget_bytes;
  }
  if (retuned != dynamic.scope_budget_bytes) {
    dynamic.scope_budget_bytes = retuned;
    trainer.run_dynamic(DynamicRematOptions().budget_bytes(retuned));
  }
}

/// The lines before training: the budget, the plan and its prediction.
void print_plan(
    const TrainOptions& options,
    const TrainRun& run,
    bool recipe,
    std::ostream& out) {
  const PlanChoice& choice = run.choice;
  out << "budget    "
      << (choice.budget_bytes ? choice.budget_text + " = " +
                                    planner::format_bytes(*choice.budget_bytes)
                              : std::string("none"))
      << (run.budget.is_total()
              ? " for activations + input after the model state " +
                    planner::format_bytes(run.predicted_state.total_bytes())
              : std::string())
      << " (predicted no-checkpoint peak "
      << planner::format_bytes(choice.store_all_peak_bytes) << ")\n";
  if (const std::optional<std::string> note = budget_note(choice)) {
    out << "          " << *note << '\n';
  }
  if (recipe) {
    out << "recompute " << options.recompute
        << ": the GPT's own recipe (no plan, no prediction)\n";
    return;
  }
  if (run.dynamic) {
    out << "dynamic   no plan: a DynamicRemat scope keeps the saved "
           "activations within "
        << planner::format_bytes(run.dynamic->scope_budget_bytes)
        << " at the first step (half the budget less the input), then the "
           "budget less the most a step has needed beyond them\n";
    return;
  }
  out << "plan      " << run.strategy_name << ": " << plan_brief(choice.plan)
      << '\n';
  out << "predicted peak "
      << planner::format_bytes(choice.simulation.peak_bytes) << " ("
      << fixed(
             static_cast<double>(choice.simulation.peak_bytes) /
                 static_cast<double>(choice.store_all_peak_bytes),
             2)
      << "x), time "
      << fixed(choice.simulation.step_ms / choice.store_all_step_ms, 2)
      << "x of no checkpointing\n";
}

/// The trainers of a run: the planned one and, with a baseline, a
/// no-checkpoint copy of the model.
struct Trainers {
  std::unique_ptr<Trainer> planned;
  std::unique_ptr<Trainer> baseline;
};

/// A graph model's trainers: the plan of `strategy` and, with a baseline,
/// a copy of the model run plainly.
Trainers make_graph_trainers(
    const TrainOptions& options,
    const TrainRun& run,
    const planner::Graph& graph,
    const TrainingGraph& model,
    GraphStrategy strategy) {
  const OptimizerChoice optimizer{options.optimizer, options.lr};
  Trainers trainers;
  if (run.baseline_steps > 0) {
    const PlanChoice none = choose_graph_plan(
        graph,
        GraphStrategy::kNone,
        model.encoder_stages,
        Budget::none(),
        BudgetOrigin::kDefault);
    trainers.baseline = std::make_unique<Trainer>(
        clone_training_graph(model), none, true, optimizer, run.precision);
  }
  std::optional<SelfCorrection> correction;
  if (run.self_correct) {
    correction = SelfCorrection{std::nullopt, graph, options.budget.solver()};
  }
  trainers.planned = std::make_unique<Trainer>(
      model,
      run.choice,
      strategy == GraphStrategy::kNone,
      optimizer,
      run.precision,
      correction);
  if (run.dynamic) {
    trainers.planned->run_dynamic(
        DynamicRematOptions().budget_bytes(run.dynamic->scope_budget_bytes));
  }
  return trainers;
}

Trainers make_trainers(
    const TrainOptions& options,
    const TrainRun& run,
    const planner::Chain& chain,
    torch::nn::Sequential& model,
    bool recipe,
    const Parallel& parallel) {
  const Mode mode = parse_mode(options.mode);
  const OptimizerChoice optimizer{options.optimizer, options.lr};
  Trainers trainers;
  if (run.baseline_steps > 0) {
    const PlanChoice none = choose_plan(
        chain,
        planner::Strategy::parse("none"),
        Budget::none(),
        BudgetOrigin::kDefault);
    trainers.baseline = std::make_unique<Trainer>(
        clone_sequential(model),
        none,
        mode,
        optimizer,
        std::nullopt,
        run.precision);
  }
  if (recipe) {
    models::set_recompute(
        model, models::parse_gpt_recompute(options.recompute));
  }
  std::optional<SelfCorrection> correction;
  if (run.self_correct) {
    correction = SelfCorrection{chain, std::nullopt, options.budget.solver()};
  }
  trainers.planned = std::make_unique<Trainer>(
      model,
      run.choice,
      mode,
      optimizer,
      parse_compress(options.compress),
      run.precision,
      correction
#if REMAT_WITH_DISTRIBUTED
      ,
      parallel.group,
      options.shard
#endif
  );
  if (run.dynamic) {
    trainers.planned->run_dynamic(
        DynamicRematOptions().budget_bytes(run.dynamic->scope_budget_bytes));
  }
  (void)parallel;
  return trainers;
}

#if REMAT_WITH_DISTRIBUTED
void print_parallel(
    const TrainOptions& options,
    const planner::Chain& chain,
    const Parallel& parallel,
    std::ostream& out) {
  const distributed::GroupOptions& group = parallel.group->options();
  out << "parallel  " << parallel.world_size << " ranks (Gloo, rendezvous "
      << group.master_addr() << ":" << group.master_port() << "), local batch "
      << options.model.batch / parallel.world_size << " of "
      << options.model.batch
      << (options.shard ? ", sharded: each rank keeps 1/" +
                              std::to_string(parallel.world_size) +
                              " of the parameters, gradients and AdamW state; "
                              "resident " +
                              planner::format_bytes(chain.resident_bytes()) +
                              " of the budget"
                        : std::string(", gradients averaged during backward"))
      << "; no baseline run\n";
}
#endif

/// Adds one planned step's measurements to the run.
void record_step(TrainRun& run, const StepResult& result) {
  const int64_t peak =
      result.activation_peak_bytes + run.input_bytes + run.resident_bytes;
  const int64_t total_peak =
      result.model_and_activation_bytes() + run.input_bytes;
  run.parameter_state_bytes =
      std::max(run.parameter_state_bytes, result.parameter_state_bytes);
  run.optimizer_state_bytes =
      std::max(run.optimizer_state_bytes, result.optimizer_state_bytes);
  run.optimizer_state_after_bytes = std::max(
      run.optimizer_state_after_bytes, result.optimizer_state_after_bytes);
  run.peak_with_parameters_bytes = std::max(
      run.peak_with_parameters_bytes,
      result.activation_peak_bytes + run.input_bytes +
          result.parameter_state_bytes);
  run.total_peak_bytes = std::max(run.total_peak_bytes, total_peak);
  run.losses.push_back(result.loss);
  run.step_ms.push_back(result.step_ms());
  if (run.dynamic && result.dynamic) {
    TrainRun::Dynamic& dynamic = *run.dynamic;
    dynamic.tracked_peak_bytes = std::max(
        dynamic.tracked_peak_bytes, result.dynamic->tracked_peak_bytes);
    dynamic.recorded_calls.push_back(
        static_cast<double>(result.dynamic->recorded_calls));
    dynamic.evictions.push_back(static_cast<double>(result.dynamic->evictions));
    dynamic.rematerializations.push_back(
        static_cast<double>(result.dynamic->rematerializations));
  }
  run.peak_bytes = std::max(run.peak_bytes, peak);
  run.activation_peak_bytes =
      std::max(run.activation_peak_bytes, result.activation_peak_bytes);
  // A total budget is checked in its own units, the others in the
  // planner's (activations + input + resident).
  if (run.choice.budget_bytes) {
    const int64_t over = run.budget.is_total()
                             ? total_peak - run.budget.budget_bytes()
                             : peak - *run.choice.budget_bytes;
    if (over > 0) {
      ++run.over_budget_steps;
      run.most_over_budget_bytes = std::max(run.most_over_budget_bytes, over);
    }
  }
}

/// Adds one baseline step's measurements to the run; `step` is its index.
void record_baseline_step(
    TrainRun& run,
    int64_t step,
    const StepResult& planned,
    const StepResult& reference) {
  run.baseline_peak_bytes = std::max(
      run.baseline_peak_bytes,
      reference.activation_peak_bytes + run.input_bytes);
  run.max_loss_difference = std::max(
      run.max_loss_difference, std::fabs(reference.loss - planned.loss));
  if (step >= kWarmupSteps || run.baseline_steps <= kWarmupSteps) {
    run.baseline_step_ms.push_back(reference.step_ms());
    run.compared_step_ms.push_back(planned.step_ms());
  }
}

/// "1.07x [1.02, 1.11] ..., slower": the paired time ratio, its interval and
/// what the interval supports.
std::string time_ratio_text(const measure::RatioInterval& ratio) {
  std::string text = fixed(ratio.median, 2) + "x";
  if (!ratio.has_interval) {
    return text + " (median of " + count(ratio.rounds, "per-step ratio") +
           ", too few for a 95% interval)";
  }
  text += " [" + fixed(ratio.low, 2) + ", " + fixed(ratio.high, 2) +
          "] (median of " + count(ratio.rounds, "per-step ratio") +
          ", 95% interval): ";
  if (!ratio.excludes_one()) {
    return text + "no difference shown";
  }
  return text + (ratio.low > 1 ? "slower" : "faster");
}

/// "0.12 -> 0.15" (milliseconds, profiled -> measured).
std::string profiled_to_measured(double profiled_ms, double measured_ms) {
  return fixed(profiled_ms, 2) + " -> " + fixed(measured_ms, 2);
}

/// One re-plan of self-correction.
void print_switch(
    const CorrectionReport::Switch& change,
    const TrainRun& run,
    std::ostream& out) {
  out << "re-plan   after " << count(change.after_steps, "step")
      << " under the plan in force, predicted on the measured times "
      << fixed(change.from_ms, 1) << " ms -> " << fixed(change.to_ms, 1)
      << " ms per step, peak " << planner::format_bytes(change.to_peak_bytes);
  if (run.choice.budget_bytes) {
    out << " (budget " << planner::format_bytes(*run.choice.budget_bytes)
        << ")";
  }
  out << "\n          from " << plan_brief(change.from) << "\n          to   "
      << plan_brief(change.to) << '\n';
}

/// What self-correction measured in its first window (`steps` steps): per
/// stage the profiled against the measured time, and, when it kept the
/// plan, the plan's predicted step time on both.
void print_correction_window(
    const CorrectionReport& report, int64_t steps, std::ostream& out) {
  out << "measured  stage times of the first " << count(steps, "step")
      << " (medians), profiled -> measured, ms:\n";
  out << "          " << std::left << std::setw(7) << "stage" << std::setw(20)
      << "forward"
      << "backward" << std::right << '\n';
  for (size_t i = 0; i < report.measured.size(); ++i) {
    out << "          " << std::left << std::setw(7) << i << std::setw(20)
        << profiled_to_measured(
               report.profiled[i].forward_ms, report.measured[i].forward_ms)
        << profiled_to_measured(
               report.profiled[i].backward_ms, report.measured[i].backward_ms)
        << std::right << '\n';
  }
  if (report.switches.empty()) {
    out << "          the plan: predicted " << fixed(report.plan_profiled_ms, 1)
        << " ms per step on the profile, " << fixed(report.plan_measured_ms, 1)
        << " ms on the measured times; no plan within the budget is "
           "predicted more than "
        << correction_threshold_text() << " faster: kept\n";
  }
}

/// Runs the steps (the first baseline_steps interleaved with the baseline),
/// printing progress when `human`.
void run_steps(
    const TrainOptions& options,
    TrainRun& run,
    Trainers& trainers,
    Workload& workload,
    const Parallel& parallel,
    bool human,
    const CommandIo& io) {
  double planned_wall_s = 0, baseline_wall_s = 0;
  const int64_t log_every = options.log_every > 0
                                ? options.log_every
                                : std::max<int64_t>(1, options.steps / 20);
  ProgressLine progress(io.out, io.live, log_every);
  std::optional<Batch> held_out;
  if (run.graph) {
    held_out = workload.held_out_batch();
    run.dice_batch = held_out->inputs.size(0);
  }
  // The model's Dice on the held-out batch after `steps` steps.
  auto score = [&](int64_t steps) {
    const double dice = models::dice_score(
        trainers.planned->predict(held_out->inputs), held_out->targets);
    run.dice.emplace_back(steps, dice);
  };
  if (held_out) {
    score(0);
  }
  // Self-correction: its first window's measurements, then every re-plan.
  bool window_shown = false;
  size_t switches_shown = 0;
  auto show_correction = [&](int64_t steps) {
    const Executor& executor = trainers.planned->executor();
    if (!human || !executor.self_correcting()) {
      return;
    }
    const std::optional<CorrectionReport> report = executor.correction_report();
    if (report->measured.empty() ||
        (window_shown && report->switches.size() == switches_shown)) {
      return;
    }
    progress.finish();
    if (!window_shown) {
      print_correction_window(*report, steps - 1, io.out);
      window_shown = true;
    }
    for (; switches_shown < report->switches.size(); ++switches_shown) {
      print_switch(report->switches[switches_shown], run, io.out);
    }
  };
  for (int64_t step = 0; step < options.steps; ++step) {
    const Batch batch = parallel.slice(workload.next_batch());
    const uint64_t seed = step_seed(options.seed, step);
    const auto batch_input_bytes = static_cast<int64_t>(batch.inputs.nbytes());
    if (run.dynamic && step > 0) {
      retune_dynamic_scope(run, batch_input_bytes, *trainers.planned);
    }
    measure::Timer step_timer;
    const StepResult result = trainers.planned->step(batch, seed);
    planned_wall_s += seconds_since(step_timer);
    record_step(run, result);
    if (!std::isfinite(result.loss)) {
      // Every later step would be NaN too: stop, and do not exit 0.
      std::ostringstream message;
      message << "step " << step + 1 << ": the loss is " << result.loss
              << ": training diverged (try a smaller --lr, now " << options.lr
              << ")";
      throw UsageError(message.str());
    }
    if (run.dynamic) {
      observe_dynamic_step(run, result, batch_input_bytes);
    }
    if (step < run.baseline_steps) {
      step_timer.restart();
      const StepResult reference = trainers.baseline->step(batch, seed);
      baseline_wall_s += seconds_since(step_timer);
      record_baseline_step(run, step, result, reference);
    }
    const bool last = step + 1 == options.steps;
    // As the plain progress lines: the first, every log_every-th, the last.
    if (held_out && (step == 0 || (step + 1) % log_every == 0 || last)) {
      score(step + 1);
    }
    if (!human) {
      continue;
    }
    const double per_step = planned_wall_s / static_cast<double>(step + 1);
    const double per_baseline =
        step < run.baseline_steps
            ? baseline_wall_s / static_cast<double>(step + 1)
            : 0;
    const double left =
        per_step * static_cast<double>(options.steps - step - 1) +
        per_baseline * static_cast<double>(
                           std::max<int64_t>(0, run.baseline_steps - step - 1));
    std::ostringstream line;
    line << "step " << step + 1 << "/" << options.steps << "  loss "
         << fixed(result.loss, 4);
    if (held_out) {
      line << "  dice " << fixed(run.dice.back().second, 3);
    }
    line << "  step " << fixed(result.step_ms(), 0) << " ms  peak "
         << planner::format_bytes(
                result.activation_peak_bytes + run.input_bytes +
                run.resident_bytes);
    if (run.choice.budget_bytes) {
      line << " / budget " << planner::format_bytes(*run.choice.budget_bytes);
    }
    line << "  left " << format_duration(left);
    progress.update(line.str(), last);
    show_correction(step + 1);
  }
  progress.finish();
}

/// The planned run's plan, trainers and the model to --save, for a chain
/// model (--recompute and data parallel included); prints the plan.
Trainers prepare_chain_training(
    const TrainOptions& options,
    TrainRun& run,
    Workload& workload,
    Parallel& parallel,
    bool recipe,
    const CommandIo& io,
    std::shared_ptr<torch::nn::Module>& saved) {
  // The model and its loss, planned as one chain (workload.h).
  torch::nn::Sequential model = workload.training_model();
#if REMAT_WITH_DISTRIBUTED
  if (parallel.group) {
    agree_on_model(options, run.model, model, *parallel.group);
  }
#endif
  const Batch probe = parallel.slice(workload.next_batch());
  set_targets(model, probe);
  check_trainable(
      run.strategy,
      parse_mode(options.mode),
      static_cast<int64_t>(model->size()),
      probe.inputs);
  for (const auto& parameter : model->parameters()) {
    run.parameter_bytes += static_cast<int64_t>(parameter.nbytes());
  }
  const planner::Chain chain =
      profile_training_chain(options, run, model, probe, parallel);
  run.input_bytes = chain.input_bytes();
  run.resident_bytes = chain.resident_bytes();
  run.predicted_state = chain.model_state();
  run.choice = plan_training(options, run, chain, recipe, parallel);
  if (run.dynamic) {
    run.dynamic = dynamic_scope(run.input_bytes, run.choice);
  }
  run.self_correct = !options.fixed_plan && !recipe && !run.dynamic &&
                     !parallel.joined() &&
                     run.strategy.kind == planner::Strategy::Kind::kOptimal;
  if (!options.json) {
    print_plan(options, run, recipe, io.out);
  }
  Trainers trainers =
      make_trainers(options, run, chain, model, recipe, parallel);
#if REMAT_WITH_DISTRIBUTED
  if (!options.json && parallel.group) {
    print_parallel(options, chain, parallel, io.out);
  }
#endif
  saved = model.ptr();
  return trainers;
}

/// The same for a graph model (workload.h): its graph profiled, the plan
/// of the graph strategy, the trainers.
Trainers prepare_graph_training(
    const TrainOptions& options,
    TrainRun& run,
    Workload& workload,
    const CommandIo& io,
    std::shared_ptr<torch::nn::Module>& saved) {
  // --recompute dynamic: the stages run plainly inside the scope.
  const GraphStrategy strategy =
      run.dynamic ? GraphStrategy::kNone
                  : parse_graph_strategy(options.budget.strategy);
  run.strategy_name = to_string(strategy);
  run.self_correct = !options.fixed_plan && strategy == GraphStrategy::kOptimal;
  const TrainingGraph& model = workload.training_graph();
  const Batch probe = workload.next_batch();
  for (const auto& parameter : model.unet->parameters()) {
    run.parameter_bytes += static_cast<int64_t>(parameter.nbytes());
  }
  const planner::Graph graph = profile_training_graph(
      model,
      probe,
      run.precision,
      ProfileOptions().optimizer_state_ratio(
          OptimizerChoice{options.optimizer, options.lr}.state_ratio()));
  run.input_bytes = graph.input_bytes();
  run.predicted_state = graph.model_state();
  if (run.dynamic) {
    run.choice = choose_graph_plan(
        graph,
        strategy,
        model.encoder_stages,
        Budget::none(),
        BudgetOrigin::kDefault);
    run.choice.budget_bytes = run.budget.resolve_bytes(graph);
    run.choice.budget_text = run.budget.to_string();
    run.dynamic = dynamic_scope(run.input_bytes, run.choice);
  } else {
    run.choice = choose_graph_plan(
        graph,
        strategy,
        model.encoder_stages,
        run.budget,
        options.budget.origin(),
        options.budget.solver());
  }
  if (!options.json) {
    print_plan(options, run, /*recipe=*/false, io.out);
  }
  saved = model.unet.ptr();
  return make_graph_trainers(options, run, graph, model, strategy);
}

/// The flag checks of measure_training, which run_train also makes before
/// it launches workers (so that a refusal comes once, before any process).
void check_training_flags(const TrainOptions& options) {
  const bool dynamic = options.recompute == "dynamic";
  check_recompute_flags(options, options.recompute != "optimal" && !dynamic);
  if (is_graph_model(options.model.model)) {
    check_graph_flags(options);
  }
}

TrainRun measure_training(
    const TrainOptions& options, Parallel& parallel, const CommandIo& io) {
  const bool human = !options.json;
  const measure::Timer run_timer;
  const bool dynamic = options.recompute == "dynamic";
  const bool recipe = options.recompute != "optimal" && !dynamic;
  check_training_flags(options);
  TrainRun run;
  run.recompute = options.recompute;
  if (dynamic) {
    run.dynamic.emplace();  // its scope budget once the model is profiled
  }
  run.compress = options.compress;
  run.optimizer = options.optimizer;
  run.precision = cpu_precision(options.precision);
  run.graph = is_graph_model(options.model.model);
  if (!run.graph) {
    if (options.budget.strategy == "per-block" ||
        options.budget.strategy == "encoder") {
      throw UsageError(
          "--strategy " + options.budget.strategy +
          ": a U-Net's strategy (--model unet2d or unet3d), got --model " +
          options.model.model +
          "; a chain checkpoints every block with uniform:K (K = its stages)");
    }
    run.strategy = planner::Strategy::parse(
        recipe || dynamic ? std::string("none") : options.budget.strategy);
    run.strategy_name = run.strategy.to_string();
  }
  run.budget = Budget::parse(options.budget.budget);
  run.steps = options.steps;
  run.sharded = options.shard;

  Workload workload(options.model, options.seed);
  run.model = workload.description();
  if (human) {
    io.out << "model     " << run.model << '\n';
    io.out << "precision " << precision_name(run.precision)
           << (run.precision == Precision::kFloat32
                   ? std::string("\n")
                   : " (CPU autocast; parameters and optimizer fp32)\n");
  }
  const bool with_baseline =
      !options.no_baseline && options.baseline_steps > 0 && !parallel.joined();
  run.baseline_steps =
      with_baseline ? std::min(options.baseline_steps, options.steps) : 0;
  std::shared_ptr<torch::nn::Module> saved;  // what --save writes
  Trainers trainers =
      run.graph ? prepare_graph_training(options, run, workload, io, saved)
                : prepare_chain_training(
                      options, run, workload, parallel, recipe, io, saved);
  if (human) {
    io.out << "executor  " << trainers.planned->executor().description()
           << (dynamic ? " inside a DynamicRemat scope" : "") << "; "
           << options.steps << " steps";
    if (with_baseline) {
      io.out << ", the first " << run.baseline_steps
             << " interleaved with a no-checkpoint copy";
    }
    io.out << '\n';
  }
  run_steps(options, run, trainers, workload, parallel, human, io);
  run.seconds = seconds_since(run_timer);
  run.predicted_peak_bytes = run.choice.simulation.peak_bytes;
  run.correction = trainers.planned->executor().correction_report();
  if (run.correction) {
    for (const CorrectionReport::Switch& change : run.correction->switches) {
      run.predicted_peak_bytes =
          std::max(run.predicted_peak_bytes, change.to_peak_bytes);
    }
  }
  if (!options.save.empty()) {
    // Sharded: every rank gathers the parameters, rank 0 writes them.
    trainers.planned->with_full_parameters([&] {
      if (parallel.rank == 0) {
        save_parameters(*saved, options.save);
      }
    });
  }
  return run;
}

TrainSummary summarize(const TrainRun& run) {
  TrainSummary summary;
  // Two windows that never overlap (a short run's first and last halves);
  // one step has none, and its loss is both means.
  summary.window = std::min<size_t>(kLossWindow, run.losses.size() / 2);
  const size_t window = std::max<size_t>(summary.window, 1);
  summary.first_loss_mean = mean(run.losses, 0, window);
  summary.last_loss_mean =
      mean(run.losses, run.losses.size() - window, run.losses.size());
  summary.step_ms_median = planner::median(run.step_ms);
  if (run.baseline_steps > 0) {
    summary.baseline_step_ms_median = planner::median(run.baseline_step_ms);
    summary.compared_step_ms_median = planner::median(run.compared_step_ms);
    summary.memory_ratio =
        static_cast<double>(run.peak_bytes) /
        static_cast<double>(std::max<int64_t>(1, run.baseline_peak_bytes));
    summary.time_ratio =
        measure::paired_ratio(run.compared_step_ms, run.baseline_step_ms);
  }
  return summary;
}

void render_json(
    const TrainRun& run, const TrainSummary& summary, std::ostream& out) {
  const PlanChoice& choice = run.choice;
  nlohmann::json report;
  report["model"] = run.model;
  report["recompute"] = run.recompute;
  report["compress"] = run.compress;
  report["precision"] = precision_name(run.precision);
  report["strategy"] = run.strategy_name;
  report["budget"] = choice.budget_text;
  report["budget_bytes"] = choice.budget_bytes
                               ? nlohmann::json(*choice.budget_bytes)
                               : nlohmann::json(nullptr);
  report["plan"] = choice.plan.to_string();
  report["self_correct"] = run.self_correct;
  if (run.correction) {
    // The plan at the end, every re-plan, and the last window's stage
    // times against the profile's (milliseconds).
    const CorrectionReport& correction = *run.correction;
    report["final_plan"] = correction.plan.to_string();
    nlohmann::json switches = nlohmann::json::array();
    for (const CorrectionReport::Switch& change : correction.switches) {
      switches.push_back(
          {{"after_steps", change.after_steps},
           {"from", change.from.to_string()},
           {"to", change.to.to_string()},
           {"from_ms", change.from_ms},
           {"to_ms", change.to_ms},
           {"to_peak_bytes", change.to_peak_bytes}});
    }
    report["corrections"] = switches;
    nlohmann::json stages = nlohmann::json::array();
    for (size_t i = 0; i < correction.measured.size(); ++i) {
      stages.push_back(
          {{"stage", i},
           {"profiled_forward_ms", correction.profiled[i].forward_ms},
           {"measured_forward_ms", correction.measured[i].forward_ms},
           {"profiled_backward_ms", correction.profiled[i].backward_ms},
           {"measured_backward_ms", correction.measured[i].backward_ms}});
    }
    report["stage_times"] = stages;
  }
  report["predicted_peak_bytes"] = run.predicted_peak_bytes;
  if (run.dynamic) {
    // The scope's budget at the first and after the last step, the
    // highest tracked peak, and per step evictions and re-runs (medians).
    const TrainRun::Dynamic& dynamic = *run.dynamic;
    report["dynamic"] = {
        {"first_scope_budget_bytes", dynamic.first_scope_budget_bytes},
        {"scope_budget_bytes", dynamic.scope_budget_bytes},
        {"overhead_bytes", dynamic.overhead_bytes},
        {"tracked_peak_bytes", dynamic.tracked_peak_bytes},
        {"largest_call_bytes", dynamic.largest_call_bytes},
        {"recorded_calls_per_step_median",
         planner::median(dynamic.recorded_calls)},
        {"evictions_per_step_median", planner::median(dynamic.evictions)},
        {"rematerializations_per_step_median",
         planner::median(dynamic.rematerializations)}};
  }
  report["input_bytes"] = run.input_bytes;
  report["steps"] = run.steps;
  report["first_loss"] = run.losses.front();
  report["last_loss"] = run.losses.back();
  report["first_loss_mean"] = summary.first_loss_mean;
  report["last_loss_mean"] = summary.last_loss_mean;
  report["peak_bytes"] = run.peak_bytes;
  report["activation_peak_bytes"] = run.activation_peak_bytes;
  report["sharded"] = run.sharded;
  report["parameter_bytes"] = run.parameter_bytes;
  report["parameter_state_bytes"] = run.parameter_state_bytes;
  report["peak_with_parameters_bytes"] = run.peak_with_parameters_bytes;
  report["optimizer"] = run.optimizer;
  report["optimizer_state_bytes"] = run.optimizer_state_bytes;
  report["optimizer_state_after_update_bytes"] =
      run.optimizer_state_after_bytes;
  report["total_peak_bytes"] = run.total_peak_bytes;
  report["predicted_model_state"] = {
      {"parameter_bytes", run.predicted_state.parameter_bytes},
      {"gradient_bytes", run.predicted_state.gradient_bytes},
      {"optimizer_bytes", run.predicted_state.optimizer_bytes}};
  report["budget_total"] = run.budget.is_total();
  report["no_checkpoint_peak_bytes"] = choice.store_all_peak_bytes;
  report["over_budget_steps"] = run.over_budget_steps;
  report["most_over_budget_bytes"] = run.most_over_budget_bytes;
  report["step_ms_median"] = summary.step_ms_median;
  if (!run.dice.empty()) {
    // Graph models: the Dice on the held-out batch, by step (0: untrained).
    nlohmann::json dice = nlohmann::json::array();
    for (const auto& [step, value] : run.dice) {
      dice.push_back({{"step", step}, {"dice", value}});
    }
    report["dice"] = dice;
    report["dice_batch"] = run.dice_batch;
  }
  report["seconds"] = run.seconds;
  if (run.baseline_steps > 0) {
    report["baseline"] = {
        {"steps", run.baseline_steps},
        {"peak_bytes", run.baseline_peak_bytes},
        {"activation_peak_bytes", run.baseline_peak_bytes - run.input_bytes},
        {"step_ms_median", summary.baseline_step_ms_median},
        {"planned_step_ms_median", summary.compared_step_ms_median},
        {"memory_ratio", summary.memory_ratio},
        {"time_ratio", summary.time_ratio.median},
        {"time_ratio_rounds", summary.time_ratio.rounds},
        {"time_ratio_interval",
         summary.time_ratio.has_interval
             ? nlohmann::json::array(
                   {summary.time_ratio.low, summary.time_ratio.high})
             : nlohmann::json(nullptr)},
        {"max_loss_difference", run.max_loss_difference}};
  }
  out << report_text(report) << '\n';
}

/// "= predicted to the byte", or the difference in bytes.
std::string against_prediction(int64_t measured, int64_t predicted) {
  if (measured == predicted) {
    return "= predicted to the byte";
  }
  const int64_t difference = measured - predicted;
  return "predicted " + planner::format_bytes(predicted) + ", measured " +
         std::to_string(difference > 0 ? difference : -difference) +
         (difference > 0 ? " bytes more" : " bytes fewer");
}

/// The summary's memory lines: the peak in the budget's units against the
/// prediction and the budget, then the whole step's memory by kind.
void render_memory(const TrainRun& run, std::ostream& out) {
  using planner::format_bytes;
  const PlanChoice& choice = run.choice;
  const bool predicted = run.recompute == "optimal";
  out << "  peak            " << format_bytes(run.peak_bytes)
      << (run.sharded ? " max (activations + input + resident shards)"
                      : " max (activations + input)");
  if (predicted) {
    out << ", " << against_prediction(run.peak_bytes, run.predicted_peak_bytes);
  }
  out << '\n';
  if (choice.budget_bytes) {
    const bool total = run.budget.is_total();
    out << "  budget          "
        << format_bytes(
               total ? run.budget.budget_bytes() : *choice.budget_bytes)
        << (total ? " (whole step) " : " ")
        << (run.over_budget_steps == 0
                ? std::string("kept on every step")
                : "EXCEEDED on " + count(run.over_budget_steps, "step") +
                      ", by up to " + count(run.most_over_budget_bytes, "byte"))
        << '\n';
  }
  const planner::ModelState& state = run.predicted_state;
  const bool state_predicted = !run.sharded;
  auto row = [&out](const std::string& label, int64_t bytes) -> std::ostream& {
    return out << "    " << std::left << std::setw(32) << label << std::right
               << std::setw(10) << format_bytes(bytes);
  };
  out << "  memory of a step, measured (highest over the steps):\n";
  row("parameters, buffers, gradients", run.parameter_state_bytes)
      << (run.sharded ? "  (this rank's shards)" : "");
  if (state_predicted) {
    out << "  ("
        << against_prediction(
               run.parameter_state_bytes,
               state.parameter_bytes + state.gradient_bytes)
        << ")";
  }
  out << '\n';
  // No step held the state through its forward and backward when the only
  // update ran last (one step): show what that update created instead.
  const bool state_after_update =
      run.optimizer_state_bytes == 0 && run.optimizer_state_after_bytes > 0;
  const int64_t optimizer_bytes = state_after_update
                                      ? run.optimizer_state_after_bytes
                                      : run.optimizer_state_bytes;
  row("optimizer state (" + run.optimizer + ")", optimizer_bytes);
  if (state_predicted) {
    out << "  (" << against_prediction(optimizer_bytes, state.optimizer_bytes)
        << ")";
  }
  if (state_after_update) {
    out << "  created by the update, after the step; not in the total";
  }
  out << '\n';
  row("activations + input", run.activation_peak_bytes + run.input_bytes)
      << '\n';
  row("total", run.total_peak_bytes)
      << "  (model " << format_bytes(run.parameter_bytes)
      << " of parameters)\n";
}

void render_text(
    const TrainRun& run, const TrainSummary& summary, std::ostream& out) {
  using planner::format_bytes;
  out << "summary   " << run.steps << " steps in "
      << format_duration(run.seconds) << ", " << precision_name(run.precision)
      << '\n';
  out << "  loss            first " << fixed(run.losses.front(), 4)
      << " -> last " << fixed(run.losses.back(), 4);
  if (summary.window > 0) {
    out << "  (mean of first/last " << summary.window << ": "
        << fixed(summary.first_loss_mean, 4) << " -> "
        << fixed(summary.last_loss_mean, 4) << ")";
  }
  out << '\n';
  if (!run.dice.empty()) {
    out << "  dice            " << fixed(run.dice.front().second, 3)
        << " untrained -> " << fixed(run.dice.back().second, 3) << " after "
        << count(run.steps, "step")
        << "  (foreground Dice on a held-out batch of " << run.dice_batch
        << ")\n";
  }
  if (run.correction) {
    const size_t switches = run.correction->switches.size();
    out << "  plan            self-correcting, "
        << (switches == 0
                ? std::string("kept the plan chosen before training")
                : "re-planned " + count(switches, "time") + "; at the end " +
                      plan_brief(run.correction->plan, 48))
        << '\n';
  }
  render_memory(run, out);
  if (run.dynamic) {
    const TrainRun::Dynamic& dynamic = *run.dynamic;
    out << "  dynamic         scope budget "
        << format_bytes(dynamic.first_scope_budget_bytes) << " -> "
        << format_bytes(dynamic.scope_budget_bytes) << ", tracked peak "
        << format_bytes(dynamic.tracked_peak_bytes) << "; per step (medians) "
        << fixed(planner::median(dynamic.evictions), 0) << " evictions, "
        << fixed(planner::median(dynamic.rematerializations), 0)
        << " re-runs of " << fixed(planner::median(dynamic.recorded_calls), 0)
        << " recorded calls\n";
  }
  if (run.baseline_steps == 0) {
    out << "  step time       " << fixed(summary.step_ms_median, 1)
        << " ms median (no baseline run)\n";
    return;
  }
  out << "  vs no checkpointing (" << run.baseline_steps
      << " interleaved steps):\n";
  out << "    memory  " << format_bytes(run.peak_bytes) << " vs "
      << format_bytes(run.baseline_peak_bytes) << " = "
      << fixed(summary.memory_ratio, 2) << "x\n";
  out << "    time    " << fixed(summary.compared_step_ms_median, 1)
      << " ms vs " << fixed(summary.baseline_step_ms_median, 1)
      << " ms per step (medians)\n";
  out << "    ratio   " << time_ratio_text(summary.time_ratio) << '\n';
  out << "    losses  "
      << (run.max_loss_difference == 0
              ? std::string("identical on every compared step")
              : "differ by up to " + std::to_string(run.max_loss_difference))
      << '\n';
}

}  // namespace

void run_train(const TrainOptions& options, const CommandIo& io) {
  check_training_flags(options);
  check_save_path(options.save);
  if (options.nproc > 0) {
#if !REMAT_WITH_DISTRIBUTED
    throw_without_distributed("--nproc");
#else
    if (options.rank >= 0 || options.world_size > 0) {
      throw UsageError(
          "--nproc: launches local workers; --rank and --world-size are for "
          "one worker of a multi-machine job, got both");
    }
    if (options.model.batch % options.nproc != 0) {
      throw UsageError(
          "--batch: the global batch must divide by --nproc " +
          std::to_string(options.nproc) + ", got " +
          std::to_string(options.model.batch));
    }
    const distributed::LaunchResult result = distributed::launch_local(
        distributed::LocalLaunchOptions()
            .nproc(options.nproc)
            .arguments(worker_arguments(options.arguments)));
    if (result.exit_code != 0 && result.failed_rank < 0) {
      throw LauncherStoppedError(result.message, result.exit_code);
    }
    if (result.exit_code != 0) {
      throw WorkerFailedError(
          "worker " + result.message + " (the others were stopped)",
          result.exit_code);
    }
    return;
#endif
  }
  apply_threads(options.threads);
  if (options.steps < 1) {
    throw UsageError(
        "--steps: expected a positive integer, got " +
        std::to_string(options.steps));
  }
  Parallel parallel = join_group(options);
  // Only rank 0 prints; errors still reach run_cli from every rank.
  std::ostream silent(nullptr);
  const CommandIo quiet{silent, silent, false};
  const CommandIo& shown = parallel.rank == 0 ? io : quiet;
  const TrainRun run = measure_training(options, parallel, shown);
  const TrainSummary summary = summarize(run);
  if (options.json) {
    render_json(run, summary, shown.out);
  } else {
    render_text(run, summary, shown.out);
  }
  if (run.choice.budget_bytes && run.over_budget_steps > 0) {
    const bool total = run.budget.is_total();
    const int64_t peak = total ? run.total_peak_bytes : run.peak_bytes;
    const int64_t budget =
        total ? run.budget.budget_bytes() : *run.choice.budget_bytes;
    shown.err << "warning: the measured peak " << peak << " bytes ("
              << planner::format_bytes(peak) << ", "
              << (total ? "the whole step" : "activations + input")
              << ") exceeded the budget " << budget << " bytes ("
              << planner::format_bytes(budget) << ") on "
              << run.over_budget_steps << " of " << count(run.steps, "step")
              << ", by up to " << count(run.most_over_budget_bytes, "byte")
              << '\n';
  }
}

}  // namespace remat::cli
