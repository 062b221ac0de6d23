// scenario.cpp — the scenario registry and remat_bench's driver (see
// scenario.h).
#include "harness/scenario.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "remat/measure/cpu_memory.h"
#include "remat/measure/timer.h"
#include "remat/remat.h"

namespace remat::bench {
namespace {

std::vector<Scenario>& registry() {
  static std::vector<Scenario> scenarios;
  return scenarios;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    throw std::runtime_error("remat_bench: cannot read " + path);
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string command_line(int argc, char** argv) {
  std::string command;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool plain =
        !arg.empty() &&
        arg.find_first_of(" \t\"'$`\\|&;<>()*?") == std::string::npos;
    command += (i ? " " : "") + (plain ? arg : "'" + arg + "'");
  }
  return command;
}

}  // namespace

RunnerOptions Context::runner_options() const {
  RunnerOptions options;
  options.warmup = warmup;
  options.rounds = rounds;
  options.verbose = verbose;
  return options;
}

torch::Device Context::torch_device() const {
  const torch::Device parsed(device);
  TORCH_CHECK(
      !parsed.is_cuda() || torch::cuda::is_available(),
      "remat_bench: --device ",
      device,
      " needs a CUDA GPU, and none is visible");
  return parsed;
}

bool register_scenario(Scenario scenario) {
  for (const Scenario& known : registry()) {
    if (known.name == scenario.name) {
      throw std::logic_error(
          "remat::bench::register_scenario: a scenario named '" +
          scenario.name + "' is already registered");
    }
  }
  registry().push_back(std::move(scenario));
  return true;
}

std::vector<Scenario> registered_scenarios() {
  std::vector<Scenario> scenarios = registry();
  std::stable_sort(
      scenarios.begin(),
      scenarios.end(),
      [](const Scenario& lhs, const Scenario& rhs) {
        return lhs.order < rhs.order;
      });
  return scenarios;
}

namespace {

// Waits up to `seconds` for the 1-minute load average to fall below 0.5,
// checking every 5 s (how often the kernel updates it).
void settle(int seconds) {
  const Timer waited;
  double load = read_load_average();
  while (load >= 0.5 && waited.elapsed_ms() < 1000.0 * seconds) {
    std::this_thread::sleep_for(std::chrono::seconds(5));
    load = read_load_average();
  }
  if (seconds > 0) {
    std::cerr << "remat_bench: load average " << load << " after "
              << static_cast<int>(waited.elapsed_ms() / 1000) << " s\n";
  }
}

}  // namespace

int run_main(int argc, char** argv) {
  // Freed memory stays in the process (remat/measure/cpu_memory.h): without
  // it every step faults the same pages in again, about 15 % of a step here
  // and most of the step-to-step noise. The measured bytes do not change:
  // MemoryMeter counts what tensors request, not what malloc holds.
  measure::keep_freed_cpu_memory();
  CLI::App app{
      "remat_bench: remat's benchmarks as named scenarios (docs/benchmarks.md "
      "describes the protocol). Run one or more scenarios, each with its own "
      "flags, or `all`."};
  Context context;
  std::string out_dir;
  std::string page_path;
  std::string preamble_path;
  app.add_option("--warmup", context.warmup, "Discarded rounds")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--rounds", context.rounds, "Timed rounds (median, spread)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--threads", context.threads, "Torch intra-op threads")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--device", context.device, "cpu, cuda or cuda:N")
      ->capture_default_str();
  app.add_flag(
      "--quick", context.quick, "Smallest sizes and 1 + 3 rounds: a smoke run");
  app.add_flag("--verbose", context.verbose, "Progress on stderr");
  int settle_s = 0;
  app.add_option(
         "--settle",
         settle_s,
         "Before each scenario, wait up to this many seconds for the 1-minute "
         "load average to fall below 0.5 (the load the previous scenario "
         "left), so that the busy-machine warning speaks of other work")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option(
      "--out",
      out_dir,
      "Write each scenario's <name>.md, <name>.json and a CSV per table here");
  app.add_option(
         "--page",
         page_path,
         "Rebuild this Markdown page from --preamble and every <name>.md in "
         "--out (needs --out)")
      ->needs("--out");
  app.add_option(
         "--preamble", preamble_path, "Markdown placed before the sections")
      ->needs("--page")
      ->check(CLI::ExistingFile);
  app.require_subcommand(1, 0);

  const std::vector<Scenario> scenarios = registered_scenarios();
  std::map<std::string, ScenarioRun> runs;
  for (const Scenario& scenario : scenarios) {
    CLI::App* command = app.add_subcommand(scenario.name, scenario.summary);
    command->fallthrough();
    runs[scenario.name] = scenario.setup(*command);
  }
  CLI::App* all = app.add_subcommand("all", "Every scenario, in order");
  all->fallthrough();
  CLI11_PARSE(app, argc, argv);

  std::vector<Scenario> selected;
  if (all->parsed()) {
    selected = scenarios;
  } else {
    for (const CLI::App* command : app.get_subcommands()) {
      for (const Scenario& scenario : scenarios) {
        if (scenario.name == command->get_name()) {
          selected.push_back(scenario);
        }
      }
    }
  }
  if (context.quick) {
    context.warmup = std::min(context.warmup, 1);
    context.rounds = std::min(context.rounds, 3);
  }
  torch::set_num_threads(context.threads);
  context.command = command_line(argc, argv);

  int status = 0;
  for (const Scenario& scenario : selected) {
    settle(settle_s);
    std::cerr << "remat_bench: " << scenario.name << " ...\n";
    context.machine = describe_machine();
    try {
      RunResult load;  // only the load averages: busy_machine_warning's input
      load.load_before = read_load_average();
      Section section = runs.at(scenario.name)(context);
      load.load_after = read_load_average();
      if (const auto busy = busy_machine_warning(load, context.threads)) {
        std::cerr << "remat_bench: " << scenario.name << ": warning: " << *busy
                  << "\n";
        section.add_text("**Warning:** " + *busy + ".");
      }
      if (section.scenario.empty()) {
        section.scenario = scenario.name;
      }
      if (section.machine.date.empty()) {
        section.machine = context.machine;
      }
      if (section.command.empty()) {
        section.command = context.command;
      }
      std::cout << to_markdown(section) << "\n" << std::flush;
      if (!out_dir.empty()) {
        write_section_files(section, out_dir);
      }
    } catch (const std::exception& error) {
      std::cerr << "remat_bench: " << scenario.name
                << " failed: " << error.what() << "\n";
      status = 1;
    }
  }
  if (!page_path.empty() && status != 0) {
    std::cerr << "remat_bench: " << page_path
              << " left as it was: a scenario failed\n";
  } else if (!page_path.empty()) {
    try {
      std::vector<std::string> sections;
      for (const Scenario& scenario : scenarios) {
        const auto path =
            std::filesystem::path(out_dir) / (scenario.name + ".md");
        if (std::filesystem::exists(path)) {
          sections.push_back(read_text(path.string()));
        }
      }
      write_page(
          page_path,
          preamble_path.empty() ? std::string() : read_text(preamble_path),
          sections);
      std::cerr << "remat_bench: wrote " << page_path << " (" << sections.size()
                << " sections)\n";
    } catch (const std::exception& error) {
      std::cerr << "remat_bench: " << error.what() << "\n";
      status = 1;
    }
  }
  return status;
}

}  // namespace remat::bench
