// cli_error.h: the errors a remat command reports, and their exit codes.
//
// Commands are library code: they never call exit() and never print errors.
// They throw one of these, and run_cli() (app.cpp) prints the message on
// stderr and returns the exit code:
//   0  success
//   1  usage or input error (bad flag value, missing or malformed file)
//   2  the request cannot be carried out as given: an infeasible budget (the
//      message states the minimum feasible budget), or a strategy that would
//      not train the model (UnsupportedStrategyError)
// Any other exception escaping a command is reported with exit code 1 too
// (a LibTorch c10::Error from a bad model size, for example). A command that
// launched local workers exits with the first failing worker's code when it
// is one of these (WorkerFailedError), else with 1.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>

#include <remat/plan_choice.h>

namespace remat::cli {

/// Exit codes of the remat tool.
enum ExitCode : int {
  kExitOk = 0,
  kExitUsage = 1,
  kExitInfeasible = 2,
};

/// A bad flag value or input file. The message names the flag (or file) and
/// the value, e.g. "--chain: cannot open 'x.json': No such file or directory".
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Throws the UsageError of a flag (or setting) that needs remat::distributed
/// in a remat built without it (REMAT_BUILD_DISTRIBUTED=OFF), naming it.
[[noreturn]] inline void throw_without_distributed(const std::string& flag) {
  throw UsageError(
      flag +
      ": this remat was built without distributed training "
      "(REMAT_BUILD_DISTRIBUTED=OFF, or Gloo's headers were missing: install "
      "libgloo-dev and configure again)");
}

// remat::InfeasibleBudgetError (remat/plan_choice.h): no plan of the
// requested strategy fits the budget; exit code kExitInfeasible.
using remat::InfeasibleBudgetError;

/// The strategy and mode asked for would not train the model correctly (for
/// example reentrant checkpointing of a model whose input cannot require
/// grad). The message names the flags, the reason and what to use instead.
class UnsupportedStrategyError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A local worker (remat train --nproc) failed; it printed its own error.
/// The message names the worker and how it ended.
class WorkerFailedError : public std::runtime_error {
 public:
  WorkerFailedError(const std::string& message, int worker_exit_code)
      : std::runtime_error(message), worker_exit_code_(worker_exit_code) {}
  /// The tool's exit code for it: the worker's, if it is kExitUsage or
  /// kExitInfeasible; kExitUsage otherwise (a signal, a crash).
  int exit_code() const {
    return worker_exit_code_ == kExitInfeasible ? kExitInfeasible : kExitUsage;
  }

 private:
  int worker_exit_code_;
};

/// The launcher of local workers was sent SIGINT, SIGTERM or SIGHUP and
/// stopped its workers: the tool exits with 128 + the signal's number, as a
/// process ended by it would.
class LauncherStoppedError : public std::runtime_error {
 public:
  LauncherStoppedError(const std::string& message, int exit_code)
      : std::runtime_error(message), exit_code_(exit_code) {}
  int exit_code() const {
    return exit_code_;
  }

 private:
  int exit_code_;
};

}  // namespace remat::cli
