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
// (a LibTorch c10::Error from a bad model size, for example).
#pragma once

#include <stdexcept>
#include <string>

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

/// No plan of the requested strategy fits the budget. The message states the
/// budget and the minimum feasible budget.
class InfeasibleBudgetError : public std::runtime_error {
 public:
  InfeasibleBudgetError(const std::string& message, int64_t min_feasible_bytes)
      : std::runtime_error(message), min_feasible_bytes_(min_feasible_bytes) {}
  /// The smallest budget (bytes) at which some plan fits.
  int64_t min_feasible_bytes() const {
    return min_feasible_bytes_;
  }

 private:
  int64_t min_feasible_bytes_;
};

/// The strategy and mode asked for would not train the model correctly (for
/// example reentrant checkpointing of a model whose input cannot require
/// grad). The message names the flags, the reason and what to use instead.
class UnsupportedStrategyError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace remat::cli
