// scenario.h — named benchmark scenarios and the driver of remat_bench.
//
// CONTRACT (stable; how a scenario joins remat_bench):
//  - A scenario is a name ("E1"), a one-line summary, an order (its place in
//    `remat_bench all` and in docs/benchmarks.md: E1 = 10, E2 = 20, E2-variants
//    = 25, E3 = 30, E5 = 50, E6 = 60) and a setup function.
//  - setup(command) receives the scenario's CLI11 subcommand, adds the
//    scenario's own flags to it (bound to state the setup function owns, e.g.
//    a std::shared_ptr<Options> captured by the returned function) and returns
//    the function that runs the scenario and returns its Section.
//  - The run function gets a Context: the common flags (warm-up, rounds,
//    threads, device, quick), the machine line and the exact command. It
//    fills section.body; the driver fills scenario, machine and command when
//    left empty. It throws on failure (GradientMismatch included); the driver
//    reports the error and exits 1 after the other scenarios have run.
//  - Registration: one file per scenario (bench/scenarios/<name>.cpp), compiled
//    into remat_bench itself (listed in bench/CMakeLists.txt), with at
//    namespace scope:
//      const bool kRegistered = remat::bench::register_scenario({"E6", ...});
//    Registering two scenarios of one name throws std::logic_error at start.
//  - The driver (run_main) parses with CLI11: `remat_bench [common flags]
//    SCENARIO [its flags] [SCENARIO [its flags]] ...` or `remat_bench all`;
//    each Section is printed to stdout as Markdown as soon as it is done and,
//    with --out DIR, written as DIR/<name>.{md,json} and one CSV per table;
//    --page FILE then rebuilds FILE from --preamble and every DIR/<name>.md
//    present, in scenario order (only when every scenario run succeeded).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "remat/measure/machine.h"
#include "remat/measure/runner.h"
#include "report/report.h"

namespace remat::bench {

// The benchmarks measure with remat::measure and report with remat::report;
// every scenario names their types without the prefixes.
using namespace remat::measure;
using namespace remat::report;

/// The flags common to every scenario, and where the run happens.
struct Context {
  int warmup = kDefaultWarmupRounds;  // --warmup: discarded rounds; Default: 3
  int rounds = kDefaultTimedRounds;   // --rounds: timed rounds; Default: 10
  int threads = 2;                    // --threads: torch threads; Default: 2
  std::string device = "cpu";         // --device: cpu, cuda or cuda:N
  bool quick = false;                 // --quick: smallest sizes, a smoke run
  bool verbose = false;               // --verbose: progress on stderr
  Machine machine;                    // described after set_num_threads
  std::string command;                // the exact command line

  /// RunnerOptions with this context's warm-up, rounds and verbosity.
  RunnerOptions runner_options() const;
  /// torch::Device(device); throws c10::Error if it is CUDA and no GPU is
  /// visible.
  torch::Device torch_device() const;
};

/// Runs a scenario: fills and returns its Section.
using ScenarioRun = std::function<Section(const Context&)>;

/// One named experiment of remat_bench.
struct Scenario {
  std::string name;     // the subcommand: "E1", "E2", "E5", "E6", ...
  std::string summary;  // one line for --help
  int order = 100;      // place in `all` and on the page (see the top)
  /// Adds the scenario's flags to its subcommand; returns its run function.
  std::function<ScenarioRun(CLI::App& command)> setup;
};

/// Registers a scenario (call at static initialization, see the top).
/// Returns true. Throws std::logic_error for a second scenario of a name.
bool register_scenario(Scenario scenario);

/// The registered scenarios in order.
std::vector<Scenario> registered_scenarios();

/// remat_bench's main: parses, runs, writes; returns the exit status (0 all
/// ran, 1 a scenario failed, 2 bad arguments).
int run_main(int argc, char** argv);

}  // namespace remat::bench
