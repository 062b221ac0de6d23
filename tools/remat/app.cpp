// app.cpp: builds the CLI11 app from the commands and maps every outcome to
// an exit code (see cli_error.h). The only place that catches exceptions.
#include "app.h"

#include <c10/util/Exception.h>

#include <exception>
#include <functional>
#include <stdexcept>

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

}  // namespace

int run_cli(int argc, const char* const* argv, const CommandIo& io) {
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
      io.err << name << ": error: " << error.what() << '\n'
             << "Run `" << name << " --help` for usage.\n";
      return kExitUsage;
    }
    if (app.get_subcommands().empty()) {
      io.out << "(no command given: running `remat train` with its defaults; "
                "`remat --help` lists the commands)\n";
      name = "remat train";
      run_train(train, io);
      return kExitOk;
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
      run_explain(explain, io);
    } else if (chosen == bench_command) {
      run_bench(bench, io);
    } else if (chosen == fit_command) {
      run_fit(fit, io);
    }
    return kExitOk;
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
