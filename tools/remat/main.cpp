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
// MemoryMeter counts every byte; before it, glibc's malloc is told to keep
// freed memory in the process (remat::measure::keep_freed_cpu_memory), so
// that a step does not fault in again the pages the step before freed.
//
// A worker of `remat train --nproc` (REMAT_LAUNCHER_PID in its environment)
// handles SIGTERM from its first instruction after the re-exec, to say why it
// stops (NOTE: [No worker outlives its launcher] in
// src/distributed/launch.cpp).
#include <signal.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include <remat/measure/cpu_memory.h>
#include <remat/memory_meter.h>

#include "app.h"
#include "cli_error.h"
#include "progress.h"

namespace {

// A worker started by `--nproc` says why it stops on SIGTERM: its launcher
// is gone (the kernel's signal, NOTE: [No worker outlives its launcher] in
// the library's launch_local), or the launcher stopped it. The texts are
// made before the handler can run; it only writes and exits.
pid_t worker_launcher = 0;
std::array<char, 192> worker_gone_text{};
std::array<char, 192> worker_stopped_text{};

extern "C" void stop_worker(int /*signal_number*/) {
  const char* text = ::getppid() != worker_launcher
                         ? worker_gone_text.data()
                         : worker_stopped_text.data();
  size_t length = 0;
  while (text[length] != '\0') {
    ++length;
  }
  [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, text, length);
  ::_exit(128 + SIGTERM);
}

/// Installs stop_worker if this process is a worker of `--nproc` (its
/// environment names the launcher), as early as the process can.
void explain_worker_stop() {
  const char* launcher = std::getenv("REMAT_LAUNCHER_PID");
  if (launcher == nullptr) {
    return;
  }
  worker_launcher = static_cast<pid_t>(std::atol(launcher));
  // A pid that is not our parent's is stale (the variable was left in the
  // environment of a program that a launcher once started): not a worker. A
  // worker whose launcher has died does not get here: launch_local asked for
  // SIGTERM on its launcher's death (PR_SET_PDEATHSIG), whose default action
  // ends it before this handler is in place.
  if (::getppid() != worker_launcher) {
    worker_launcher = 0;
    return;
  }
  const char* rank_text = std::getenv("RANK");
  const long long rank = rank_text != nullptr ? std::atoll(rank_text) : -1;
  std::snprintf(
      worker_gone_text.data(),
      worker_gone_text.size(),
      "remat train: rank %lld: its launcher (pid %d) is gone; exiting\n",
      rank,
      static_cast<int>(worker_launcher));
  std::snprintf(
      worker_stopped_text.data(),
      worker_stopped_text.size(),
      "remat train: rank %lld: stopped by its launcher (pid %d)\n",
      rank,
      static_cast<int>(worker_launcher));
  struct sigaction action {};
  action.sa_handler = stop_worker;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGTERM, &action, nullptr);
}

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
  explain_worker_stop();
  remat::measure::keep_freed_cpu_memory();
  try {
    remat::install_tracking_allocator();
  } catch (const std::exception& error) {
    std::cerr << "remat: error: " << error.what() << '\n';
    return remat::cli::kExitUsage;
  }
  return remat::cli::run_cli(
      argc, argv, {std::cout, std::cerr, remat::cli::stdout_is_terminal()});
}
