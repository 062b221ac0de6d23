// commands.h: the remat subcommands as library functions.
//
// Each command is a pair: add_<name>_command() registers the subcommand and
// its flags on a CLI11 app, binding them to an options struct; run_<name>()
// does the work given parsed options. run_* never exit and never print
// errors: they throw UsageError (exit 1), InfeasibleBudgetError (exit 2) or
// let library errors through (exit 1); run_cli() in app.h maps them.
// Normal output goes to io.out; warnings to io.err.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <variant>
#include <vector>

#include <c10/util/Exception.h>
#include <remat/budget.h>
#include <remat/planner.h>
#include <remat/policy.h>
#include <remat/precision.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json_fwd.hpp>

#include "strategy.h"
#include "workload.h"

namespace remat::cli {

/// Where a command writes, and whether progress may update in place.
struct CommandIo {
  std::ostream& out;
  std::ostream& err;
  /// Progress lines update in place (stdout is a terminal).
  bool live = false;
};

/// Flags shared by the commands that solve for a budget.
struct BudgetFlags {
  std::string budget = "50%";
  /// Whether --budget was given (a given budget binds fixed strategies).
  bool budget_given = false;
  /// How the budget binds (remat/plan_choice.h).
  BudgetOrigin origin() const {
    return budget_given ? BudgetOrigin::kGiven : BudgetOrigin::kDefault;
  }
  std::string strategy = "optimal";
  int64_t slots = planner::SolverOptions{}.memory_slots;
  /// --search-work: how long the graph solvers may search.
  int64_t search_work = planner::SolverOptions{}.graph_search_work;
  /// The solver options of --slots and --search-work.
  planner::SolverOptions solver() const {
    planner::SolverOptions options;
    options.memory_slots = slots;
    options.graph_search_work = search_work;
    return options;
  }
};

// ---- remat train
struct TrainOptions {
  ModelFlags model;
  BudgetFlags budget;
  int64_t steps = 250;
  double lr = 3e-3;
  /// adamw | sgd.
  std::string optimizer = "adamw";
  uint64_t seed = 0;
  int64_t threads = 2;
  std::string mode = "nonreentrant";
  /// none | full | attention | selective: the GPT's own recipe
  /// (models::GptRecompute), no plan; optimal: the plan of --strategy and
  /// --budget; dynamic: no plan, the model run plainly inside a
  /// DynamicRemat scope within --budget (any model).
  std::string recompute = "optimal";
  /// none | bf16 | fp16 | int8: saved activations stored compressed (lossy).
  std::string compress = "none";
  /// fp32 | bf16: the precision of profiling and of every step (baseline
  /// included); bf16 runs them under CPU autocast.
  std::string precision = "fp32";
  /// Profile each stage also run selectively, so the optimal plan may
  /// choose it (--selective).
  bool selective = false;
  bool no_baseline = false;
  /// Keep the plan chosen before training (--fixed-plan); otherwise an
  /// optimal plan corrects itself on measured stage times.
  bool fixed_plan = false;
  /// No-checkpoint steps interleaved with the first planned steps.
  int64_t baseline_steps = 20;
  /// Plain-mode progress: print every this many steps (0: steps / 20).
  int64_t log_every = 0;
  bool json = false;
  // Data-parallel training (docs/distributed.md). --batch is the global
  // batch; each rank trains on its slice.
  /// Launch this many local workers of the same command (0: none).
  int64_t nproc = 0;
  /// This process's rank in a multi-machine job (-1: not given; then the
  /// environment of torchrun or --nproc, if any, names the group).
  int64_t rank = -1;
  /// Ranks of the job (with --rank).
  int64_t world_size = 0;
  std::string master_addr = "127.0.0.1";
  int64_t master_port = 29500;
  /// Limit for joining the group and for every collective, in seconds.
  double timeout_s = 60;
  /// Write the trained parameters here with torch::save (rank 0 only).
  std::string save;
  /// Sharded training (distributed::ShardedStages): each rank keeps a shard
  /// of every stage's parameters, gradients and AdamW state.
  bool shard = false;
  /// The command line, argv[0] included, that --nproc relaunches (without
  /// --nproc). Set by run_cli.
  std::vector<std::string> arguments;
};
CLI::App* add_train_command(CLI::App& app, TrainOptions& options);
void run_train(const TrainOptions& options, const CommandIo& io);

// ---- remat profile
struct ProfileCommandOptions {
  ModelFlags model;
  /// Chain JSON file to write; empty: none.
  std::string out;
  /// Print the chain JSON instead of the readable report.
  bool json = false;
  /// adamw | sgd: the optimizer whose state the model state counts.
  std::string optimizer = "adamw";
  int64_t warmup = 1;
  int64_t repeats = 3;
  /// fp32 | bf16: the precision the chain is measured in.
  std::string precision = "fp32";
  /// Also measure each stage run selectively (--selective).
  bool selective = false;
  uint64_t seed = 0;
  int64_t threads = 2;
};
CLI::App* add_profile_command(CLI::App& app, ProfileCommandOptions& options);
void run_profile(const ProfileCommandOptions& options, const CommandIo& io);

// ---- remat fit
struct FitCommandOptions {
  ModelFlags model;
  /// The cap: bytes ("64MiB", activations + input) or a total
  /// ("total:1GiB", the whole step).
  std::string cap;
  /// With a total cap: adamw | sgd, whose state the cap includes.
  std::string optimizer = "adamw";
  /// batch | seq-len | image: what is fitted (seq-len: --model gpt only,
  /// image: unet2d and unet3d only, both at the fixed --batch).
  std::string over = "batch";
  int64_t probe_batch = 4;
  int64_t max_batch = 4096;
  int64_t probe_seq_len = 16;
  int64_t max_seq_len = 512;
  /// --over image: the largest image (volume) edge considered; 0: 512 in
  /// 2D, 128 in 3D.
  int64_t max_image = 0;
  double max_time_ratio = 0;
  uint64_t seed = 0;
  int64_t threads = 2;
  bool json = false;
};
CLI::App* add_fit_command(CLI::App& app, FitCommandOptions& options);
void run_fit(const FitCommandOptions& options, const CommandIo& io);

// ---- remat plan
struct PlanOptions {
  std::string chain_path;
  BudgetFlags budget;
  bool json = false;
  /// Also write the plan alone (planner JSON) to this file.
  std::string plan_out;
};
CLI::App* add_plan_command(CLI::App& app, PlanOptions& options);
void run_plan(const PlanOptions& options, const CommandIo& io);

// ---- remat explain
struct ExplainOptions {
  /// A chain JSON; empty: profile the model given by `model`.
  std::string chain_path;
  ModelFlags model;
  BudgetFlags budget;
  /// Folder for the memory-over-step plot and its data; empty: no plot.
  std::string out = "remat-explain";
  /// fp32 | bf16: the precision the model is profiled in (not --chain).
  std::string precision = "fp32";
  /// Profile each stage also run selectively (--selective; not --chain).
  bool selective = false;
  /// Plan one rank of sharded training over this many ranks (0: not
  /// sharded; not --chain): --batch is then the global batch.
  int64_t shard = 0;
  bool json = false;
  uint64_t seed = 0;
  int64_t threads = 2;
};
CLI::App* add_explain_command(CLI::App& app, ExplainOptions& options);
void run_explain(const ExplainOptions& options, const CommandIo& io);

// ---- remat bench
struct BenchOptions {
  ModelFlags model;
  std::vector<std::string> budgets = {"25%", "50%", "75%", "100%"};
  /// A chain's; a U-Net's (a graph) are optimal, per-block, encoder and none.
  std::vector<std::string> strategies = {
      "optimal", "chen", "sqrt", "uniform:2", "none"};
  /// Whether --strategies was given (else a U-Net takes its own).
  bool strategies_given = false;
  int64_t warmup = 2;
  int64_t repeats = 10;  // 6 or more give the ratios a 95 % interval
  std::string out = "remat-bench";
  std::string mode = "nonreentrant";
  /// Whether --mode was given (a U-Net refuses it).
  bool mode_given = false;
  int64_t slots = planner::SolverOptions{}.memory_slots;
  int64_t search_work = planner::SolverOptions{}.graph_search_work;
  uint64_t seed = 0;
  int64_t threads = 2;
  bool json = false;
};
CLI::App* add_bench_command(CLI::App& app, BenchOptions& options);
void run_bench(const BenchOptions& options, const CommandIo& io);

// ---- helpers shared by the commands (common.cpp)

/// Registers --budget, --strategy, --slots and --search-work on `command`
/// (validated with Budget::parse / planner::Strategy::parse and ranges, so a
/// bad value fails parsing with exit 1).
void add_budget_flags(CLI::App& command, BudgetFlags& flags);

/// Registers --search-work (planner::SolverOptions::graph_search_work).
void add_search_work_flag(CLI::App& command, int64_t& search_work);

/// Registers --threads and --seed.
void add_run_flags(CLI::App& command, int64_t& threads, uint64_t& seed);

/// Registers --precision (fp32, bf16 or fp16; validated with
/// parse_precision, so any other value fails parsing with exit 1).
void add_precision_flag(CLI::App& command, std::string& precision);

/// Registers --selective: profile every stage also run as a selective
/// checkpoint under policies::save_compute_intensive(), so that the optimal
/// plan may keep a stage's matmul outputs and recompute the rest.
void add_selective_flag(CLI::App& command, bool& selective);

/// The policy of --selective: save_compute_intensive() if given, else empty.
Policy selective_policy(bool selective);

/// The --precision of a command that runs on CPU. Throws UsageError naming
/// the value for fp16 (autocast in fp16 is CUDA only) or an unknown value.
Precision cpu_precision(const std::string& text);

/// A CLI11 validator running `parse`, which throws std::invalid_argument or
/// c10::Error for a bad value; the error's message becomes the validator's.
template <typename Parse>
CLI::Validator parsing_validator(Parse parse, const std::string& name) {
  return CLI::Validator(
      [parse](std::string& value) -> std::string {
        try {
          parse(value);
          return "";
        } catch (const c10::Error& error) {
          return error.what_without_backtrace();
        } catch (const std::invalid_argument& error) {
          return error.what();
        }
      },
      name);
}

/// A CLI11 validator refusing a number that is not finite (nan, inf): the
/// range checks of CLI11 let a NaN through, since it compares false.
CLI::Validator finite_number();

/// Applies --threads. Throws UsageError unless threads >= 1.
void apply_threads(int64_t threads);

/// The whole text of the regular file `path`. Throws UsageError naming
/// `flag` if it cannot be opened, is a directory or is not a regular file
/// (a FIFO, a device: reading one could block forever).
std::string read_regular_file(const std::string& flag, const std::string& path);

/// What plan and explain solve: the stage costs of a chain or of a graph (a
/// JSON file from `remat profile`, or a built-in model profiled).
using StageCosts = std::variant<planner::Chain, planner::Graph>;

/// Reads a chain JSON or a graph JSON file (a graph's stages say what they
/// read: "inputs"). Throws UsageError naming `flag`, the path and the reason
/// for a missing, unreadable or irregular file or malformed JSON.
StageCosts read_costs_file(const std::string& flag, const std::string& path);

/// "chain" or "graph", as reports name the costs.
std::string kind_of(const StageCosts& costs);

/// The plan of --strategy and --budget for `costs`: choose_plan on a chain
/// (planner::Strategy::parse(flags.strategy)); on a graph, choose_graph_plan
/// with parse_graph_strategy(flags.strategy), whose encoder strategy needs
/// the model's `encoder_stages` (0 for a graph read from a file: then
/// UsageError). Throws UsageError for a strategy the costs do not take, and
/// as choose_plan.
PlanChoice choose_plan_for(
    const StageCosts& costs, const BudgetFlags& flags, int64_t encoder_stages);

/// --strategy as reports name it ("uniform:4", "per-block"). Throws as
/// choose_plan_for for a strategy the costs do not take.
std::string strategy_name(const StageCosts& costs, const BudgetFlags& flags);

/// Writes `text` to `path`, creating parent folders. Throws UsageError
/// naming `flag` and the path on failure.
void write_text_file(
    const std::string& flag, const std::string& path, const std::string& text);

/// A --json report as the tool prints it: indented by 2, any byte that is
/// not UTF-8 (a file name's) replaced, so that printing it never throws.
std::string report_text(const nlohmann::json& report);

/// Creates folder `path` (and parents). Throws UsageError naming `flag`.
void make_folder(const std::string& flag, const std::string& path);
/// Refuses, before any work, an output file `path` that write_text_file
/// could not write: its folder is made and must be writable, and `path`
/// must not be a folder. Throws UsageError naming `flag` and `path`.
void check_output_file(const std::string& flag, const std::string& path);

}  // namespace remat::cli
