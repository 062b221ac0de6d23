// main.cpp: the `remat` executable. Sets up the process, then hands over to
// run_cli(), which parses, runs and maps errors to exit codes.
//
// NOTE: [OpenMP wait policy] LibTorch's CPU kernels run on OpenMP (libgomp),
// whose worker threads spin while waiting by default. On a small, shared
// machine (2 cores, other processes busy) spinning threads fight for the
// cores and a 2-thread step runs several times slower than a 1-thread one;
// with OMP_WAIT_POLICY=PASSIVE they sleep instead. libgomp reads the variable
// once, when it is loaded (before main), so when it is unset and the command
// runs a model, remat sets it and re-executes itself once. Set OMP_WAIT_POLICY
// yourself (for example to ACTIVE) to keep your own choice; REMAT_NO_REEXEC=1
// disables the re-exec.
//
// The tracking CPU allocator is installed before anything allocates, so that
// MemoryMeter counts every byte.
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include <remat/memory_meter.h>

#include "app.h"
#include "cli_error.h"
#include "progress.h"

namespace {

// Whether the command line asks for a command that runs a model (all but
// `plan`, --help and --version); with no command, `remat` runs the demo.
bool runs_models(int argc, char** argv) {
  for (int index = 1; index < argc; ++index) {
    const std::string argument = argv[index];
    if (argument == "-h" || argument == "--help" || argument == "--version") {
      return false;
    }
  }
  return argc < 2 || std::string(argv[1]) != "plan";
}

}  // namespace

int main(int argc, char** argv) {
  if (runs_models(argc, argv) && std::getenv("OMP_WAIT_POLICY") == nullptr &&
      std::getenv("REMAT_NO_REEXEC") == nullptr) {
    ::setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    ::execv("/proc/self/exe", argv);
    // exec failed (no /proc): carry on with the default policy.
  }
  try {
    remat::install_tracking_allocator();
  } catch (const std::exception& error) {
    std::cerr << "remat: error: " << error.what() << '\n';
    return remat::cli::kExitUsage;
  }
  return remat::cli::run_cli(
      argc, argv, {std::cout, std::cerr, remat::cli::stdout_is_terminal()});
}
