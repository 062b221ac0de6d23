// common.cpp: flag registration and file helpers shared by the commands.
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include <unistd.h>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <remat/budget.h>

#include "cli_error.h"
#include "commands.h"
#include "strategy.h"

namespace remat::cli {

void add_budget_flags(CLI::App& command, BudgetFlags& flags) {
  command
      .add_option(
          "--budget",
          flags.budget,
          "Memory budget: activations + input in bytes with a unit (512MiB, "
          "1GiB, 300MB, 1000000B), a percentage of the predicted "
          "no-checkpoint peak (50%), the whole step with parameters, "
          "gradients and optimizer state (total:2GiB), or none. "
          "Binds sqrt, uniform:K and none only when given; the default is "
          "raised to the minimum feasible budget when below it")
      ->check(budget_validator())
      ->capture_default_str();
  command
      .add_option(
          "--strategy",
          flags.strategy,
          "optimal (rotor DP), chen (greedy), sqrt, uniform:K "
          "(checkpoint_sequential, K segments) or none; a U-Net: optimal, "
          "none, per-block (every stage checkpointed) or encoder (the "
          "encoder's stages checkpointed)")
      ->check(parsing_validator(
          [](const std::string& text) {
            if (text != "per-block" && text != "encoder") {
              planner::Strategy::parse(text);
            }
          },
          "STRATEGY"))
      ->capture_default_str();
  command
      .add_option(
          "--slots",
          flags.slots,
          "Memory slots of the optimal solver (more: closer to exact, slower)")
      ->check(CLI::Range(int64_t{1}, int64_t{1000000}))
      ->capture_default_str();
  add_search_work_flag(command, flags.search_work);
}

void add_search_work_flag(CLI::App& command, int64_t& search_work) {
  command
      .add_option(
          "--search-work",
          search_work,
          "How long the graph solvers (a U-Net, a graph file) may search, in "
          "their units of work; the default takes 30-50 ms of one core on a "
          "U-Net, 1000x that lets the exact search finish on larger graphs")
      // An upper bound below INT64_MAX: a larger number, clamped to
      // INT64_MAX by the conversion, is refused instead of taken.
      ->check(CLI::Range(int64_t{0}, int64_t{1000000000000000000}))
      ->capture_default_str();
}

CLI::Validator finite_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        char* end = nullptr;
        const double value = std::strtod(text.c_str(), &end);
        if (end == text.c_str() || *end != '\0' || !std::isfinite(value)) {
          return "expected a finite number, got " + text;
        }
        return "";
      },
      "FINITE");
}

void add_run_flags(CLI::App& command, int64_t& threads, uint64_t& seed) {
  command.add_option("--threads", threads, "LibTorch intra-op threads")
      ->check(CLI::Range(int64_t{1}, int64_t{1024}))
      ->capture_default_str();
  command.add_option("--seed", seed, "Seed of initialisation, data, dropout")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            // The conversion would wrap "-1" and clamp 2^64 and above.
            uint64_t value = 0;
            const char* end = text.data() + text.size();
            const auto [stop, error] = std::from_chars(text.data(), end, value);
            if (error != std::errc() || stop != end) {
              return "expected an integer in [0, 18446744073709551615], got " +
                     text;
            }
            return "";
          },
          "UINT"))
      ->capture_default_str();
}

void add_precision_flag(CLI::App& command, std::string& precision) {
  command
      .add_option(
          "--precision",
          precision,
          "fp32, or bf16: CPU autocast (matrix products in bfloat16, "
          "parameters fp32). fp16 is CUDA only and refused here")
      ->check(parsing_validator(
          [](const std::string& text) { parse_precision(text); }, "PRECISION"))
      ->capture_default_str();
}

void add_selective_flag(CLI::App& command, bool& selective) {
  command.add_flag(
      "--selective",
      selective,
      "Profile every stage also as a selective checkpoint "
      "(save_compute_intensive: keep matmul outputs, recompute the rest), so "
      "the optimal plan may pick that third way per stage");
}

Policy selective_policy(bool selective) {
  return selective ? policies::save_compute_intensive() : Policy{};
}

Precision cpu_precision(const std::string& text) {
  Precision precision = Precision::kFloat32;
  try {
    precision = parse_precision(text);
  } catch (const c10::Error& error) {
    throw UsageError(
        std::string("--precision: ") + error.what_without_backtrace());
  }
  if (precision == Precision::kFloat16) {
    throw UsageError(
        "--precision: fp16 autocast is CUDA only and the remat tool runs on "
        "CPU; expected fp32 or bf16, got '" +
        text + "'");
  }
  return precision;
}

void apply_threads(int64_t threads) {
  if (threads < 1) {
    throw UsageError(
        "--threads: expected a positive integer, got " +
        std::to_string(threads));
  }
  torch::set_num_threads(static_cast<int>(threads));
}

std::string read_regular_file(
    const std::string& flag, const std::string& path) {
  std::error_code error;
  const auto status = std::filesystem::status(path, error);
  if (std::filesystem::is_directory(status)) {
    throw UsageError(flag + ": '" + path + "' is a directory; expected a file");
  }
  if (std::filesystem::exists(status) &&
      !std::filesystem::is_regular_file(status)) {
    throw UsageError(
        flag + ": '" + path +
        "' is not a regular file (a FIFO, socket or device); expected a file");
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    throw UsageError(
        flag + ": cannot open '" + path + "': " + std::strerror(errno));
  }
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

StageCosts read_costs_file(const std::string& flag, const std::string& path) {
  const std::string text = read_regular_file(flag, path);
  // A graph's stages list what they read; a chain's do not. A file where
  // only some stages do is read as a graph, whose reader names the stage
  // that lacks its list.
  const nlohmann::json json = nlohmann::json::parse(text, nullptr, false);
  const bool graph = !json.is_discarded() && json.is_object() &&
                     json.contains("stages") && json["stages"].is_array() &&
                     std::any_of(
                         json["stages"].begin(),
                         json["stages"].end(),
                         [](const nlohmann::json& stage) {
                           return stage.is_object() && stage.contains("inputs");
                         });
  try {
    if (graph) {
      // A graph whose stages each read the one before is a chain: planned
      // as one, every chain strategy applies (and chains too long for the
      // exact solvers keep the segment strategies).
      planner::Graph costs = planner::graph_from_json(text);
      if (costs.is_chain()) {
        return costs.as_chain();
      }
      return costs;
    }
    return planner::chain_from_json(text);
  } catch (const std::invalid_argument& error) {
    throw UsageError(
        flag + ": '" + path + "' is not a valid " +
        (graph ? "graph" : "chain") + " JSON: " + error.what());
  }
}

std::string kind_of(const StageCosts& costs) {
  return std::holds_alternative<planner::Graph>(costs) ? "graph" : "chain";
}

namespace {

// A graph strategy for `costs` (a graph), with what a file lacks refused.
GraphStrategy graph_strategy(const std::string& text, int64_t encoder_stages) {
  const GraphStrategy strategy = parse_graph_strategy(text);
  if (strategy == GraphStrategy::kEncoder && encoder_stages <= 0) {
    throw UsageError(
        "--strategy encoder: needs the model's encoder (--model unet2d or "
        "unet3d); a graph file does not say which stages it is");
  }
  return strategy;
}

}  // namespace

namespace {

// The --strategy of a chain; a U-Net's strategy or an unknown one is a
// UsageError naming the flag.
planner::Strategy chain_strategy(const std::string& text) {
  if (text == "per-block" || text == "encoder") {
    throw UsageError(
        "--strategy " + text +
        ": a U-Net (graph) strategy; a chain is planned with optimal, chen, "
        "sqrt, uniform:K or none");
  }
  try {
    return planner::Strategy::parse(text);
  } catch (const std::invalid_argument& error) {
    throw UsageError(std::string("--strategy: ") + error.what());
  }
}

}  // namespace

PlanChoice choose_plan_for(
    const StageCosts& costs, const BudgetFlags& flags, int64_t encoder_stages) {
  const Budget budget = Budget::parse(flags.budget);
  const planner::ModelState state =
      std::visit([](const auto& model) { return model.model_state(); }, costs);
  if (budget.is_total() && state.total_bytes() == 0) {
    // A file without model_state: a total would silently be all activations.
    throw UsageError(
        "--budget " + flags.budget +
        ": a total counts the model state, and these costs record none (no "
        "model_state: profile with `remat profile`, which records it); give "
        "the activations' budget instead (bytes or a percentage)");
  }
  if (const auto* graph = std::get_if<planner::Graph>(&costs)) {
    return choose_graph_plan(
        *graph,
        graph_strategy(flags.strategy, encoder_stages),
        encoder_stages,
        budget,
        flags.origin(),
        flags.solver());
  }
  return choose_plan(
      std::get<planner::Chain>(costs),
      chain_strategy(flags.strategy),
      budget,
      flags.origin(),
      flags.solver());
}

std::string strategy_name(const StageCosts& costs, const BudgetFlags& flags) {
  if (std::holds_alternative<planner::Graph>(costs)) {
    return to_string(parse_graph_strategy(flags.strategy));
  }
  return chain_strategy(flags.strategy).to_string();
}

void write_text_file(
    const std::string& flag, const std::string& path, const std::string& text) {
  const std::filesystem::path file(path);
  if (file.has_parent_path()) {
    make_folder(flag, file.parent_path().string());
  }
  std::error_code status_error;
  const auto status = std::filesystem::status(file, status_error);
  if (std::filesystem::is_directory(status)) {
    throw UsageError(
        flag + ": cannot write '" + path + "': " + std::strerror(EISDIR));
  }
  // A device or FIFO (/dev/stdout, a pipe) is written in place; a regular
  // file is written next to itself and renamed over it, so that an error
  // never leaves a truncated file (or destroys the previous one).
  const bool in_place = std::filesystem::exists(status) &&
                        !std::filesystem::is_regular_file(status);
  const std::filesystem::path target =
      in_place
          ? file
          : std::filesystem::path(path + ".tmp." + std::to_string(::getpid()));
  std::ofstream stream(target, std::ios::binary | std::ios::trunc);
  if (!stream) {
    throw UsageError(
        flag + ": cannot write '" + path + "': " + std::strerror(errno));
  }
  stream << text;
  stream.close();
  if (!stream) {
    std::error_code ignored;
    if (!in_place) {
      std::filesystem::remove(target, ignored);
    }
    throw UsageError(
        flag + ": failed writing '" + path + "' (" +
        std::to_string(text.size()) + " bytes)" +
        (in_place ? "" : "; the file was left as it was"));
  }
  if (!in_place) {
    std::error_code error;
    std::filesystem::rename(target, file, error);
    if (error) {
      std::error_code ignored;
      std::filesystem::remove(target, ignored);
      throw UsageError(
          flag + ": cannot write '" + path + "': " + error.message());
    }
  }
}

std::string report_text(const nlohmann::json& report) {
  return report.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

void check_output_file(const std::string& flag, const std::string& path) {
  const std::filesystem::path file(path);
  const std::string folder =
      file.has_parent_path() ? file.parent_path().string() : ".";
  make_folder(flag, folder);
  std::error_code error;
  if (std::filesystem::is_directory(file, error)) {
    throw UsageError(
        flag + ": cannot write '" + path + "': " + std::strerror(EISDIR));
  }
  if (::access(folder.c_str(), W_OK) != 0) {
    throw UsageError(
        flag + ": cannot write in folder '" + folder +
        "': " + std::strerror(errno));
  }
}

void make_folder(const std::string& flag, const std::string& path) {
  std::error_code error;
  std::filesystem::create_directories(path, error);
  if (error || !std::filesystem::is_directory(path)) {
    throw UsageError(
        flag + ": cannot create folder '" + path +
        "': " + (error ? error.message() : "not a folder"));
  }
}

}  // namespace remat::cli
