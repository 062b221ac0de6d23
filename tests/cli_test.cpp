// Tests of the remat command-line tool: the reusable parsing (budget,
// strategy), plan choice and progress line as library functions; run_cli()
// in-process; and the built binary as a real process (exit codes, stdout
// JSON, stderr messages), every subcommand on a tiny model. Kept fast: the
// models are a few thousand parameters and runs are a few steps. Data
// parallel: `--nproc 2` against `--nproc 1` on the same global batch (the
// saved parameters compared), and a worker killed mid-run.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <remat/config.h>
#if REMAT_WITH_DISTRIBUTED
#include <remat/distributed.h>
#endif
#include <remat/planner.h>
#include <torch/serialize.h>
#include <nlohmann/json.hpp>

#include <remat/budget.h>
#include "app.h"
#include "cli_error.h"
#include "commands.h"
#include "gnuplot.h"
#include "progress.h"
#include "strategy.h"
#include "test_util.h"

#ifndef REMAT_CLI_PATH
#error "REMAT_CLI_PATH must name the built remat binary"
#endif

namespace {

namespace fs = std::filesystem;
using remat::Budget;
using remat::cli::BudgetOrigin;
using remat::planner::Strategy;

// ---------------------------------------------------------------- fixtures

// A fresh folder per test binary run.
const fs::path& scratch() {
  static const fs::path folder = [] {
    fs::path path = fs::temp_directory_path() /
                    ("remat_cli_test_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
    return path;
  }();
  return folder;
}

// Removes the scratch folder after the last test.
class ScratchCleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code error;
    fs::remove_all(scratch(), error);
  }
};
::testing::Environment* const scratch_cleanup =
    ::testing::AddGlobalTestEnvironment(new ScratchCleanup);

std::string read_file(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream file(path, std::ios::binary);
  file << text;
}

using remat::testing::sample_chain;

fs::path sample_chain_file() {
  const fs::path path = scratch() / "sample_chain.json";
  if (!fs::exists(path)) {
    write_file(path, remat::planner::to_json(sample_chain()));
  }
  return path;
}

struct ProcessResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs the built binary with `arguments` (shell syntax), capturing both
// streams. stdout is a pipe, so progress is in plain mode.
ProcessResult run_remat(const std::string& arguments) {
  static int counter = 0;
  const fs::path err_path =
      scratch() / ("stderr_" + std::to_string(counter++) + ".txt");
  const std::string command = std::string("'") + REMAT_CLI_PATH + "' " +
                              arguments + " 2> '" + err_path.string() + "'";
  ProcessResult result;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "popen failed for " << command;
    return result;
  }
  char buffer[4096];
  size_t read = 0;
  while ((read = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) {
    result.out.append(buffer, read);
  }
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.err = read_file(err_path);
  return result;
}

std::string describe(const ProcessResult& result) {
  return "exit " + std::to_string(result.exit_code) + "\n--- stdout\n" +
         result.out + "\n--- stderr\n" + result.err;
}

// Runs run_cli in-process with string streams.
ProcessResult run_in_process(const std::vector<std::string>& arguments) {
  std::vector<const char*> argv = {"remat"};
  for (const std::string& argument : arguments) {
    argv.push_back(argument.c_str());
  }
  std::ostringstream out, err;
  ProcessResult result;
  result.exit_code = remat::cli::run_cli(
      static_cast<int>(argv.size()), argv.data(), {out, err, false});
  result.out = out.str();
  result.err = err.str();
  return result;
}

// Activations dominate parameters (so that budgets below 50% are feasible).
const std::string kTinyMlp =
    "--model mlp --layers 6 --hidden 32 --batch 256 --threads 1";
const std::string kTinyGpt =
    "--model gpt --layers 1 --hidden 16 --heads 2 --seq 8 --batch 2 "
    "--threads 1";
const std::string kTinyUNet =
    "--model unet2d --levels 2 --hidden 4 --image 32 --batch 4 --threads 1";

TEST(PlanBrief, CountsRecomputedForwards) {
  const auto plan =
      remat::planner::plan_from_string("C0 N1 R2 R3 B3 B2 R0 R1 B1 B0");
  EXPECT_EQ(remat::cli::extra_forwards(plan), 2);
  const std::string brief = remat::cli::plan_brief(plan, 10);
  EXPECT_NE(brief.find("4 stages"), std::string::npos) << brief;
  EXPECT_NE(brief.find("2 recomputed"), std::string::npos) << brief;
  EXPECT_NE(brief.find("..."), std::string::npos) << brief;
}

// ---------------------------------------------------------------- progress

TEST(ProgressLine, UpdatesInPlaceOnATerminal) {
  std::ostringstream out;
  {
    remat::cli::ProgressLine progress(out, /*live=*/true);
    progress.update("step 1 long text");
    progress.update("step 2");
  }
  EXPECT_EQ(out.str(), "\rstep 1 long text\rstep 2          \n");
}

TEST(ProgressLine, PrintsEveryNthLineWhenNotATerminal) {
  std::ostringstream out;
  {
    remat::cli::ProgressLine progress(out, /*live=*/false, 3);
    for (int step = 1; step <= 7; ++step) {
      progress.update("step " + std::to_string(step), step == 7);
    }
  }
  EXPECT_EQ(out.str(), "step 1\nstep 3\nstep 6\nstep 7\n");
  EXPECT_EQ(out.str().find('\r'), std::string::npos);
}

// ---------------------------------------------------------------- in process

TEST(RunCli, PlanPrintsJsonWithThePrediction) {
  const ProcessResult result = run_in_process(
      {"plan", sample_chain_file().string(), "--budget", "60%", "--json"});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const auto report = nlohmann::json::parse(result.out);
  EXPECT_EQ(report["strategy"], "optimal");
  EXPECT_LE(
      report["predicted"]["peak_bytes"].get<int64_t>(),
      report["budget_bytes"].get<int64_t>());
  const auto plan =
      remat::planner::plan_from_string(report["plan"].get<std::string>());
  EXPECT_TRUE(remat::planner::simulate(sample_chain(), plan).valid);
  EXPECT_TRUE(result.err.empty()) << result.err;
}

// A U-Net-shaped graph of 15 stages (3 levels of 2 stages, a bottleneck of
// 2, decoders reading the level below and the skip, a head) on which the
// graph solvers' plan at half-way between the least and the store-all peak
// is faster with the default search work than with none: where
// --search-work can be seen to reach them.
remat::planner::Graph searched_unet_graph() {
  using remat::planner::StageCost;
  std::vector<StageCost> costs;
  std::vector<std::vector<int64_t>> inputs;
  const auto add =
      [&](int64_t bytes, double saved, double ms, std::vector<int64_t> reads) {
        StageCost cost;
        cost.forward_ms = ms;
        cost.backward_ms = 2 * ms;
        cost.output_bytes = bytes;
        cost.saved_bytes =
            static_cast<int64_t>(saved * static_cast<double>(bytes));
        costs.push_back(cost);
        inputs.push_back(std::move(reads));
        return static_cast<int64_t>(costs.size()) - 1;
      };
  std::vector<int64_t> skips;
  int64_t last = remat::planner::kGraphInput;
  int64_t bytes = 4096;
  for (int level = 0; level < 3; ++level, bytes /= 2) {
    for (int k = 0; k < 2; ++k) {
      last = add(bytes, 2 + k, 1.0 + 0.25 * k, {last});
    }
    skips.push_back(last);
  }
  for (int k = 0; k < 2; ++k) {
    last = add(bytes, 3, 1.0, {last});
  }
  for (int level = 2; level >= 0; --level) {
    bytes *= 2;
    last = add(bytes, 4, 1.5, {last, skips[static_cast<size_t>(level)]});
    last = add(bytes, 3, 1.0, {last});
  }
  add(bytes / 4, 1, 0.2, {last});
  return remat::planner::Graph(std::move(costs), std::move(inputs), 1024);
}

TEST(RunCli, SearchWorkReachesTheGraphSolvers) {
  using remat::planner::SolverOptions;
  const remat::planner::Graph graph = searched_unet_graph();
  const fs::path file = scratch() / "searched_unet.json";
  write_file(file, remat::planner::to_json(graph));
  const int64_t least = remat::planner::min_feasible_budget_bytes(graph);
  const int64_t most =
      remat::planner::simulate(graph, remat::planner::solve_store_all(graph))
          .peak_bytes;
  const int64_t budget_bytes = least + (most - least) / 2;
  SolverOptions none;
  none.graph_search_work = 0;
  std::vector<double> times;
  for (const SolverOptions& solver : {none, SolverOptions{}}) {
    SCOPED_TRACE(
        "graph_search_work " + std::to_string(solver.graph_search_work));
    const remat::planner::Plan expected =
        remat::choose_plan(
            graph, Budget::bytes(budget_bytes), BudgetOrigin::kGiven, solver)
            .plan;
    const ProcessResult result = run_in_process(
        {"plan",
         file.string(),
         "--budget",
         std::to_string(budget_bytes) + "B",
         "--search-work",
         std::to_string(solver.graph_search_work),
         "--json"});
    ASSERT_EQ(result.exit_code, 0) << describe(result);
    const auto report = nlohmann::json::parse(result.out);
    EXPECT_EQ(report["plan"], expected.to_string());
    times.push_back(remat::planner::simulate(graph, expected).time_ms);
  }
  // Otherwise the two runs above could not tell the flag was read.
  EXPECT_GT(times[0], times[1])
      << "no search finds the same plan as the default";

  const ProcessResult negative =
      run_in_process({"plan", file.string(), "--search-work", "-1"});
  EXPECT_EQ(negative.exit_code, 1) << describe(negative);
  EXPECT_NE(negative.err.find("--search-work"), std::string::npos)
      << negative.err;
  EXPECT_NE(negative.err.find("-1"), std::string::npos) << negative.err;
}

TEST(RunCli, BadFlagValuesExitOneNamingFlagAndValue) {
  const std::string chain = sample_chain_file().string();
  struct Case {
    std::vector<std::string> arguments;
    std::vector<std::string> expected;
  };
  const std::vector<Case> cases = {
      {{"plan", chain, "--budget", "-5"}, {"--budget", "'-5'"}},
      {{"plan", chain, "--budget", "10XB"}, {"--budget", "'10XB'", "XB"}},
      {{"plan", chain, "--strategy", "nope"}, {"--strategy", "'nope'"}},
      {{"plan", "/no/such/chain.json"},
       {"--chain", "/no/such/chain.json", "No such file"}},
      {{"plan"}, {"chain"}},
      {{"frobnicate"}, {"frobnicate"}},
  };
  for (const Case& test : cases) {
    const ProcessResult result = run_in_process(test.arguments);
    EXPECT_EQ(result.exit_code, 1) << describe(result);
    for (const std::string& text : test.expected) {
      EXPECT_NE(result.err.find(text), std::string::npos)
          << "missing '" << text << "' in: " << result.err;
    }
    EXPECT_TRUE(result.out.empty()) << result.out;
  }
}

TEST(RunCli, BadModelFlagsAndFilesExitOne) {
  struct Case {
    std::vector<std::string> arguments;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{"train", "--model", "nope"}, "--model"},
      {{"train", "--data", "/no/such/text.txt", "--steps", "1"},
       "/no/such/text.txt"},
      {{"train", "--model", "mlp", "--data", "/etc/hostname"}, "--data"},
      {{"train", "--model", "gpt", "--heads", "3", "--hidden", "16"},
       "--heads"},
      {{"train", "--steps", "0"}, "--steps"},
      {{"train", "--mode", "sideways"}, "--mode"},
      {{"explain", "--chain", "/no/such/chain.json"}, "/no/such/chain.json"},
      {{"bench", "--strategies", "optimal,nope"}, "nope"},
      {{"profile", "--model", "resnet", "--image", "12"}, "--image"},
  };
  for (const Case& test : cases) {
    const ProcessResult result = run_in_process(test.arguments);
    EXPECT_EQ(result.exit_code, 1) << describe(result);
    EXPECT_NE(result.err.find(test.expected), std::string::npos)
        << describe(result);
  }
}

TEST(RunCli, MalformedChainJsonExitsOne) {
  const fs::path path = scratch() / "malformed.json";
  write_file(path, R"({"input_bytes": 8, "stages": [{"forward_ms": 1}]})");
  ProcessResult result = run_in_process({"plan", path.string()});
  EXPECT_EQ(result.exit_code, 1) << describe(result);
  EXPECT_NE(result.err.find("not a valid chain JSON"), std::string::npos)
      << result.err;
  EXPECT_NE(result.err.find(path.string()), std::string::npos) << result.err;

  write_file(path, "{ not json");
  result = run_in_process({"plan", path.string()});
  EXPECT_EQ(result.exit_code, 1) << describe(result);

  // A graph file whose first stage lost its list of inputs is still read as
  // a graph, and the stage without one is named.
  const std::string stage =
      R"("forward_ms": 1, "backward_ms": 1, "output_bytes": 8, )"
      R"("saved_bytes": 8, "forward_tmp_bytes": 0, "record_tmp_bytes": 0, )"
      R"("backward_tmp_bytes": 0)";
  write_file(
      path,
      R"({"input_bytes": 8, "stages": [{)" + stage + R"(}, {)" + stage +
          R"(, "inputs": [0]}]})");
  result = run_in_process({"plan", path.string()});
  EXPECT_EQ(result.exit_code, 1) << describe(result);
  EXPECT_NE(result.err.find("not a valid graph JSON"), std::string::npos)
      << result.err;
  EXPECT_NE(result.err.find("stages[0].inputs"), std::string::npos)
      << result.err;
}

TEST(RunCli, InfeasibleBudgetExitsTwoWithTheMinimum) {
  const int64_t minimum =
      remat::planner::min_feasible_budget_bytes(sample_chain());
  const ProcessResult result = run_in_process(
      {"plan",
       sample_chain_file().string(),
       "--budget",
       std::to_string(minimum - 1) + "B"});
  EXPECT_EQ(result.exit_code, 2) << describe(result);
  EXPECT_NE(result.err.find("minimum feasible budget"), std::string::npos)
      << result.err;
  EXPECT_NE(result.err.find(std::to_string(minimum)), std::string::npos)
      << result.err;
}

TEST(RunCli, HelpOfEverySubcommandShowsDefaultsAndExitsZero) {
  for (const std::string command :
       {"train", "profile", "plan", "explain", "bench"}) {
    const ProcessResult result = run_in_process({command, "--help"});
    EXPECT_EQ(result.exit_code, 0) << describe(result);
    EXPECT_NE(result.out.find("--"), std::string::npos) << result.out;
    EXPECT_NE(result.out.find("Exit codes"), std::string::npos) << result.out;
  }
  // Every option is listed, and an option with a default shows it on its own
  // line (how the default is decorated is the argument parser's business).
  const ProcessResult train = run_in_process({"train", "--help"});
  const auto line_of = [&](const std::string& option) {
    const size_t at = train.out.find(option + " ");
    if (at == std::string::npos) {
      return std::string();
    }
    const size_t begin = train.out.rfind('\n', at) + 1;
    return train.out.substr(begin, train.out.find('\n', at) - begin);
  };
  for (const std::string option :
       {"--budget",
        "--strategy",
        "--steps",
        "--batch",
        "--lr",
        "--seed",
        "--threads",
        "--mode",
        "--no-baseline",
        "--fixed-plan",
        "--data",
        "--model"}) {
    EXPECT_NE(train.out.find(option), std::string::npos)
        << "missing '" << option << "' in train --help:\n"
        << train.out;
  }
  for (const auto& [option, default_value] :
       std::vector<std::pair<std::string, std::string>>{
           {"--budget", "50%"},
           {"--strategy", "optimal"},
           {"--threads", "2"},
           {"--model", "gpt"}}) {
    EXPECT_NE(line_of(option).find(default_value), std::string::npos)
        << "train --help: expected the default '" << default_value
        << "' on the line of " << option << ", got '" << line_of(option) << "'";
  }
  EXPECT_EQ(run_in_process({"--help"}).exit_code, 0);
}

// ---------------------------------------------------------------- processes

TEST(RematBinary, ProfilePlanExplainOnATinyModel) {
  const fs::path chain = scratch() / "tiny_chain.json";
  ProcessResult result = run_remat(
      "profile " + kTinyMlp + " --repeats 1 --out '" + chain.string() + "'");
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const remat::planner::Chain profiled =
      remat::planner::chain_from_json(read_file(chain));
  EXPECT_EQ(profiled.size(), 8);  // 6 hidden stages + head + the loss

  result = run_remat("profile " + kTinyMlp + " --repeats 1 --json");
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const remat::planner::Chain printed =
      remat::planner::chain_from_json(result.out);
  EXPECT_EQ(printed.size(), profiled.size()) << result.out;
  EXPECT_EQ(printed.model_state(), profiled.model_state()) << result.out;

  for (const std::string strategy :
       {"optimal", "chen", "sqrt", "uniform:2", "none"}) {
    result = run_remat(
        "plan '" + chain.string() + "' --strategy " + strategy + " --json" +
        (std::string(strategy) == "chen" ? " --budget 90%" : ""));
    ASSERT_EQ(result.exit_code, 0) << strategy << ": " << describe(result);
    const auto report = nlohmann::json::parse(result.out);
    EXPECT_EQ(report["strategy"], strategy);
    EXPECT_GT(report["predicted"]["peak_bytes"].get<int64_t>(), 0);
    EXPECT_GT(report["predicted"]["time_ms"].get<double>(), 0);
  }
  result = run_remat("plan '" + chain.string() + "' --budget 40%");
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_NE(result.out.find("predicted peak"), std::string::npos);

  const fs::path explain_dir = scratch() / "explain";
  result = run_remat(
      "explain --chain '" + chain.string() + "' --budget 60% --out '" +
      explain_dir.string() + "' --json");
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const auto report = nlohmann::json::parse(result.out);
  EXPECT_EQ(report["stages"].size(), 8u);
  EXPECT_FALSE(report["timeline"].empty());
  EXPECT_TRUE(fs::exists(explain_dir / "explain.dat"));
  if (remat::cli::gnuplot_available()) {
    EXPECT_TRUE(fs::exists(explain_dir / "explain.png"));
  }

  // explain on the model itself, text output.
  result = run_remat("explain " + kTinyGpt + " --strategy sqrt --out ''");
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_FALSE(result.out.empty());
}

// The loss is the chain's last stage and the RNG capture of a stage's first
// forward allocates nothing, so a planned step measures what simulate()
// predicts, to the byte: with dropout (the MLP's default), a cross-entropy
// whose saved tensors dominate a tiny model, and over two workers.
TEST(RematBinary, TrainMeasuresItsPredictionToTheByte) {
  for (const std::string flags : {
         "--model mlp --layers 2 --hidden 32 --budget 100%",
             "--model mlp --layers 2 --hidden 32 --batch 64 --budget 100%",
             "--model mlp --layers 2 --hidden 32 --budget 70%",
#if REMAT_WITH_DISTRIBUTED
             "--model mlp --layers 2 --hidden 32 --budget 100% --nproc 2",
#endif
       }) {
    SCOPED_TRACE(flags);
    const ProcessResult result =
        run_remat("train " + flags + " --steps 3 --threads 1 --json");
    ASSERT_EQ(result.exit_code, 0) << describe(result);
    const auto report = nlohmann::json::parse(result.out);
    EXPECT_EQ(
        report["peak_bytes"].get<int64_t>(),
        report["predicted_peak_bytes"].get<int64_t>());
    EXPECT_EQ(report["over_budget_steps"], 0);
  }
  const ProcessResult text =
      run_remat("train --model mlp --steps 3 --threads 1");
  ASSERT_EQ(text.exit_code, 0) << describe(text);
  EXPECT_EQ(text.out.find("EXCEEDED"), std::string::npos) << text.out;
  EXPECT_EQ(text.err.find("exceeded"), std::string::npos) << text.err;
}

// An optimal plan corrects itself in `remat train` unless --fixed-plan is
// given: after its first window (3 steps) the run prints the profiled
// against the measured time of every stage, and the JSON report carries
// them, every re-plan and, as the predicted peak, the highest of the plans
// that ran, so the peak is measured as predicted whatever plan is in force.
// The time ratio against the interleaved baseline is the median of the
// per-step ratios after the 3 warm-up steps (all of them in a run of at most
// 3), with a 95 % interval once there are 6. (Its value and verdict depend on
// the load: not asserted.)
TEST(RematBinary, TrainGivesTheTimeRatioWithItsInterval) {
  ProcessResult result =
      run_remat("train " + kTinyMlp + " --steps 9 --baseline-steps 9 --json");
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  auto baseline = nlohmann::json::parse(result.out)["baseline"];
  EXPECT_EQ(baseline["time_ratio_rounds"].get<int64_t>(), 6) << baseline;
  ASSERT_TRUE(baseline["time_ratio_interval"].is_array()) << baseline;
  ASSERT_EQ(baseline["time_ratio_interval"].size(), 2u) << baseline;
  const double low = baseline["time_ratio_interval"][0].get<double>();
  const double high = baseline["time_ratio_interval"][1].get<double>();
  const double median = baseline["time_ratio"].get<double>();
  EXPECT_GT(low, 0) << baseline;
  EXPECT_LE(low, median) << baseline;
  EXPECT_LE(median, high) << baseline;

  result = run_remat("train " + kTinyMlp + " --steps 9 --baseline-steps 9");
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_NE(
      result.out.find("(median of 6 per-step ratios, 95% interval): "),
      std::string::npos)
      << result.out;

  result = run_remat("train " + kTinyMlp + " --steps 3 --baseline-steps 3");
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_NE(
      result.out.find(
          "(median of 3 per-step ratios, too few for a 95% interval)"),
      std::string::npos)
      << result.out;
  result =
      run_remat("train " + kTinyMlp + " --steps 3 --baseline-steps 3 --json");
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  baseline = nlohmann::json::parse(result.out)["baseline"];
  EXPECT_TRUE(baseline["time_ratio_interval"].is_null()) << baseline;
  EXPECT_EQ(baseline["time_ratio_rounds"].get<int64_t>(), 3) << baseline;
}

// (Whether a re-plan happens depends on this machine's times: not asserted.)
TEST(RematBinary, TrainCorrectsAnOptimalPlanUnlessItIsFixed) {
  const std::string run =
      "train " + kTinyMlp + " --steps 5 --baseline-steps 2 --budget 60%";
  ProcessResult result = run_remat(run + " --json");
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  auto report = nlohmann::json::parse(result.out);
  EXPECT_TRUE(report["self_correct"].get<bool>()) << result.out;
  ASSERT_TRUE(report.contains("stage_times")) << result.out;
  EXPECT_EQ(report["stage_times"].size(), 8u) << "6 layers, head, loss";
  for (const auto& stage : report["stage_times"]) {
    for (const char* key :
         {"profiled_forward_ms",
          "measured_forward_ms",
          "profiled_backward_ms",
          "measured_backward_ms"}) {
      EXPECT_TRUE(stage[key].is_number()) << stage.dump();
    }
  }
  for (const auto& correction : report["corrections"]) {
    EXPECT_LE(
        correction["to_peak_bytes"].get<int64_t>(),
        report["budget_bytes"].get<int64_t>())
        << correction.dump();
    EXPECT_LT(
        correction["to_ms"].get<double>(), correction["from_ms"].get<double>());
  }
  EXPECT_EQ(
      report["peak_bytes"].get<int64_t>(),
      report["predicted_peak_bytes"].get<int64_t>());
  EXPECT_EQ(report["over_budget_steps"], 0);
  EXPECT_EQ(report["baseline"]["max_loss_difference"].get<double>(), 0.0);

  result = run_remat(run + " --json --fixed-plan");
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  report = nlohmann::json::parse(result.out);
  EXPECT_FALSE(report["self_correct"].get<bool>());
  EXPECT_FALSE(report.contains("corrections")) << result.out;
  EXPECT_EQ(
      report["peak_bytes"].get<int64_t>(),
      report["predicted_peak_bytes"].get<int64_t>());

  result = run_remat(run);
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  for (const std::string line :
       {"measured  stage times of the first 3 steps (medians), profiled -> "
        "measured, ms:",
        "          stage  forward             backward",
        "  plan            self-correcting, "}) {
    EXPECT_NE(result.out.find(line), std::string::npos) << line << result.out;
  }
  result = run_remat(run + " --fixed-plan");
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_EQ(result.out.find("measured  stage times"), std::string::npos)
      << result.out;
  EXPECT_EQ(result.out.find("self-correcting"), std::string::npos)
      << result.out;

  // Only an optimal plan corrects itself; a graph's does too.
  result = run_remat(
      "train " + kTinyMlp + " --steps 5 --no-baseline --strategy sqrt --json");
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_FALSE(nlohmann::json::parse(result.out)["self_correct"].get<bool>());
  result = run_remat(
      "train --model unet2d --levels 2 --hidden 4 --image 32 --batch 4 "
      "--threads 1 --steps 5 --no-baseline --budget 70% --json");
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  report = nlohmann::json::parse(result.out);
  EXPECT_TRUE(report["self_correct"].get<bool>()) << result.out;
  EXPECT_FALSE(report["stage_times"].empty()) << result.out;
  EXPECT_LE(
      report["peak_bytes"].get<int64_t>(),
      report["predicted_peak_bytes"].get<int64_t>());
}

TEST(RematBinary, TrainOnTinyModelsReportsJsonWithinBudget) {
  ProcessResult result = run_remat(
      "train " + kTinyMlp +
      " --steps 6 --baseline-steps 4 --budget 60% --json");
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  auto report = nlohmann::json::parse(result.out);
  EXPECT_EQ(report["steps"], 6);
  EXPECT_EQ(report["over_budget_steps"], 0) << result.out;
  EXPECT_LE(
      report["activation_peak_bytes"].get<int64_t>(),
      report["budget_bytes"].get<int64_t>());
  EXPECT_EQ(report["baseline"]["max_loss_difference"].get<double>(), 0.0)
      << "checkpointed losses differ from the no-checkpoint run";

  result = run_remat(
      "train " + kTinyGpt +
      " --steps 4 --baseline-steps 2 --strategy uniform:2");
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_NE(result.out.find("summary"), std::string::npos) << result.out;
  EXPECT_EQ(result.out.find('\r'), std::string::npos)
      << "progress must be plain lines when stdout is not a terminal";

  result = run_remat(
      "train " + kTinyMlp + " --steps 2 --no-baseline --strategy none");
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_NE(result.out.find("no baseline"), std::string::npos) << result.out;
}

TEST(RematBinary, TrainWithATransformerRecipeMatchesTheBaselineLosses) {
  for (const std::string recipe : {"full", "attention", "selective"}) {
    const ProcessResult result = run_remat(
        "train " + kTinyGpt + " --steps 3 --baseline-steps 3 --recompute " +
        recipe + " --json");
    ASSERT_EQ(result.exit_code, 0) << describe(result);
    auto report = nlohmann::json::parse(result.out);
    EXPECT_EQ(report["recompute"], recipe);
    EXPECT_EQ(report["baseline"]["max_loss_difference"].get<double>(), 0.0)
        << recipe << ": losses differ from the no-checkpoint run";
    EXPECT_LT(
        report["activation_peak_bytes"].get<int64_t>(),
        report["baseline"]["activation_peak_bytes"].get<int64_t>())
        << recipe;
  }
  const ProcessResult mlp =
      run_remat("train " + kTinyMlp + " --steps 1 --recompute full");
  EXPECT_EQ(mlp.exit_code, 1) << describe(mlp);
  EXPECT_NE(mlp.err.find("--recompute full"), std::string::npos) << mlp.err;
}

// --recompute dynamic: no plan, the model run plainly inside a DynamicRemat
// scope. Every built-in model trains with the baseline's losses, bitwise
// (SGD, CPU), while the scope evicts and recomputes and the peak falls below
// the baseline's; a GPT of varying sequence length too.
TEST(RematBinary, TrainDynamicKeepsTheBaselinesLossesOnEveryModel) {
  for (const std::string& model : std::vector<std::string>{
           kTinyGpt, kTinyGpt + " --min-seq 3", kTinyMlp, kTinyUNet}) {
    const ProcessResult result = run_remat(
        "train " + model +
        " --steps 6 --baseline-steps 6 --optimizer sgd --recompute dynamic "
        "--budget 60% --json");
    ASSERT_EQ(result.exit_code, 0) << model << "\n" << describe(result);
    const auto report = nlohmann::json::parse(result.out);
    EXPECT_EQ(report["recompute"], "dynamic") << model;
    if (model.find("--min-seq") != std::string::npos) {
      EXPECT_NE(
          report["model"].get<std::string>().find("seq 3-8"), std::string::npos)
          << report["model"];
    }
    EXPECT_EQ(report["baseline"]["max_loss_difference"].get<double>(), 0.0)
        << model << ": losses differ from the no-checkpoint run";
    const auto& dynamic = report["dynamic"];
    ASSERT_TRUE(dynamic.is_object()) << model << "\n" << report;
    // Not vacuous: the scope evicted and recomputed.
    EXPECT_GT(dynamic["evictions_per_step_median"].get<double>(), 0) << model;
    EXPECT_GT(dynamic["rematerializations_per_step_median"].get<double>(), 0)
        << model;
    EXPECT_GT(dynamic["tracked_peak_bytes"].get<int64_t>(), 0) << model;
    EXPECT_GE(
        dynamic["scope_budget_bytes"].get<int64_t>(),
        dynamic["largest_call_bytes"].get<int64_t>())
        << model;
    // The first step's scope: half the budget less the input.
    EXPECT_EQ(
        dynamic["first_scope_budget_bytes"].get<int64_t>(),
        (report["budget_bytes"].get<int64_t>() -
         report["input_bytes"].get<int64_t>()) /
            2)
        << model;
    EXPECT_LT(
        report["activation_peak_bytes"].get<int64_t>(),
        report["baseline"]["activation_peak_bytes"].get<int64_t>())
        << model;
  }
}

// A budget the overhead of a step alone fills: the scope cannot keep its
// budget (what the running code holds is tracked beyond it), so the retune
// leaves it where it was rather than recomputing more for the same peak;
// it never goes below what the largest recorded call saved.
TEST(RematBinary, TrainDynamicKeepsABudgetTheScopeCouldNotKeep) {
  const ProcessResult result = run_remat(
      "train " + kTinyGpt +
      " --steps 4 --baseline-steps 4 --optimizer sgd --recompute dynamic "
      "--budget 40% --json");
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const auto report = nlohmann::json::parse(result.out);
  const auto& dynamic = report["dynamic"];
  const auto largest = dynamic["largest_call_bytes"].get<int64_t>();
  const auto first = dynamic["first_scope_budget_bytes"].get<int64_t>();
  EXPECT_GT(largest, 0) << dynamic;
  EXPECT_LT(largest, first) << dynamic;
  // Not vacuous: the scope's tracked peak was beyond its budget and margin.
  EXPECT_GT(
      dynamic["tracked_peak_bytes"].get<int64_t>(),
      first + report["budget_bytes"].get<int64_t>() / 32)
      << dynamic;
  EXPECT_EQ(dynamic["scope_budget_bytes"].get<int64_t>(), first) << dynamic;
  EXPECT_EQ(report["baseline"]["max_loss_difference"].get<double>(), 0.0);
}

TEST(RematBinary, TrainDynamicAndVaryingLengthsRefuseWhatTheyCannotDo) {
  const std::vector<std::pair<std::string, std::string>> refused = {
      {kTinyGpt + " --recompute dynamic --precision bf16", "--precision bf16"},
      {kTinyGpt + " --recompute dynamic --compress int8", "--compress int8"},
      {kTinyGpt + " --recompute dynamic --selective", "--selective"},
      {kTinyGpt + " --recompute dynamic --budget 1B", "--budget"},
      {kTinyGpt + " --min-seq 9", "--min-seq: expected"},
      {kTinyMlp + " --min-seq 4", "--min-seq: only --model gpt"},
  };
  for (const auto& [flags, message] : refused) {
    const ProcessResult result = run_remat("train " + flags + " --steps 1");
    EXPECT_NE(result.exit_code, 0) << flags << "\n" << describe(result);
    EXPECT_NE(result.err.find(message), std::string::npos) << flags << "\n"
                                                           << result.err;
  }
}

// The promise is "measured peak <= budget": a run at exactly its measured
// peak keeps it, one byte less is reported with the difference in bytes. A
// GPT recipe has no plan, so its budget is checked only, never planned for.
TEST(RematBinary, TrainWarnsOnlyWhenTheMeasuredPeakExceedsTheBudget) {
  const std::string recipe =
      "train " + kTinyGpt + " --steps 2 --no-baseline --recompute full";
  const ProcessResult free_run = run_remat(recipe + " --json");
  ASSERT_EQ(free_run.exit_code, 0) << describe(free_run);
  const int64_t peak =
      nlohmann::json::parse(free_run.out)["peak_bytes"].get<int64_t>();
  const ProcessResult at_peak =
      run_remat(recipe + " --budget " + std::to_string(peak) + "B");
  ASSERT_EQ(at_peak.exit_code, 0) << describe(at_peak);
  EXPECT_EQ(at_peak.out.find("EXCEEDED"), std::string::npos) << at_peak.out;
  EXPECT_NE(at_peak.out.find("kept on every step"), std::string::npos)
      << at_peak.out;
  EXPECT_EQ(at_peak.err.find("exceeded"), std::string::npos) << at_peak.err;
  const ProcessResult below =
      run_remat(recipe + " --budget " + std::to_string(peak - 1) + "B");
  ASSERT_EQ(below.exit_code, 0) << describe(below);
  // The highest step is over by one byte (steps may peak differently).
  EXPECT_NE(below.out.find("EXCEEDED on "), std::string::npos) << below.out;
  EXPECT_NE(below.out.find(", by up to 1 byte\n"), std::string::npos)
      << below.out;
  EXPECT_NE(
      below.err.find(
          "warning: the measured peak " + std::to_string(peak) + " bytes"),
      std::string::npos)
      << below.err;
  // The planned default at 100% and the MLP default: within, no warning.
  for (const std::string& run : std::vector<std::string>{
           "train " + kTinyGpt + " --steps 2 --budget 100%",
           "train " + kTinyMlp + " --steps 2"}) {
    const ProcessResult planned = run_remat(run);
    ASSERT_EQ(planned.exit_code, 0) << describe(planned);
    EXPECT_EQ(planned.out.find("EXCEEDED"), std::string::npos) << planned.out;
    EXPECT_NE(planned.out.find("= predicted to the byte"), std::string::npos)
        << planned.out;
  }
}

// A total budget covers the whole step: the model state the profile predicts
// (and the run measures, to the byte) plus activations and input.
TEST(RematBinary, TrainUnderATotalBudgetCountsTheModelState) {
  const std::string run = "train " + kTinyMlp + " --steps 3 --json";
  const ProcessResult free_run = run_remat(run + " --budget none");
  ASSERT_EQ(free_run.exit_code, 0) << describe(free_run);
  const auto free_report = nlohmann::json::parse(free_run.out);
  const auto& state = free_report["predicted_model_state"];
  const int64_t predicted_state = state["parameter_bytes"].get<int64_t>() +
                                  state["gradient_bytes"].get<int64_t>() +
                                  state["optimizer_bytes"].get<int64_t>();
  EXPECT_EQ(
      free_report["parameter_state_bytes"].get<int64_t>(),
      state["parameter_bytes"].get<int64_t>() +
          state["gradient_bytes"].get<int64_t>());
  EXPECT_EQ(
      free_report["optimizer_state_bytes"].get<int64_t>(),
      state["optimizer_bytes"].get<int64_t>());
  EXPECT_EQ(
      state["optimizer_bytes"].get<int64_t>(),
      2 * state["gradient_bytes"].get<int64_t>())
      << "AdamW keeps two moments";
  // Between the least and the store-all step: checkpointing must recompute.
  const int64_t store_all = free_report["total_peak_bytes"].get<int64_t>();
  const int64_t total = predicted_state + (store_all - predicted_state) * 3 / 4;
  const ProcessResult capped =
      run_remat(run + " --budget total:" + std::to_string(total) + "B");
  ASSERT_EQ(capped.exit_code, 0) << describe(capped);
  const auto report = nlohmann::json::parse(capped.out);
  EXPECT_TRUE(report["budget_total"].get<bool>());
  EXPECT_EQ(report["budget_bytes"].get<int64_t>(), total - predicted_state);
  EXPECT_LE(report["total_peak_bytes"].get<int64_t>(), total);
  EXPECT_LT(report["total_peak_bytes"].get<int64_t>(), store_all);
  EXPECT_EQ(report["over_budget_steps"].get<int64_t>(), 0);
  // A total below the model state: an error that names it.
  const ProcessResult tiny = run_remat(run + " --budget total:1KiB");
  EXPECT_EQ(tiny.exit_code, 1) << describe(tiny);
  EXPECT_NE(tiny.err.find("leaves nothing for activations"), std::string::npos)
      << tiny.err;
  // One step: its update creates the state after the activations are freed;
  // the report shows that state, not the 0 bytes the step held.
  const ProcessResult one = run_remat("train " + kTinyMlp + " --steps 1");
  ASSERT_EQ(one.exit_code, 0) << describe(one);
  EXPECT_NE(
      one.out.find(
          "= predicted to the byte)  created by the update, after the step"),
      std::string::npos)
      << one.out;
  const ProcessResult one_json =
      run_remat("train " + kTinyMlp + " --steps 1 --json");
  ASSERT_EQ(one_json.exit_code, 0) << describe(one_json);
  const auto one_report = nlohmann::json::parse(one_json.out);
  EXPECT_EQ(one_report["optimizer_state_bytes"].get<int64_t>(), 0);
  EXPECT_EQ(
      one_report["optimizer_state_after_update_bytes"].get<int64_t>(),
      one_report["predicted_model_state"]["optimizer_bytes"].get<int64_t>());
}

TEST(RematBinary, BudgetsSayTheirUnitsAndWhenTheyChangeNothing) {
  for (const std::string flags :
       {"train --budget 50",
        "train --budget total:50",
        "plan x.json --budget 7",
        "fit --cap 64",
        "bench --budgets 50%,50"}) {
    const ProcessResult bare = run_remat(flags);
    EXPECT_EQ(bare.exit_code, 1) << flags << ": " << describe(bare);
    EXPECT_NE(bare.err.find("has no unit; did you mean"), std::string::npos)
        << flags << ": " << bare.err;
    EXPECT_NE(bare.err.find("MiB or"), std::string::npos) << bare.err;
  }
  // Zero has no unit that would make it a budget: no suggestion to try one.
  const ProcessResult zero = run_remat("train --budget 0");
  EXPECT_EQ(zero.exit_code, 1) << describe(zero);
  EXPECT_EQ(zero.err.find("did you mean"), std::string::npos) << zero.err;
  EXPECT_NE(
      zero.err.find("a budget must be at least 1 byte"), std::string::npos)
      << zero.err;
  const ProcessResult huge =
      run_remat("train " + kTinyMlp + " --steps 1 --budget 10GiB");
  ASSERT_EQ(huge.exit_code, 0) << describe(huge);
  EXPECT_NE(huge.out.find("nothing is recomputed"), std::string::npos)
      << huge.out;
  const ProcessResult fitting =
      run_remat("train " + kTinyMlp + " --steps 1 --budget 100%");
  ASSERT_EQ(fitting.exit_code, 0) << describe(fitting);
  EXPECT_EQ(fitting.out.find("nothing is recomputed"), std::string::npos)
      << fitting.out;
}

TEST(RematBinary, ProfileShowsTheStepsMemoryByKind) {
  for (const std::string optimizer : {"adamw", "sgd"}) {
    const ProcessResult result = run_remat(
        "profile " + kTinyMlp + " --repeats 1 --optimizer " + optimizer);
    ASSERT_EQ(result.exit_code, 0) << describe(result);
    for (const std::string& line : std::vector<std::string>{
             "memory of one training step (predicted):",
             "parameters and buffers",
             "gradients",
             "optimizer state (" + optimizer + ")",
             "activations + input, no checkpointing",
             "activations + input, least with checkpointing",
             "total, no checkpointing",
             "checkpointing can save at most",
             "forward ms"}) {
      EXPECT_NE(result.out.find(line), std::string::npos)
          << line << " missing in\n"
          << result.out;
    }
    const ProcessResult json = run_remat(
        "profile " + kTinyMlp + " --repeats 1 --json --optimizer " + optimizer);
    ASSERT_EQ(json.exit_code, 0) << describe(json);
    const remat::planner::ModelState state =
        remat::planner::chain_from_json(json.out).model_state();
    EXPECT_GT(state.parameter_bytes, 0);
    EXPECT_EQ(
        state.optimizer_bytes,
        optimizer == "adamw" ? 2 * state.gradient_bytes : 0);
  }
}

TEST(RematBinary, TrainInBf16LowersThePeakAndKeepsLossesBitwiseEqual) {
  // The default model (the demo's GPT), a few steps, the default budget.
  const std::string common = "train --steps 4 --baseline-steps 1 --json";
  const ProcessResult fp32 = run_remat(common + " --precision fp32");
  ASSERT_EQ(fp32.exit_code, 0) << describe(fp32);
  const ProcessResult bf16 = run_remat(common + " --precision bf16");
  ASSERT_EQ(bf16.exit_code, 0) << describe(bf16);
  const auto full = nlohmann::json::parse(fp32.out);
  const auto mixed = nlohmann::json::parse(bf16.out);
  EXPECT_EQ(full["precision"], "fp32");
  EXPECT_EQ(mixed["precision"], "bf16");
  EXPECT_LT(mixed["last_loss"].get<double>(), mixed["first_loss"].get<double>())
      << bf16.out;
  EXPECT_LT(
      mixed["activation_peak_bytes"].get<int64_t>(),
      full["activation_peak_bytes"].get<int64_t>())
      << "bf16:\n"
      << bf16.out << "\nfp32:\n"
      << fp32.out;
  EXPECT_LT(
      mixed["baseline"]["activation_peak_bytes"].get<int64_t>(),
      full["baseline"]["activation_peak_bytes"].get<int64_t>());
  EXPECT_EQ(mixed["over_budget_steps"], 0)
      << "the plan, measured in bf16, fits its budget: " << bf16.out;
  EXPECT_EQ(mixed["baseline"]["max_loss_difference"].get<double>(), 0.0)
      << "the baseline runs in bf16 too: " << bf16.out;
}

// --selective profiles each stage as a selective checkpoint too, and the
// chain JSON carries those costs to `remat plan`, which runs stages
// selectively (S) where that is fastest under the budget; training under such
// plans matches the no-checkpoint losses bitwise within the budget.
TEST(RematBinary, SelectiveStagesReachThePlannerAndTrainWithinTheBudget) {
  const std::string gpt =
      "--model gpt --layers 6 --hidden 32 --heads 2 --seq 32 --batch 4 "
      "--threads 1";
  const fs::path chain = fs::temp_directory_path() / "remat_cli_selective.json";
  ProcessResult result = run_remat(
      "profile " + gpt + " --repeats 1 --selective --out '" + chain.string() +
      "'");
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_NE(result.out.find("recompute ms"), std::string::npos) << result.out;
  // Held in a variable: a range-for over a member of a temporary would use
  // the member after the temporary is destroyed.
  const nlohmann::json profiled = nlohmann::json::parse(read_file(chain));
  ASSERT_FALSE(profiled.at("stages").empty());
  for (const auto& stage : profiled.at("stages")) {
    EXPECT_TRUE(stage.contains("selective")) << stage.dump();
  }

  // A chain whose stages keep a tenth of their record selectively, at a
  // tenth of a forward's time: at half the store-all peak the plan uses S.
  const std::string stage =
      R"({"forward_ms": 1, "backward_ms": 2, "output_bytes": 10,
      "saved_bytes": 100, "forward_tmp_bytes": 0, "backward_tmp_bytes": 0,
      "selective": {"saved_bytes": 20, "forward_tmp_bytes": 0,
      "backward_tmp_bytes": 0, "recompute_ms": 0.1}})";
  std::string json = R"({"input_bytes": 10, "stages": [)";
  for (int i = 0; i < 6; ++i) {
    json += (i > 0 ? ", " : "") + stage;
  }
  write_file(chain, json + "]}");
  result = run_remat("plan '" + chain.string() + "' --budget 50% --json");
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const auto plan = nlohmann::json::parse(result.out);
  EXPECT_NE(plan["plan"].get<std::string>().find('S'), std::string::npos)
      << result.out;
  result = run_remat(
      "explain --chain '" + chain.string() + "' --budget 50% --out ''");
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_NE(result.out.find("forward_selective"), std::string::npos)
      << result.out;
  fs::remove(chain);

  for (const char* budget : {"45%", "65%", "85%"}) {
    result = run_remat(
        "train " + gpt + " --steps 2 --baseline-steps 2 --selective --budget " +
        budget + " --json");
    ASSERT_EQ(result.exit_code, 0) << budget << ": " << describe(result);
    const auto report = nlohmann::json::parse(result.out);
    EXPECT_EQ(report["over_budget_steps"], 0) << result.out;
    EXPECT_EQ(report["baseline"]["max_loss_difference"].get<double>(), 0.0)
        << budget << ": losses differ from the no-checkpoint run under "
        << report["plan"];
  }
}

TEST(RunCli, BadPrecisionExitsOneNamingTheValue) {
  struct Case {
    std::vector<std::string> arguments;
    std::vector<std::string> expected;
  };
  const std::vector<Case> cases = {
      {{"train", "--precision", "fp8", "--steps", "1"},
       {"--precision", "'fp8'", "fp32, bf16 or fp16"}},
      {{"train", "--precision", "fp16", "--steps", "1"},
       {"--precision", "'fp16'", "CUDA only"}},
      {{"profile", "--precision", "fp16"}, {"--precision", "'fp16'"}},
      {{"explain", "--precision", "BF16"}, {"--precision", "'BF16'"}},
  };
  for (const Case& test : cases) {
    const ProcessResult result = run_in_process(test.arguments);
    EXPECT_EQ(result.exit_code, 1) << describe(result);
    for (const std::string& text : test.expected) {
      EXPECT_NE(result.err.find(text), std::string::npos)
          << "missing '" << text << "' in: " << result.err;
    }
    EXPECT_TRUE(result.out.empty()) << result.out;
  }
}

TEST(RematBinary, ReentrantUniformRefusesInputsThatCannotRequireGrad) {
  // The GPT's input is int64 token ids: a reentrant checkpoint would pass no
  // gradient into the checkpointed segments, so the tool refuses (exit 2).
  for (const std::string& command :
       {"train " + kTinyGpt +
            " --steps 2 --strategy uniform:2 --mode reentrant",
        "bench " + kTinyGpt +
            " --strategies uniform:2 --mode reentrant --warmup 0 --repeats 1 "
            "--out '" +
            (scratch() / "bench_reentrant").string() + "'"}) {
    const ProcessResult result = run_remat(command);
    EXPECT_EQ(result.exit_code, 2) << command << "\n" << describe(result);
    EXPECT_NE(result.err.find("--mode reentrant"), std::string::npos)
        << result.err;
    EXPECT_NE(result.err.find("cannot require grad"), std::string::npos)
        << result.err;
    EXPECT_NE(result.err.find("--mode nonreentrant"), std::string::npos)
        << result.err;
  }
  // One segment checkpoints nothing, so there is nothing to refuse.
  const ProcessResult one_segment = run_remat(
      "train " + kTinyGpt +
      " --steps 2 --baseline-steps 2 --strategy uniform:1 --mode reentrant "
      "--json");
  ASSERT_EQ(one_segment.exit_code, 0) << describe(one_segment);
  EXPECT_EQ(
      nlohmann::json::parse(one_segment.out)["baseline"]["max_loss_difference"]
          .get<double>(),
      0.0);
}

TEST(RematBinary, ReentrantUniformTrainsEverySegmentOfAFloatInputModel) {
  // The MLP's input is float but does not require grad; the executor makes
  // it require grad, so every segment gets its gradients and the losses of
  // later steps (after optimizer updates) equal the no-checkpoint copy's.
  const ProcessResult result = run_remat(
      "train " + kTinyMlp +
      " --steps 3 --baseline-steps 3 --strategy uniform:3 --mode reentrant "
      "--json");
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const auto report = nlohmann::json::parse(result.out);
  EXPECT_EQ(report["baseline"]["max_loss_difference"].get<double>(), 0.0)
      << "reentrant checkpointed losses differ from the no-checkpoint run: "
         "some segment got no gradients";
}

TEST(RematBinary, BadInputExitsOneWithAClearMessage) {
  const std::string chain = sample_chain_file().string();
  struct Case {
    std::string arguments;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"train --budget -5 " + kTinyMlp, "--budget"},
      {"train --budget 10XB " + kTinyMlp, "10XB"},
      {"train --strategy nope " + kTinyMlp, "nope"},
      {"plan /no/such/chain.json", "No such file"},
      {"bench --budgets 50%,10XB " + kTinyMlp, "10XB"},
      {"bench --budgets 50%,50.0% --out /tmp " + kTinyMlp,
       "--budgets: '50% of the store-all peak' is given twice"},
      {"bench --strategies chen,optimal,chen --out /tmp " + kTinyMlp,
       "--strategies: 'chen' is given twice"},
      {"train --strategy uniform:100 " + kTinyMlp,
       "uniform:100 asks for more segments than the model has stages"},
      {"bench --strategies uniform:100 --out /tmp " + kTinyMlp,
       "uniform:100 asks for more segments"},
  };
  for (const Case& test : cases) {
    const ProcessResult result = run_remat(test.arguments);
    EXPECT_EQ(result.exit_code, 1) << test.arguments << "\n"
                                   << describe(result);
    EXPECT_NE(result.err.find(test.expected), std::string::npos)
        << test.arguments << "\n"
        << describe(result);
    EXPECT_NE(result.err.find("error"), std::string::npos) << result.err;
  }
  const fs::path malformed = scratch() / "malformed_process.json";
  write_file(malformed, "[1, 2");
  const ProcessResult result = run_remat("plan '" + malformed.string() + "'");
  EXPECT_EQ(result.exit_code, 1) << describe(result);
  EXPECT_NE(result.err.find("not a valid chain JSON"), std::string::npos)
      << result.err;
}

TEST(RematBinary, InfeasibleBudgetExitsTwo) {
  ProcessResult result =
      run_remat("plan '" + sample_chain_file().string() + "' --budget 1KB");
  EXPECT_EQ(result.exit_code, 2) << describe(result);
  EXPECT_NE(result.err.find("minimum feasible budget"), std::string::npos)
      << result.err;

  result = run_remat("train " + kTinyMlp + " --steps 1 --budget 1B");
  EXPECT_EQ(result.exit_code, 2) << describe(result);
  EXPECT_NE(result.err.find("minimum feasible budget"), std::string::npos)
      << result.err;
}

// Checks a `remat fit --json` report: three answers in order, what was
// fitted, each answer measured under the cap, and the optimal plan fitting
// at least no checkpointing's size.
void expect_fit_report(
    const ProcessResult& result, const std::string& over, int64_t cap_bytes) {
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const auto report = nlohmann::json::parse(result.out);
  EXPECT_EQ(report["over"], over);
  EXPECT_EQ(report["cap_bytes"].get<int64_t>(), cap_bytes);
  const auto& answers = report["answers"];
  ASSERT_EQ(answers.size(), 3u) << result.out;
  const std::vector<std::string> strategies = {
      "none", "checkpoint_sequential", "optimal"};
  for (size_t i = 0; i < answers.size(); ++i) {
    const auto& answer = answers[i];
    EXPECT_EQ(answer["strategy"], strategies[i]);
    const int64_t size = answer["size"].get<int64_t>();
    EXPECT_GT(size, 0) << answer.dump();
    EXPECT_EQ(answer[over == "batch" ? "batch" : "seq_len"], size);
    EXPECT_LE(answer["measured"]["peak_bytes"].get<int64_t>(), cap_bytes)
        << answer.dump();
    EXPECT_GT(answer["measured"]["peak_bytes"].get<int64_t>(), 0);
    EXPECT_LE(answer["predicted"]["peak_bytes"].get<int64_t>(), cap_bytes);
  }
  EXPECT_GE(
      answers[2]["size"].get<int64_t>(), answers[0]["size"].get<int64_t>());
}

TEST(RematBinary, FitOverBatchAndSeqLenReportsAnswersMeasuredUnderTheCap) {
  constexpr int64_t kCap = 1 << 20;
  expect_fit_report(
      run_remat("fit " + kTinyMlp + " --cap 1MiB --json"), "batch", kCap);
  const ProcessResult result = run_remat(
      "fit --over seq-len " + kTinyGpt +
      " --cap 1MiB --probe-seq-len 8 --max-seq-len 512 --json");
  expect_fit_report(result, "seq-len", kCap);
  if (result.exit_code == 0) {
    const nlohmann::json report = nlohmann::json::parse(result.out);  // held
    for (const auto& answer : report.at("answers")) {
      EXPECT_EQ(answer["batch"], 2) << "the batch of kTinyGpt is fixed";
      EXPECT_LT(answer["size"].get<int64_t>(), 512) << "the cap must bind";
    }
  }
}

// A total cap includes the model state: predicted (what the cap leaves the
// activations after) and measured on a copy of the model, to the byte; every
// answer's measured step fits in what is left.
TEST(RematBinary, FitUnderATotalCapCountsTheModelState) {
  const ProcessResult state_run =
      run_remat("profile " + kTinyMlp + " --repeats 1 --json");
  ASSERT_EQ(state_run.exit_code, 0) << describe(state_run);
  const int64_t state_bytes = remat::planner::chain_from_json(state_run.out)
                                  .model_state()
                                  .total_bytes();
  const int64_t total = state_bytes + (1 << 20);
  const ProcessResult result = run_remat(
      "fit " + kTinyMlp + " --cap total:" + std::to_string(total) + "B --json");
  expect_fit_report(result, "batch", total);
  if (result.exit_code != 0) {
    return;
  }
  const auto report = nlohmann::json::parse(result.out);
  EXPECT_TRUE(report["cap_total"].get<bool>());
  EXPECT_EQ(
      report["model_state"]["predicted"], report["model_state"]["measured"])
      << result.out;
  for (const auto& answer : report["answers"]) {
    EXPECT_LE(answer["measured"]["peak_bytes"].get<int64_t>(), 1 << 20)
        << answer.dump();
  }
  const ProcessResult too_small =
      run_remat("fit " + kTinyMlp + " --cap total:1KiB");
  EXPECT_EQ(too_small.exit_code, 1) << describe(too_small);
  EXPECT_NE(
      too_small.err.find("nothing is left for activations"), std::string::npos)
      << too_small.err;
}

TEST(RematBinary, FitFlagsAnswersAtTheSearchBound) {
  const ProcessResult result =
      run_remat("fit " + kTinyMlp + " --cap 64MiB --max-batch 8");
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_NE(
      result.out.find("* at the search bound (--max-batch 8)"),
      std::string::npos)
      << result.out;
  const ProcessResult json =
      run_remat("fit " + kTinyMlp + " --cap 64MiB --max-batch 8 --json");
  ASSERT_EQ(json.exit_code, 0) << describe(json);
  const nlohmann::json report = nlohmann::json::parse(json.out);  // held
  for (const auto& answer : report.at("answers")) {
    EXPECT_TRUE(answer["at_search_bound"].get<bool>()) << answer.dump();
  }
}

// Flags without a command are `remat train`'s (docs/cli.md); the top
// level's own --help and --version stay its own.
TEST(RematBinary, FlagsWithoutACommandRunTrainWithThem) {
  const ProcessResult result = run_remat(
      "--model mlp --layers 2 --hidden 8 --batch 4 --steps 3 --no-baseline "
      "--threads 1 --json");
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const nlohmann::json report = nlohmann::json::parse(result.out);  // held
  EXPECT_EQ(report["steps"], 3) << result.out;
  const ProcessResult wrong = run_remat("--steps 0");
  EXPECT_EQ(wrong.exit_code, 1) << describe(wrong);
  EXPECT_NE(wrong.err.find("remat train: error: --steps"), std::string::npos)
      << describe(wrong);
  const ProcessResult help = run_remat("--help");
  EXPECT_EQ(help.exit_code, 0) << describe(help);
  EXPECT_NE(help.out.find("fit"), std::string::npos) << help.out;
  EXPECT_EQ(help.out.find("--steps"), std::string::npos)
      << "the top level's help, not train's: " << help.out;
  const ProcessResult version = run_remat("--version");
  EXPECT_EQ(version.exit_code, 0) << describe(version);
  EXPECT_NE(version.out.find("remat 0.1.0"), std::string::npos) << version.out;
}

// --max-seq-len below 4 --probe-seq-len: the model is built for
// --max-seq-len positions and no longer length is profiled; the header
// names the model's positions and the lengths profiled.
TEST(RematBinary, FitOverSeqLenProfilesNoLengthAboveTheBound) {
  const ProcessResult result = run_remat(
      "fit --over seq-len --cap 8MiB --batch 4 --max-seq-len 32 --threads 1");
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_NE(result.out.find("seq 32,"), std::string::npos) << result.out;
  EXPECT_EQ(result.out.find("seq 64"), std::string::npos) << result.out;
  EXPECT_NE(
      result.out.find("probes seq-len 16, 24 and 32 (profiled for the cost "
                      "model)"),
      std::string::npos)
      << result.out;
  const ProcessResult json = run_remat(
      "fit --over seq-len --cap 8MiB --batch 4 --max-seq-len 17 --threads 1 "
      "--json");
  ASSERT_EQ(json.exit_code, 0) << describe(json);
  const nlohmann::json report = nlohmann::json::parse(json.out);  // held
  EXPECT_EQ(report.at("profiled_sizes"), nlohmann::json::array({16, 17}))
      << json.out;
  for (const auto& answer : report.at("answers")) {
    EXPECT_EQ(answer["size"], 17) << answer.dump();
  }
}

// Where no checkpointing fits nothing, a ratio against its answer is
// undefined: "—" in the table, null in the JSON, never 0.00.
TEST(RematBinary, FitRatiosAgainstNoCheckpointingThatFitsNothingAreUndefined) {
  const std::string fit =
      "fit --over seq-len --cap 1MiB --batch 4 --max-seq-len 40 --threads 1";
  const ProcessResult result = run_remat(fit);
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_NE(
      result.out.find("(not even --probe-seq-len fits)"), std::string::npos)
      << result.out;
  EXPECT_EQ(result.out.find("0.00 "), std::string::npos) << result.out;
  for (const std::string strategy :
       {"\ncheckpoint_sequential(", "\noptimal "}) {
    const size_t begin = result.out.find(strategy);
    ASSERT_NE(begin, std::string::npos) << strategy << " in " << result.out;
    const std::string line =
        result.out.substr(begin + 1, result.out.find('\n', begin + 1) - begin);
    const size_t first = line.find("—");
    ASSERT_NE(first, std::string::npos) << line;
    EXPECT_NE(line.find("—", first + 1), std::string::npos) << line;
  }
  const ProcessResult json = run_remat(fit + " --max-time-ratio 1.5 --json");
  ASSERT_EQ(json.exit_code, 0) << describe(json);
  const nlohmann::json report = nlohmann::json::parse(json.out);  // held
  const auto& answers = report.at("answers");
  ASSERT_EQ(answers.size(), 3u) << json.out;
  EXPECT_EQ(answers[0]["size"], 0) << json.out;
  for (const auto& answer : answers) {
    EXPECT_TRUE(answer["predicted"]["time_ratio"].is_null()) << answer.dump();
    EXPECT_TRUE(answer["measured"]["time_ratio"].is_null()) << answer.dump();
  }
  EXPECT_GT(answers[2]["size"].get<int64_t>(), 0) << json.out;
}

// A small 2D U-Net: 2 levels of base width 4 on 32x32 phantoms.

// Dice values of a train --json report, in step order.
std::vector<double> dice_of(const nlohmann::json& report) {
  std::vector<double> dice;
  for (const auto& point : report.at("dice")) {
    dice.push_back(point.at("dice").get<double>());
  }
  return dice;
}

// The loss is a stage of the graph, so a measured peak is what
// planner::simulate predicts: never above it, and within 10 % below it
// (docs/graphs.md, "What is guaranteed").
void expect_within_prediction(const nlohmann::json& report) {
  const int64_t measured = report["peak_bytes"].get<int64_t>();
  const int64_t predicted = report["predicted_peak_bytes"].get<int64_t>();
  EXPECT_LE(measured, predicted) << report.dump();
  EXPECT_GE(measured, predicted - predicted / 10) << report.dump();
}

TEST(RematBinary, TrainUNetUnderABudgetKeepsItAsPredictedAndTheDiceRises) {
  const ProcessResult result = run_remat(
      "train " + kTinyUNet +
      " --steps 60 --baseline-steps 3 --budget 70% --log-every 10 --json");
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const nlohmann::json report = nlohmann::json::parse(result.out);
  EXPECT_EQ(report["strategy"], "optimal");
  EXPECT_EQ(report["over_budget_steps"], 0) << result.out;
  EXPECT_LE(
      report["peak_bytes"].get<int64_t>(),
      report["budget_bytes"].get<int64_t>());
  expect_within_prediction(report);
  EXPECT_EQ(report["baseline"]["max_loss_difference"].get<double>(), 0.0)
      << "the planned graph's losses differ from the plain run's";
  const std::vector<double> dice = dice_of(report);
  ASSERT_GE(dice.size(), 3u) << result.out;
  EXPECT_GT(dice.back(), dice.front() + 0.2)
      << "the Dice on the held-out batch did not rise: " << result.out;
  EXPECT_GT(dice.back(), 0.6) << result.out;

  const ProcessResult text =
      run_remat("train " + kTinyUNet + " --steps 4 --budget 70%");
  ASSERT_EQ(text.exit_code, 0) << describe(text);
  for (const std::string line :
       {"plan      optimal: ",
        "  peak            ",
        "kept on every step",
        "  dice            ",
        "executor  remat::PlannedGraph"}) {
    EXPECT_NE(text.out.find(line), std::string::npos) << line << text.out;
  }
}

TEST(RematBinary, TrainUNetPerBlockEncoderAndNoneRunTheirSchedules) {
  std::map<std::string, int64_t> peaks;
  for (const std::string strategy : {"none", "per-block", "encoder"}) {
    SCOPED_TRACE(strategy);
    const ProcessResult result = run_remat(
        "train " + kTinyUNet + " --strategy " + strategy +
        " --steps 2 --no-baseline --json");
    ASSERT_EQ(result.exit_code, 0) << describe(result);
    const nlohmann::json report = nlohmann::json::parse(result.out);
    EXPECT_EQ(report["strategy"], strategy);
    peaks[strategy] = report["peak_bytes"].get<int64_t>();
    expect_within_prediction(report);
  }
  EXPECT_LT(peaks["per-block"], peaks["none"]);
  EXPECT_LT(peaks["encoder"], peaks["none"]);
  const ProcessResult over = run_remat(
      "train " + kTinyUNet + " --strategy none --budget 10% --steps 1");
  EXPECT_EQ(over.exit_code, 2) << describe(over);
  EXPECT_NE(over.err.find("minimum feasible budget"), std::string::npos)
      << over.err;
}

TEST(RematBinary, FitOverImageGivesEdgesInStepsOfTwoToTheLevels) {
  constexpr int64_t kCap = 4 << 20;
  const ProcessResult result = run_remat(
      "fit --over image " + kTinyUNet + " --cap 4MiB --max-image 256 --json");
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const nlohmann::json report = nlohmann::json::parse(result.out);
  EXPECT_EQ(report["over"], "image");
  const auto& answers = report.at("answers");
  ASSERT_EQ(answers.size(), 3u) << result.out;
  const std::vector<std::string> strategies = {"none", "per-block", "optimal"};
  for (size_t i = 0; i < answers.size(); ++i) {
    const auto& answer = answers[i];
    EXPECT_EQ(answer["strategy"], strategies[i]);
    const int64_t edge = answer["size"].get<int64_t>();
    EXPECT_GT(edge, 0) << answer.dump();
    EXPECT_EQ(edge % 4, 0) << "an edge is a multiple of 2^levels";
    EXPECT_LT(edge, 256) << "the cap must bind";
    EXPECT_EQ(answer["batch"], 4);
    EXPECT_LE(answer["measured"]["peak_bytes"].get<int64_t>(), kCap);
    EXPECT_LE(answer["predicted"]["peak_bytes"].get<int64_t>(), kCap);
  }
  EXPECT_GT(answers[1]["size"], answers[0]["size"]);
  EXPECT_GE(answers[2]["size"], answers[0]["size"]);

  // Under a time limit too loose to bind, the same edges, each timed at its
  // own size in interleaved rounds (which once ran every size against the
  // labels of the last one made), per pixel: the limit compares time per
  // pixel, not per multiple of the edge.
  const ProcessResult timed = run_remat(
      "fit --over image " + kTinyUNet +
      " --cap 4MiB --max-image 256 --max-time-ratio 1000 --json");
  ASSERT_EQ(timed.exit_code, 0) << describe(timed);
  const nlohmann::json timed_report = nlohmann::json::parse(timed.out);
  EXPECT_EQ(timed_report["unit"], "megapixel");
  const auto& timed_answers = timed_report.at("answers");
  ASSERT_EQ(timed_answers.size(), 3u) << timed.out;
  for (size_t i = 0; i < timed_answers.size(); ++i) {
    const auto& answer = timed_answers[i];
    EXPECT_EQ(answer["size"], answers[i]["size"]) << answer.dump();
    const double edge = answer["size"].get<double>();
    const auto& measured = answer["measured"];
    EXPECT_GT(measured["ms_per_sample"].get<double>(), 0);
    EXPECT_DOUBLE_EQ(
        measured["ms_per_unit"].get<double>(),
        measured["ms_per_sample"].get<double>() / (edge * edge / 1e6));
  }
  for (size_t i = 1; i < timed_answers.size(); ++i) {
    const auto& answer = timed_answers[i];
    const auto& none = timed_answers[0];
    const double edge = answer["size"].get<double>() / 4;  // in 2^levels
    const double none_edge = none["size"].get<double>() / 4;
    EXPECT_NEAR(
        answer["predicted"]["time_ratio"].get<double>(),
        (answer["predicted"]["step_ms"].get<double>() / (edge * edge)) /
            (none["predicted"]["step_ms"].get<double>() /
             (none_edge * none_edge)),
        1e-9)
        << answer.dump();
  }

  const ProcessResult bad = run_remat(
      "fit --over image " + kTinyUNet + " --cap 4MiB --max-image 102");
  EXPECT_EQ(bad.exit_code, 1) << describe(bad);
  EXPECT_NE(
      bad.err.find("--max-image: must be divisible by 2^levels = 4"),
      std::string::npos)
      << bad.err;
  const ProcessResult chain =
      run_remat("fit --over image " + kTinyMlp + " --cap 4MiB");
  EXPECT_EQ(chain.exit_code, 1) << describe(chain);
  EXPECT_NE(chain.err.find("unet2d and unet3d"), std::string::npos)
      << chain.err;
}

// profile writes a U-Net's graph JSON, plan solves it with the library's
// choice (the same plan choose_plan gives), and explain shows what each
// stage reads.
TEST(RematBinary, ProfilePlanExplainAUNetGraph) {
  const fs::path file = scratch() / "tiny_unet.json";
  ProcessResult result = run_remat(
      "profile " + kTinyUNet + " --repeats 1 --out '" + file.string() + "'");
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_NE(result.out.find("reads"), std::string::npos) << result.out;
  const remat::planner::Graph graph =
      remat::planner::graph_from_json(read_file(file));
  EXPECT_FALSE(graph.is_chain());

  // A budget halfway between the least and the store-all peak.
  const int64_t budget_bytes =
      (remat::planner::min_feasible_budget_bytes(graph) +
       remat::planner::simulate(graph, remat::planner::solve_store_all(graph))
           .peak_bytes) /
      2;
  const Budget budget = Budget::bytes(budget_bytes);
  using remat::planner::StageMode;
  const std::vector<std::pair<std::string, remat::planner::Plan>> expected = {
      {"optimal", remat::choose_plan(graph, budget, BudgetOrigin::kGiven).plan},
      {"per-block",
       remat::planner::schedule_graph(
           graph,
           std::vector<StageMode>(
               static_cast<size_t>(graph.size()), StageMode::kCheckpoint))}};
  for (const auto& [strategy, plan] : expected) {
    SCOPED_TRACE(strategy);
    result = run_remat(
        "plan '" + file.string() + "' --strategy " + strategy + " --budget " +
        std::to_string(budget_bytes) + "B --json");
    if (remat::planner::simulate(graph, plan).peak_bytes > budget_bytes) {
      EXPECT_EQ(result.exit_code, 2)
          << describe(result);  // a given budget binds
      continue;
    }
    ASSERT_EQ(result.exit_code, 0) << describe(result);
    const auto report = nlohmann::json::parse(result.out);
    EXPECT_EQ(report["strategy"], strategy);
    EXPECT_EQ(report["graph"]["stages"], graph.size());
    EXPECT_EQ(report["plan"], plan.to_string());
    EXPECT_EQ(
        report["predicted"]["peak_bytes"],
        remat::planner::simulate(graph, plan).peak_bytes);
  }
  result = run_remat("plan '" + file.string() + "' --strategy encoder");
  EXPECT_EQ(result.exit_code, 1) << describe(result);
  EXPECT_NE(result.err.find("a graph file does not say"), std::string::npos)
      << result.err;
  result = run_remat("plan '" + file.string() + "' --strategy sqrt");
  EXPECT_EQ(result.exit_code, 1) << describe(result);
  EXPECT_NE(
      result.err.find("optimal, none, per-block or encoder"), std::string::npos)
      << result.err;

  result = run_remat(
      "explain " + kTinyUNet +
      " --strategy encoder --budget none --out '' "
      "--json");
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const auto report = nlohmann::json::parse(result.out);
  EXPECT_EQ(report["kind"], "graph");
  EXPECT_EQ(report["strategy"], "encoder");
  int64_t two_reads = 0;
  for (const auto& stage : report.at("stages")) {
    two_reads += stage.at("reads").size() == 2 ? 1 : 0;
  }
  EXPECT_EQ(two_reads, 2) << "one skip per level of the 2-level U-Net";
  result = run_remat("explain " + kTinyUNet + " --selective --out ''");
  EXPECT_EQ(result.exit_code, 1) << describe(result);
  EXPECT_NE(result.err.find("--selective: not supported"), std::string::npos)
      << result.err;
}

// Sizes that cannot train are refused before any work, naming the flags:
// a BatchNorm that would see one value per channel (batch 1 at the smallest
// image), an image whose first activations no tensor can hold, and a --save
// path that cannot be written.
TEST(RunCli, SizesThatCannotTrainAndUnwritableSavesAreRefusedFirst) {
  const struct {
    std::vector<std::string> arguments;
    std::string expected;
  } cases[] = {
      {{"train", "--model", "unet2d", "--batch", "1", "--image", "8"},
       "--batch 1 with --image 8 (--levels 3): the bottleneck's BatchNorm "
       "would see one value per channel"},
      {{"fit",
        "--model",
        "unet2d",
        "--over",
        "image",
        "--batch",
        "1",
        "--cap",
        "4MiB"},
       "--batch 1: --over image tries edges from 2^levels = 8"},
      {{"profile",
        "--model",
        "resnet",
        "--image",
        "8",
        "--layers",
        "1",
        "--hidden",
        "2",
        "--batch",
        "1"},
       "--batch 1 with --image 8: the last stage's BatchNorm would see one "
       "value per channel"},
      {{"train", "--model", "unet2d", "--image", "2147483648"},
       "--image 2147483648: the first block's activations would take"},
      {{"train",
        "--model",
        "mlp",
        "--layers",
        "1",
        "--hidden",
        "4",
        "--save",
        scratch().string()},
       "is a folder, expected a file"},
  };
  for (const auto& [arguments, expected] : cases) {
    SCOPED_TRACE(arguments.front() + " " + expected);
    const ProcessResult result = run_in_process(arguments);
    EXPECT_EQ(result.exit_code, 1) << describe(result);
    EXPECT_NE(result.err.find(expected), std::string::npos) << result.err;
    EXPECT_EQ(result.out.find("step "), std::string::npos) << result.out;
  }
}

// A total budget on costs that record no model state would be all
// activations without a word: refused, saying what is missing.
TEST(RunCli, ATotalBudgetNeedsTheModelStateOfItsCosts) {
  const ProcessResult result = run_in_process(
      {"plan", sample_chain_file().string(), "--budget", "total:16KiB"});
  EXPECT_EQ(result.exit_code, 1) << describe(result);
  EXPECT_NE(
      result.err.find("a total counts the model state, and these costs "
                      "record none"),
      std::string::npos)
      << result.err;
}

// Numbers past what a flag's type holds are refused, not wrapped or clamped
// by the conversion: a seed of -1 or 2^64, a search work above its bound.
TEST(RunCli, NumbersPastTheirTypeAreRefusedNotClamped) {
  const struct {
    std::vector<std::string> arguments;
    std::string expected;
  } cases[] = {
      {{"profile", "--model", "mlp", "--seed", "-1"},
       "--seed: expected an integer in [0, 18446744073709551615], got -1"},
      {{"profile", "--model", "mlp", "--seed", "18446744073709551616"},
       "got 18446744073709551616"},
      {{"plan", "--model", "mlp", "--search-work", "99999999999999999999"},
       "--search-work: Value 99999999999999999999 not in range"},
  };
  for (const auto& [arguments, expected] : cases) {
    SCOPED_TRACE(expected);
    const ProcessResult result = run_in_process(arguments);
    EXPECT_EQ(result.exit_code, 1) << describe(result);
    EXPECT_NE(result.err.find(expected), std::string::npos) << result.err;
  }
}

TEST(RunCli, UNetFlagsAreCheckedAndChainOnlyUsesRefuseAGraph) {
  ProcessResult result = run_in_process(
      {"train", "--model", "unet2d", "--levels", "3", "--image", "36"});
  EXPECT_EQ(result.exit_code, 1) << describe(result);
  EXPECT_NE(
      result.err.find("--image: must be divisible by 2^levels = 8 (--levels "
                      "3), got 36"),
      std::string::npos)
      << result.err;
  result = run_in_process(
      {"fit", "--model", "unet3d", "--over", "batch", "--cap", "8MiB"});
  EXPECT_EQ(result.exit_code, 1) << describe(result);
  EXPECT_NE(result.err.find("--over image"), std::string::npos) << result.err;
  result =
      run_in_process({"train", "--model", "mlp", "--strategy", "per-block"});
  EXPECT_EQ(result.exit_code, 1) << describe(result);
  EXPECT_NE(result.err.find("a U-Net's strategy"), std::string::npos)
      << result.err;
  // --over image is also spelled patch and image-size.
  for (const std::string over : {"patch", "image-size"}) {
    result = run_in_process(
        {"fit",
         "--model",
         "unet3d",
         "--over",
         over,
         "--max-image",
         "36",
         "--cap",
         "8MiB"});
    EXPECT_EQ(result.exit_code, 1) << describe(result);
    EXPECT_NE(result.err.find("divisible by 2^levels"), std::string::npos)
        << over << ": " << result.err;
  }
  result = run_in_process(
      {"fit", "--model", "unet3d", "--over", "volume", "--cap", "8MiB"});
  EXPECT_EQ(result.exit_code, 1) << describe(result);
  EXPECT_NE(result.err.find("volume"), std::string::npos) << result.err;
  result =
      run_in_process({"train", "--model", "unet2d", "--strategy", "uniform:2"});
  EXPECT_EQ(result.exit_code, 1) << describe(result);
  EXPECT_NE(
      result.err.find("optimal, none, per-block or encoder"), std::string::npos)
      << result.err;
}

TEST(RunCli, MistypedCommandsAndFlagsGetASuggestion) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"trian"}, "did you mean 'train'?"},
      {{"profle", "--model", "mlp"}, "did you mean 'profile'?"},
      {{"train", "--bugdet", "3MiB"}, "did you mean '--budget'?"},
      {{"train", "--step=3"}, "did you mean '--steps'?"},
      {{"fit", "--cap", "1MiB", "--max-bach", "3"},
       "did you mean '--max-batch'?"},
  };
  for (const auto& [arguments, expected] : cases) {
    const ProcessResult result = run_in_process(arguments);
    EXPECT_EQ(result.exit_code, 1) << describe(result);
    EXPECT_NE(result.err.find(expected), std::string::npos)
        << arguments.front() << ": " << result.err;
  }
  // Nothing close: no suggestion.
  const ProcessResult far = run_in_process({"train", "--zzzzzzzz"});
  EXPECT_EQ(far.exit_code, 1) << describe(far);
  EXPECT_EQ(far.err.find("did you mean"), std::string::npos) << far.err;
}

TEST(RunCli, PlanWithoutAChainSaysWhereOneComesFrom) {
  const ProcessResult result = run_in_process({"plan"});
  EXPECT_EQ(result.exit_code, 1) << describe(result);
  EXPECT_NE(result.err.find("remat profile --out"), std::string::npos)
      << result.err;
  const ProcessResult help = run_in_process({"plan", "--help"});
  EXPECT_EQ(help.exit_code, 0) << describe(help);
  EXPECT_EQ(help.out.find("REQUIRED"), std::string::npos) << help.out;
}

TEST(RunCli, FitRefusesBadFlagValuesNamingThem) {
  struct Case {
    std::vector<std::string> arguments;
    std::vector<std::string> expected;
  };
  const std::vector<Case> cases = {
      {{"fit", "--cap", "50%"}, {"--cap", "'50%'"}},
      {{"fit", "--cap", "none"}, {"--cap", "'none'", "no limit"}},
      {{"fit", "--cap", "1MiB", "--over", "width"}, {"--over", "width"}},
      {{"fit", "--cap", "1MiB", "--over", "seq-len", "--model", "mlp"},
       {"--over seq-len", "--model mlp"}},
      {{"fit",
        "--cap",
        "1MiB",
        "--over",
        "seq-len",
        "--probe-seq-len",
        "32",
        "--max-seq-len",
        "16"},
       {"--max-seq-len", "32", "16"}},
  };
  for (const Case& test : cases) {
    const ProcessResult result = run_in_process(test.arguments);
    EXPECT_EQ(result.exit_code, 1) << describe(result);
    for (const std::string& text : test.expected) {
      EXPECT_NE(result.err.find(text), std::string::npos)
          << "missing '" << text << "' in: " << result.err;
    }
    EXPECT_TRUE(result.out.empty()) << result.out;
  }
}

TEST(RematBinary, BenchWritesCsvMatchingItsRowsAndAPlot) {
  const fs::path out = scratch() / "bench";
  const ProcessResult result = run_remat(
      "bench " + kTinyMlp +
      " --budgets 50%,100% --strategies optimal,uniform:2 --warmup 0 "
      "--repeats 2 --json --out '" +
      out.string() + "'");
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const auto report = nlohmann::json::parse(result.out);
  const auto& rows = report["rows"];
  ASSERT_EQ(rows.size(), 4u);  // optimal x 2 budgets, uniform:2, none
  std::istringstream csv(read_file(out / "bench.csv"));
  std::string line;
  std::getline(csv, line);
  EXPECT_EQ(line.rfind("strategy,budget,budget_bytes,", 0), 0u) << line;
  for (const auto& row : rows) {
    ASSERT_TRUE(std::getline(csv, line));
    EXPECT_EQ(line.rfind(row["strategy"].get<std::string>() + ",", 0), 0u)
        << line;
    EXPECT_NE(
        line.find(
            "," + std::to_string(row["measured_peak_bytes"].get<int64_t>()) +
            ","),
        std::string::npos)
        << line;
    EXPECT_EQ(row["grad_max_diff"].get<double>(), 0.0) << row.dump();
  }
  EXPECT_FALSE(std::getline(csv, line)) << "extra CSV row: " << line;
  const std::string summary = read_file(out / "README.md");
  EXPECT_NE(summary.find("bench.csv"), std::string::npos);
  if (remat::cli::gnuplot_available()) {
    EXPECT_TRUE(fs::exists(out / "plot.png"));
    EXPECT_GT(fs::file_size(out / "plot.png"), 1000u);
    EXPECT_NE(summary.find("](plot.png)"), std::string::npos) << summary;
  }
}

// A U-Net is swept as a graph: its own strategies by default, every row's
// gradients equal to no checkpointing's, each measured peak at most its
// prediction (the loss value and its seed, 8 bytes, aside).
TEST(RematBinary, BenchSweepsAUNetGraph) {
  const fs::path out = scratch() / "bench_unet";
  const ProcessResult result = run_remat(
      "bench " + kTinyUNet +
      " --budgets 80%,100% --warmup 0 --repeats 2 --json --out '" +
      out.string() + "'");
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const auto report = nlohmann::json::parse(result.out);
  std::vector<std::string> strategies;
  for (const auto& row : report.at("rows")) {
    strategies.push_back(row["strategy"].get<std::string>());
    ASSERT_EQ(row["status"], "ok") << row.dump();
    EXPECT_EQ(row["grad_max_diff"].get<double>(), 0.0) << row.dump();
    const int64_t predicted = row["predicted_peak_bytes"].get<int64_t>();
    const int64_t measured = row["measured_peak_bytes"].get<int64_t>();
    EXPECT_LE(measured, predicted) << row.dump();
    EXPECT_GE(measured, predicted - predicted / 10) << row.dump();
  }
  EXPECT_EQ(
      strategies,
      (std::vector<std::string>{
          "optimal", "optimal", "per-block", "encoder", "none"}));
  const ProcessResult chain_strategy = run_remat(
      "bench " + kTinyUNet + " --strategies sqrt --out '" + out.string() + "'");
  EXPECT_EQ(chain_strategy.exit_code, 1) << describe(chain_strategy);
  EXPECT_NE(
      chain_strategy.err.find(
          "optimal, none, per-block or encoder, got 'sqrt'"),
      std::string::npos)
      << chain_strategy.err;
}

// ---------------------------------------------------------------- data
// parallel

// A tiny MLP without dropout: ranks on slices of the batch then train
// exactly like one process on the whole batch.
const std::string kParallelMlpModel =
    "--model mlp --layers 3 --hidden 16 --batch 8 --dropout 0 --threads 1 "
    "--steps 3 --log-every 1";
const std::string kParallelMlp = kParallelMlpModel + " --strategy uniform:2";

#if REMAT_WITH_DISTRIBUTED
std::vector<torch::Tensor> load_parameters(const fs::path& path) {
  std::vector<torch::Tensor> values;
  torch::load(values, path.string());
  return values;
}

/// The largest over tensors of max |a - b| / max |b|: how far `actual`'s
/// parameters are from `expected`'s, relative to each tensor's scale.
double max_relative_difference(
    const std::vector<torch::Tensor>& expected,
    const std::vector<torch::Tensor>& actual) {
  EXPECT_EQ(actual.size(), expected.size());
  EXPECT_FALSE(expected.empty());
  double worst = 0;
  for (size_t index = 0; index < std::min(expected.size(), actual.size());
       ++index) {
    const double scale = expected[index].abs().max().item<double>();
    const double difference =
        (actual[index] - expected[index]).abs().max().item<double>();
    worst = std::max(worst, difference / std::max(scale, 1e-30));
  }
  return worst;
}

/// Trains `flags` with --save to `name`.pt and returns the parameters.
std::vector<torch::Tensor> train_and_load(
    const std::string& flags, const std::string& name) {
  const fs::path path = scratch() / (name + ".pt");
  const ProcessResult result =
      run_remat("train " + flags + " --save '" + path.string() + "'");
  EXPECT_EQ(result.exit_code, 0) << describe(result);
  return result.exit_code == 0 ? load_parameters(path)
                               : std::vector<torch::Tensor>{};
}

TEST(RematBinary, TwoLocalWorkersTrainLikeOneOnTheWholeBatch) {
  const fs::path two = scratch() / "two_workers.pt";
  ProcessResult result = run_remat(
      "train " + kParallelMlp + " --nproc 2 --save '" + two.string() + "'");
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_NE(result.out.find("parallel  2 ranks"), std::string::npos)
      << result.out;
  // Only rank 0 prints: one summary, one line per step.
  EXPECT_EQ(result.out.find("summary"), result.out.rfind("summary"))
      << result.out;
  EXPECT_EQ(result.out.find("step 3/3"), result.out.rfind("step 3/3"))
      << result.out;
  const auto whole = train_and_load(kParallelMlp + " --nproc 1", "one_worker");
  // Summing the halves' gradients rounds differently from one sum over the
  // batch; AdamW's first steps divide by |gradient|, which amplifies that,
  // but not beyond 1e-6 of each tensor's largest magnitude here.
  const double difference =
      max_relative_difference(whole, load_parameters(two));
  EXPECT_LE(difference, 1e-6);
}

// Sharded, in both checkpoint modes and under a plan: the same parameters as
// one worker on the whole batch; one sharded worker is exactly one worker.
TEST(RematBinary, ShardedWorkersTrainLikeOneOnTheWholeBatch) {
  const auto whole = train_and_load(kParallelMlp + " --nproc 1", "whole");
  for (const std::string checkpointing :
       {"--strategy uniform:2 --mode nonreentrant",
        "--strategy uniform:2 --mode reentrant",
        "--strategy sqrt"}) {
    SCOPED_TRACE(checkpointing);
    const auto sharded = train_and_load(
        kParallelMlpModel + " " + checkpointing + " --nproc 2 --shard",
        "sharded");
    EXPECT_LE(max_relative_difference(whole, sharded), 1e-6);
  }
  const auto one_shard =
      train_and_load(kParallelMlp + " --nproc 1 --shard", "one_shard");
  EXPECT_EQ(max_relative_difference(whole, one_shard), 0.0);
}

// Parameters + activations per worker: sharding over 2 workers saves at
// least 40 % of the parameter bytes (half the parameters and gradients,
// less the largest stage's gathered parameters and gradients); the plan and
// the measured peak agree to the byte.
TEST(RematBinary, ShardingTwoWorkersCutsTheirPeakByTheParameterShards) {
  const std::string flags =
      "train --model mlp --layers 6 --hidden 256 --batch 16 --dropout 0 "
      "--threads 1 --steps 4 --strategy none --json --nproc 2";
  ProcessResult result = run_remat(flags);
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const auto plain = nlohmann::json::parse(result.out);
  result = run_remat(flags + " --shard");
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const auto sharded = nlohmann::json::parse(result.out);
  EXPECT_TRUE(sharded["sharded"].get<bool>());
  const auto parameters = plain["parameter_bytes"].get<int64_t>();
  EXPECT_EQ(sharded["parameter_bytes"].get<int64_t>(), parameters);
  const auto plain_peak = plain["peak_with_parameters_bytes"].get<int64_t>();
  const auto sharded_peak =
      sharded["peak_with_parameters_bytes"].get<int64_t>();
  EXPECT_LE(sharded_peak, plain_peak - parameters * 4 / 10)
      << "sharded " << sharded_peak << ", unsharded " << plain_peak
      << ", parameters " << parameters;
  // Sharded, the budget's units include the resident shards: the prediction
  // is the measured peak (within the 8 bytes of the loss).
  EXPECT_NEAR(
      static_cast<double>(sharded["peak_bytes"].get<int64_t>()),
      static_cast<double>(sharded["predicted_peak_bytes"].get<int64_t>()),
      64.0);
}

// explain --shard N plans one rank: its resident shards and each stage's
// gathered parameters are in the chain, the budget and the report.
TEST(RematBinary, ExplainShardShowsParametersAndActivations) {
  const std::string flags =
      "explain --model mlp --layers 3 --hidden 64 --batch 8 --strategy none "
      "--out '' --json";
  ProcessResult result = run_remat(flags);
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const auto plain = nlohmann::json::parse(result.out);
  result = run_remat(flags + " --shard 2");
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const auto sharded = nlohmann::json::parse(result.out);
  EXPECT_EQ(plain["resident_bytes"].get<int64_t>(), 0);
  // Linear(64, 64) + bias, halved, with its gradient: 2 * 4160 * 4 / 2 per
  // hidden stage; the first stage's input width is the task's.
  EXPECT_GT(sharded["resident_bytes"].get<int64_t>(), 3 * 4160 * 4);
  EXPECT_EQ(sharded["stages"][1]["gathered_bytes"].get<int64_t>(), 4160 * 4);
  EXPECT_GT(
      sharded["predicted"]["peak_bytes"].get<int64_t>(),
      sharded["resident_bytes"].get<int64_t>());
  const std::string table = sharded["table"].get<std::string>();
  EXPECT_NE(table.find("gathered"), std::string::npos) << table;
  EXPECT_NE(table.find("parameters at the peak"), std::string::npos) << table;
  EXPECT_EQ(
      plain["table"].get<std::string>().find("gathered"), std::string::npos);
  result = run_remat("explain --model mlp --batch 9 --shard 2 --out ''");
  EXPECT_EQ(result.exit_code, 1) << describe(result);
  EXPECT_NE(
      result.err.find("--batch: the global batch must divide by --shard 2"),
      std::string::npos)
      << describe(result);
}

TEST(RematBinary, ShardRefusesToRunWithoutWorkers) {
  const ProcessResult result = run_remat("train " + kParallelMlp + " --shard");
  EXPECT_EQ(result.exit_code, 1) << describe(result);
  EXPECT_NE(
      result.err.find("--shard: shards over a group of workers"),
      std::string::npos)
      << describe(result);
}

TEST(RematBinary, ParallelTrainRefusesABatchThatDoesNotDivide) {
  ProcessResult result = run_remat("train " + kParallelMlp + " --nproc 3");
  EXPECT_EQ(result.exit_code, 1) << describe(result);
  EXPECT_NE(
      result.err.find("--batch: the global batch must divide by --nproc 3, "
                      "got 8"),
      std::string::npos)
      << describe(result);
  result = run_remat("train " + kParallelMlp + " --rank 0");
  EXPECT_EQ(result.exit_code, 1) << describe(result);
  EXPECT_NE(
      result.err.find("--rank: expected --world-size too"), std::string::npos)
      << describe(result);
}

// What trains in one process only (a U-Net, the dynamic mode) is refused by
// the launcher, once, before it starts any worker.
TEST(RematBinary, ParallelTrainRefusesOneProcessModesBeforeLaunching) {
  for (const std::string flags :
       {"--model unet2d --image 16 --batch 2 --nproc 2",
        "--model mlp --layers 2 --hidden 8 --batch 4 --recompute dynamic "
        "--nproc 2"}) {
    SCOPED_TRACE(flags);
    const ProcessResult result = run_remat("train " + flags + " --steps 2");
    EXPECT_EQ(result.exit_code, 1) << describe(result);
    const std::string refusal = "--nproc, --rank and --shard: not supported";
    const size_t first = result.err.find(refusal);
    EXPECT_NE(first, std::string::npos) << describe(result);
    EXPECT_EQ(result.err.find(refusal, first + 1), std::string::npos)
        << describe(result);
    EXPECT_EQ(result.err.find("worker rank"), std::string::npos)
        << describe(result);
    EXPECT_TRUE(result.out.empty()) << result.out;
  }
}

TEST(RematBinary, ALocalWorkerThatFailsMakesTheLaunchFail) {
  const ProcessResult result =
      run_remat("train --model mlp --hidden 0 --batch 8 --nproc 2");
  EXPECT_EQ(result.exit_code, 1) << describe(result);
  EXPECT_NE(
      result.err.find("--hidden: expected a positive integer, got 0"),
      std::string::npos)
      << describe(result);
  EXPECT_NE(
      result.err.find("remat train: error: worker rank "), std::string::npos)
      << describe(result);
}

// Workers' exit codes carry through the launch: an infeasible budget is
// exit 2 with --nproc as without.
TEST(RematBinary, ALaunchExitsWithTheCodeOfItsFailingWorker) {
  const ProcessResult result =
      run_remat("train " + kParallelMlpModel + " --budget 1B --nproc 2");
  EXPECT_EQ(result.exit_code, 2) << describe(result);
  EXPECT_NE(
      result.err.find("the minimum feasible budget is"), std::string::npos)
      << describe(result);
  EXPECT_NE(
      result.err.find("remat train: error: worker rank "), std::string::npos)
      << describe(result);
}

/// A remat process started in the background, its streams in files.
struct Background {
  pid_t pid = -1;
  fs::path out;
  fs::path err;
};

Background start_remat(
    const std::vector<std::string>& arguments, const std::string& name) {
  Background process;
  process.out = scratch() / (name + ".out");
  process.err = scratch() / (name + ".err");
  std::vector<std::string> argv_strings = {REMAT_CLI_PATH};
  argv_strings.insert(argv_strings.end(), arguments.begin(), arguments.end());
  std::vector<char*> argv;
  for (std::string& argument : argv_strings) {
    argv.push_back(argument.data());
  }
  argv.push_back(nullptr);
  const std::string out_path = process.out.string();
  const std::string err_path = process.err.string();
  process.pid = ::fork();
  if (process.pid == 0) {
    const int out =
        ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err =
        ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(out, 1);
    ::dup2(err, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return process;
}

/// Waits up to `seconds` for `pid`; its exit code, or -1 if it is still
/// running (then it is killed) or was killed by a signal.
int wait_for(pid_t pid, double seconds) {
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  return -1;
}

TEST(RematBinary, AKilledWorkerMakesTheOtherExitWithinTheTimeout) {
  const std::string port = std::to_string(remat::distributed::find_free_port());
  const std::vector<std::string> common = {
      "train", "--model",       "mlp",       "--layers",
      "3",     "--hidden",      "16",        "--batch",
      "8",     "--dropout",     "0",         "--threads",
      "1",     "--steps",       "1000000",   "--log-every",
      "1",     "--strategy",    "uniform:2", "--world-size",
      "2",     "--master-port", port,        "--timeout",
      "10"};
  std::vector<std::string> rank0 = common, rank1 = common;
  rank0.insert(rank0.end(), {"--rank", "0"});
  rank1.insert(rank1.end(), {"--rank", "1"});
  const Background survivor = start_remat(rank0, "survivor");
  const Background victim = start_remat(rank1, "victim");
  // Training is under way once rank 0 has printed a few steps.
  const auto started = std::chrono::steady_clock::now();
  while (read_file(survivor.out).find("step 3/") == std::string::npos &&
         std::chrono::steady_clock::now() - started <
             std::chrono::seconds(60)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_NE(read_file(survivor.out).find("step 3/"), std::string::npos)
      << read_file(survivor.out) << read_file(survivor.err)
      << read_file(victim.err);
  ::kill(victim.pid, SIGKILL);
  ::waitpid(victim.pid, nullptr, 0);
  const auto killed = std::chrono::steady_clock::now();
  const int code = wait_for(survivor.pid, 25);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed)
          .count();
  const std::string err = read_file(survivor.err);
  EXPECT_EQ(code, 1) << err;
  EXPECT_LT(seconds, 10) << err;
  EXPECT_NE(err.find("failed on rank 0 of 2"), std::string::npos) << err;
}

#else

// Built without remat::distributed: the flags that need it are refused,
// naming themselves and the build option, and nothing is trained.
TEST(RematBinary, WithoutDistributedTheParallelFlagsSayWhy) {
  for (const std::string flags :
       {"train --model mlp --nproc 2",
        "train --model mlp --rank 0 --world-size 2",
        "train --model mlp --shard",
        "explain --model mlp --shard 2"}) {
    SCOPED_TRACE(flags);
    const ProcessResult result = run_remat(flags + " --threads 1");
    EXPECT_EQ(result.exit_code, 1) << describe(result);  // a UsageError
    EXPECT_TRUE(result.out.empty()) << result.out;       // nothing trained
    const std::string flag = flags.substr(flags.find("--", flags.find("mlp")));
    EXPECT_NE(
        result.err.find(
            flag.substr(0, flag.find(' ')) +
            ": this remat was built without distributed training"),
        std::string::npos)
        << result.err;
    EXPECT_NE(result.err.find("REMAT_BUILD_DISTRIBUTED=OFF"), std::string::npos)
        << result.err;
  }
}
#endif  // REMAT_WITH_DISTRIBUTED

// A failed write must not leave a truncated file behind, nor destroy the
// file that was there (write_text_file writes --out, --plan-out, bench's
// and explain's reports).
TEST(RunCli, AFailedWriteLeavesThePreviousFileWhole) {
  const fs::path path = scratch() / "atomic.json";
  { std::ofstream(path) << "old"; }
  // A 1 KiB file size limit makes the 4 KiB write fail half way (EFBIG).
  struct rlimit saved {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  const auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit limited = saved;
  limited.rlim_cur = 1024;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limited), 0);
  bool threw = false;
  try {
    remat::cli::write_text_file("--out", path.string(), std::string(4096, 'x'));
  } catch (const remat::cli::UsageError& error) {
    threw = true;
    EXPECT_NE(std::string(error.what()).find(path.string()), std::string::npos);
  }
  ::setrlimit(RLIMIT_FSIZE, &saved);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_TRUE(threw);
  EXPECT_EQ(read_file(path), "old");  // not 1024 'x'
  for (const auto& entry : fs::directory_iterator(scratch())) {
    EXPECT_EQ(
        entry.path().filename().string().find("atomic.json.tmp"),
        std::string::npos)
        << entry.path();
  }
}

// Output that never reached stdout (a full disk, a closed pipe) is a
// failure: `remat plan ... --json > /dev/full` must not exit 0.
TEST(RunCli, AFailedWriteToStdoutExitsOne) {
  const std::string chain = sample_chain_file().string();
  std::vector<const char*> argv = {"remat", "plan", chain.c_str(), "--json"};
  std::ostringstream out, err;
  out.setstate(std::ios::badbit);  // every write fails, as on /dev/full
  const int code = remat::cli::run_cli(
      static_cast<int>(argv.size()), argv.data(), {out, err, false});
  EXPECT_EQ(code, 1) << err.str();
  EXPECT_NE(err.str().find("stdout"), std::string::npos) << err.str();
}

// An output folder that cannot be made is refused before any measurement
// (as train's --save is): bench must not measure every strategy and then
// fail, nor profile and explain profile first.
TEST(RunCli, UnwritableOutputsAreRefusedBeforeAnyWork) {
  const fs::path file = scratch() / "a_file_not_a_folder";
  { std::ofstream(file) << "x"; }
  const std::string below = (file / "sub").string();
  const std::vector<std::string> tiny = {
      "--model", "mlp", "--layers", "2", "--hidden", "4", "--batch", "2"};
  const auto with = [&](std::vector<std::string> head,
                        const std::vector<std::string>& tail) {
    head.insert(head.end(), tiny.begin(), tiny.end());
    head.insert(head.end(), tail.begin(), tail.end());
    return head;
  };
  const std::vector<std::string> quick = {"--repeats", "1", "--warmup", "0"};
  std::vector<std::vector<std::string>> cases = {
      with({"bench"}, quick), with({"profile"}, quick), with({"explain"}, {})};
  cases[0].insert(cases[0].end(), {"--strategies", "none", "--out", below});
  cases[1].insert(cases[1].end(), {"--out", below + "/chain.json"});
  cases[2].insert(cases[2].end(), {"--out", below});
  for (const auto& arguments : cases) {
    const ProcessResult result = run_in_process(arguments);
    EXPECT_EQ(result.exit_code, 1) << describe(result);
    EXPECT_NE(result.err.find("--out"), std::string::npos) << describe(result);
    EXPECT_TRUE(result.out.empty()) << describe(result);  // nothing measured
  }
}

// Model sizes far beyond any machine are refused by name, not with
// std::bad_alloc, "cannot create std::vector larger than max_size()", a
// LibTorch "Storage size calculation overflowed", a hang building 2^31
// layers, or (resnet, --image near 2^63) a message about "--batch 1" when
// --batch is 2.
TEST(RunCli, HugeModelSizesAreRefusedNamingTheFlag) {
  struct Case {
    std::vector<std::string> arguments;
    std::string flag;
    std::string value;
  };
  const std::vector<Case> cases = {
      {{"profile", "--model", "mlp", "--layers", "99999999999"},
       "--layers",
       "99999999999"},
      {{"profile", "--model", "mlp", "--layers", "2147483648"},
       "--layers",
       "2147483648"},
      {{"profile", "--model", "mlp", "--hidden", "9223372036854775807"},
       "--hidden",
       "9223372036854775807"},
      {{"profile", "--model", "mlp", "--batch", "9223372036854775807"},
       "--batch",
       "9223372036854775807"},
      {{"profile",
        "--model",
        "resnet",
        "--batch",
        "2",
        "--image",
        "9223372036854775800"},
       "--image",
       "9223372036854775800"},
  };
  for (const Case& test : cases) {
    const ProcessResult result = run_in_process(test.arguments);
    EXPECT_EQ(result.exit_code, 1) << describe(result);
    EXPECT_NE(result.err.find(test.flag), std::string::npos)
        << describe(result);
    EXPECT_NE(result.err.find(test.value), std::string::npos)
        << describe(result);
  }
}

// File names are bytes, not UTF-8: a --json report naming one must still be
// printed (nlohmann's dump() throws type_error 316 on invalid UTF-8, which
// reached the user as "remat plan: error: [json.exception.type_error.316]").
TEST(RunCli, JsonReportsNameNonUtf8PathsWithoutFailing) {
  const fs::path chain = scratch() / "\xff-chain.json";
  fs::copy_file(
      sample_chain_file(), chain, fs::copy_options::overwrite_existing);
  for (const std::vector<std::string>& arguments :
       std::vector<std::vector<std::string>>{
           {"plan", chain.string(), "--json"},
           {"explain", chain.string(), "--json", "--out", ""}}) {
    const ProcessResult result = run_in_process(arguments);
    EXPECT_EQ(result.exit_code, 0) << describe(result);
    EXPECT_EQ(result.err.find("type_error"), std::string::npos)
        << describe(result);
    nlohmann::json report;
    EXPECT_NO_THROW(report = nlohmann::json::parse(result.out)) << result.out;
  }
}

// The CLI refuses a unit-less budget ("512": bytes or MiB?), but a trailing
// newline or a blank after "total:" slipped through as bytes; and its
// "did you mean" named forms that --budget itself refuses.
TEST(RunCli, UnitlessBudgetsAreRefusedHoweverSpacedAndHintsAreValid) {
  const std::string chain = sample_chain_file().string();
  for (const std::string& budget :
       {std::string("512\n"), std::string("total: 512")}) {
    const ProcessResult result =
        run_in_process({"plan", chain, "--budget", budget});
    EXPECT_EQ(result.exit_code, 1) << describe(result);
    EXPECT_NE(result.err.find("has no unit"), std::string::npos)
        << describe(result);
  }
  for (const std::string& budget :
       {std::string("1..2"),
        std::string("99999999999999999999"),
        std::string("1.0000001")}) {
    const ProcessResult result =
        run_in_process({"plan", chain, "--budget", budget});
    EXPECT_EQ(result.exit_code, 1) << describe(result);
    EXPECT_EQ(result.err.find(budget + "MiB"), std::string::npos)
        << describe(result);
    EXPECT_EQ(result.err.find(budget + "B (bytes)"), std::string::npos)
        << describe(result);
  }
}

// A chain file's costs are measured already: explain refuses, by name, every
// flag that shapes the profiled model (none is silently ignored).
TEST(RunCli, ExplainRefusesModelFlagsWithAChainFile) {
  const std::string chain = sample_chain_file().string();
  for (const std::vector<std::string>& extra :
       std::vector<std::vector<std::string>>{
           {"--model", "resnet"},
           {"--selective"},
           {"--precision", "bf16"},
           {"--batch", "64"},
           {"--shard", "2"}}) {
    std::vector<std::string> arguments = {"explain", chain, "--out", ""};
    arguments.insert(arguments.end(), extra.begin(), extra.end());
    const ProcessResult result = run_in_process(arguments);
    EXPECT_EQ(result.exit_code, 1) << describe(result);
    EXPECT_NE(result.err.find(extra[0]), std::string::npos) << describe(result);
  }
}

// A diverging run (a learning rate far too large) stops with an error at
// the first non-finite loss instead of training on NaN and exiting 0; a
// learning rate no float holds is refused by name.
TEST(RunCli, TrainStopsAtANonFiniteLoss) {
  const ProcessResult diverged = run_in_process(
      {"train",
       "--model",
       "mlp",
       "--layers",
       "2",
       "--hidden",
       "4",
       "--batch",
       "2",
       "--steps",
       "4",
       "--lr",
       "1e30"});
  EXPECT_EQ(diverged.exit_code, 1) << describe(diverged);
  EXPECT_NE(diverged.err.find("training diverged"), std::string::npos)
      << describe(diverged);
  const ProcessResult huge = run_in_process(
      {"train",
       "--model",
       "mlp",
       "--layers",
       "2",
       "--steps",
       "1",
       "--lr",
       "1e39"});
  EXPECT_EQ(huge.exit_code, 1) << describe(huge);
  EXPECT_NE(huge.err.find("--lr"), std::string::npos) << describe(huge);
}

// --max-time-ratio is named only where the time limit applied: never for no
// checkpointing, nor when no checkpointing fits nothing (no reference).
TEST(RematBinary, FitBlamesTheTimeLimitOnlyWhereItApplied) {
  const ProcessResult result = run_remat(
      "fit --over seq-len --cap 1B --batch 2 --probe-seq-len 8 "
      "--max-seq-len 64 --max-time-ratio 1.3 --threads 1");
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_EQ(result.out.find("--max-time-ratio, from"), std::string::npos)
      << result.out;
  EXPECT_NE(
      result.out.find("(not even --probe-seq-len fits)"), std::string::npos)
      << result.out;
}

// What follows `--` is not a flag, so nothing is offered as its spelling.
TEST(RunCli, NothingAfterADoubleDashIsTakenForAMisspeltFlag) {
  for (const std::vector<std::string>& arguments :
       std::vector<std::vector<std::string>>{
           {"--", "fit"}, {"train", "--", "--steps", "1"}}) {
    const ProcessResult result = run_in_process(arguments);
    EXPECT_EQ(result.exit_code, 1) << describe(result);
    EXPECT_EQ(result.err.find("did you mean"), std::string::npos)
        << describe(result);
  }
}

}  // namespace
