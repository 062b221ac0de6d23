// app.cpp: builds the CLI11 app from the commands and maps every outcome to
// an exit code (see cli_error.h). The only place that catches exceptions.
#include "app.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <exception>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli_error.h"

namespace remat::cli {
namespace {

constexpr const char* kFooter =
    "Exit codes: 0 ok, 1 usage or input error, 2 infeasible budget or a "
    "strategy that cannot train the model.\n"
    "Run `remat COMMAND --help` for the flags of a command; docs/cli.md has "
    "example sessions.";

bool given(CLI::App* command, const std::string& flag) {
  return command->get_option(flag)->count() > 0;
}

/// Levenshtein distance: insertions, deletions and substitutions.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) {
    row[j] = j;
  }
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min(
          {row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = above;
    }
  }
  return row[b.size()];
}

/// The name in `names` closest to `word`, if close enough to be a typo (at
/// most two edits, or a third of its letters for longer words: "trian" is
/// two substitutions from "train").
std::optional<std::string> closest(
    const std::string& word, const std::vector<std::string>& names) {
  std::optional<std::string> best;
  size_t best_distance = std::max<size_t>(2, word.size() / 3) + 1;
  for (const std::string& name : names) {
    const size_t distance = edit_distance(word, name);
    if (distance < best_distance && name != word) {
      best = name;
      best_distance = distance;
    }
  }
  return best;
}

/// " (did you mean 'train'?)" for the first word of `argv` that names no
/// command or flag of the command it was given to but is close to one; ""
/// if there is none.
std::string suggestion(CLI::App& app, int argc, const char* const* argv) {
  CLI::App* command = &app;
  for (CLI::App* parsed : app.get_subcommands()) {
    command = parsed;
  }
  std::vector<std::string> commands;
  for (CLI::App* sub : app.get_subcommands({})) {
    commands.push_back(sub->get_name());
  }
  std::vector<std::string> flags;
  for (const CLI::Option* option : command->get_options()) {
    for (const std::string& name : option->get_lnames()) {
      flags.push_back("--" + name);
    }
  }
  for (int k = 1; k < argc; ++k) {
    const std::string word = argv[k];
    if (word == "--") {
      break;  // what follows is not a flag: nothing to be near
    }
    if (word.rfind("--", 0) == 0) {
      const std::string flag = word.substr(0, word.find('='));
      if (std::find(flags.begin(), flags.end(), flag) != flags.end()) {
        continue;
      }
      if (const std::optional<std::string> near = closest(flag, flags)) {
        return " (did you mean '" + *near + "'?)";
      }
    } else if (command == &app && word[0] != '-') {
      if (const std::optional<std::string> near = closest(word, commands)) {
        return " (did you mean '" + *near + "'?)";
      }
      break;  // the first word is the command
    }
  }
  return "";
}

// kExitOk if everything the command printed reached stdout; else reports
// the failed write (a full disk, a closed pipe) and returns kExitUsage, so
// that a truncated report or JSON never exits 0.
int finish(const std::string& name, const CommandIo& io) {
  io.out.flush();
  if (!io.out) {
    io.err << name
           << ": error: failed writing the output to stdout (disk full or "
              "stream closed); the output is incomplete\n";
    return kExitUsage;
  }
  return kExitOk;
}

/// `argv` with "train" inserted before flags given without a command:
/// `remat --steps 3` is `remat train --steps 3`. The top level's own flags
/// (--help, -h, --version) and a first word that is not a flag (a command,
/// or a typo that gets its suggestion) leave it as it is.
std::vector<const char*> with_default_command(
    int argc, const char* const* argv) {
  std::vector<const char*> arguments(argv, argv + argc);
  if (argc >= 2) {
    const std::string first = argv[1];
    if (first.rfind("-", 0) == 0 && first != "-h" && first != "--help" &&
        first != "--version") {
      arguments.insert(arguments.begin() + 1, "train");
    }
  }
  return arguments;
}

}  // namespace

int run_cli(int argc, const char* const* given_argv, const CommandIo& io) {
  // Flags without a command are `remat train`'s (docs/cli.md).
  const std::vector<const char*> arguments =
      with_default_command(argc, given_argv);
  argc = static_cast<int>(arguments.size());
  const char* const* argv = arguments.data();
  CLI::App app(
      "remat: activation checkpointing and memory planning for LibTorch.\n"
      "Train a model under an activation-memory budget, profile it into a "
      "chain, plan and explain checkpoint schedules, benchmark strategies, "
      "find "
      "the largest batch under a memory cap.",
      "remat");
  app.set_version_flag("--version", "remat 0.1.0");
  app.footer(kFooter);
  app.require_subcommand(0, 1);

  TrainOptions train;
  ProfileCommandOptions profile;
  PlanOptions plan;
  ExplainOptions explain;
  BenchOptions bench;
  FitCommandOptions fit;
  CLI::App* train_command = add_train_command(app, train);
  CLI::App* profile_command = add_profile_command(app, profile);
  CLI::App* plan_command = add_plan_command(app, plan);
  CLI::App* explain_command = add_explain_command(app, explain);
  CLI::App* bench_command = add_bench_command(app, bench);
  CLI::App* fit_command = add_fit_command(app, fit);
  for (CLI::App* command : app.get_subcommands({})) {
    command->footer(kFooter);
  }

  std::string name = "remat";
  try {
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& error) {
      if (error.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) {
        app.exit(error, io.out, io.err);
        return kExitOk;
      }
      for (CLI::App* command : app.get_subcommands()) {
        name += " " + command->get_name();
      }
      io.err << name << ": error: " << error.what()
             << suggestion(app, argc, argv) << '\n'
             << "Run `" << name << " --help` for usage.\n";
      return kExitUsage;
    }
    if (app.get_subcommands().empty()) {
      io.out << "(no command given: running `remat train` with its defaults; "
                "`remat --help` lists the commands)\n";
      name = "remat train";
      run_train(train, io);
      return finish(name, io);
    }
    CLI::App* chosen = app.get_subcommands().front();
    name += " " + chosen->get_name();
    if (chosen == train_command) {
      train.budget.budget_given = given(train_command, "--budget");
      train.arguments.assign(argv, argv + argc);
      run_train(train, io);
    } else if (chosen == profile_command) {
      run_profile(profile, io);
    } else if (chosen == plan_command) {
      plan.budget.budget_given = given(plan_command, "--budget");
      run_plan(plan, io);
    } else if (chosen == explain_command) {
      explain.budget.budget_given = given(explain_command, "--budget");
      if (!explain.chain_path.empty()) {
        // A chain file's costs are already measured: a flag that shapes the
        // profiled model would be silently ignored.
        for (const char* flag :
             {"--model",
              "--layers",
              "--hidden",
              "--heads",
              "--seq",
              "--min-seq",
              "--levels",
              "--image",
              "--dropout",
              "--batch",
              "--data",
              "--precision",
              "--selective",
              "--shard",
              "--seed"}) {
          if (given(explain_command, flag)) {
            throw UsageError(
                std::string(flag) +
                ": applies to a profiled built-in model, "
                "got a chain file '" +
                explain.chain_path +
                "' (its costs are already measured); drop " + flag +
                " or the file");
          }
        }
      }
      run_explain(explain, io);
    } else if (chosen == bench_command) {
      bench.strategies_given = given(bench_command, "--strategies");
      bench.mode_given = given(bench_command, "--mode");
      run_bench(bench, io);
    } else if (chosen == fit_command) {
      run_fit(fit, io);
    }
    return finish(name, io);
  } catch (const InfeasibleBudgetError& error) {
    io.err << name << ": error: " << error.what() << '\n';
    return kExitInfeasible;
  } catch (const UnsupportedStrategyError& error) {
    io.err << name << ": error: " << error.what() << '\n';
    return kExitInfeasible;
  } catch (const WorkerFailedError& error) {
    io.err << name << ": error: " << error.what() << '\n';
    return error.exit_code();
  } catch (const LauncherStoppedError& error) {
    io.err << name << ": error: " << error.what() << '\n';
    return error.exit_code();
  } catch (const UsageError& error) {
    io.err << name << ": error: " << error.what() << '\n';
    return kExitUsage;
  } catch (const c10::Error& error) {
    io.err << name << ": error: " << error.what_without_backtrace() << '\n';
    return kExitUsage;
  } catch (const std::exception& error) {
    io.err << name << ": error: " << error.what() << '\n';
    return kExitUsage;
  }
}

}  // namespace remat::cli
