// app.h: the remat command line: argument parsing, dispatch, exit codes.
#pragma once

#include "commands.h"

namespace remat::cli {

/// Parses `argv` (CLI11), runs the chosen subcommand and returns the exit
/// code: 0 ok, 1 usage or input error, 2 infeasible budget. Errors are
/// printed on io.err as "remat <command>: error: <message>"; --help and
/// --version print on io.out and return 0. With no subcommand, runs
/// `remat train`: with its defaults (the demo), or with the flags given
/// (`remat --steps 3` is `remat train --steps 3`). Never throws, never exits.
///
/// Example:
///   const char* argv[] = {"remat", "plan", "chain.json", "--budget", "50%"};
///   int code = run_cli(5, argv, {std::cout, std::cerr, false});
int run_cli(int argc, const char* const* argv, const CommandIo& io);

}  // namespace remat::cli
