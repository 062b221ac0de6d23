// remat/distributed/launch.h: launch_local, N workers of one program on
// this machine, none of which outlives the launcher.
// Part of remat::distributed (remat/distributed.h; docs/distributed.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/arg.h>

namespace remat::distributed {

/// What launch_local runs.
struct LocalLaunchOptions {
  /// Number of workers (ranks 0 .. nproc-1). Default: 1.
  TORCH_ARG(int64_t, nproc) = 1;
  /// The program every worker runs. Default: "/proc/self/exe" (this one).
  TORCH_ARG(std::string, executable) = "/proc/self/exe";
  /// The workers' argv, argv[0] included. Default: none (argv[0] is then the
  /// executable).
  TORCH_ARG(std::vector<std::string>, arguments) = {};
  /// The rendezvous port; 0 picks a free one (find_free_port). Default: 0.
  TORCH_ARG(int64_t, master_port) = 0;
};

/// How a local launch ended.
struct LaunchResult {
  /// 0 if every worker exited with 0; else the first failing worker's exit
  /// status (128 + signal number if a signal ended it).
  int exit_code = 0;
  /// The first worker that failed; -1 if none.
  int64_t failed_rank = -1;
  /// "rank 1 exited with status 1", "rank 0 was killed by signal 9" or "the
  /// launcher received signal 2 (Interrupt); every worker was stopped"; empty
  /// when all succeeded.
  std::string message;
};

/// Starts `nproc` copies of the executable with RANK, WORLD_SIZE,
/// MASTER_ADDR=127.0.0.1, MASTER_PORT and REMAT_LAUNCHER_PID (this process)
/// set (the rest of the environment is inherited) and waits for them. As soon
/// as one fails, the others are sent SIGTERM (SIGKILL 5 s later) and the
/// failure is returned. No worker outlives the launcher: while it waits,
/// SIGINT, SIGTERM and SIGHUP sent to this process stop every worker the same
/// way and the launch returns 128 + the signal's number (the previous
/// handlers are restored before it returns); if this process dies otherwise
/// (SIGKILL, a crash), the kernel sends each worker SIGTERM.
///
/// Example:
///   auto result = launch_local(LocalLaunchOptions().nproc(2).arguments(
///       {"remat", "train", "--steps", "10"}));
///
/// Throws c10::Error if nproc < 1, master_port is outside 0 .. 65535, or a
/// worker cannot be started: fork fails or the executable cannot be executed
/// (workers already started are killed first).
LaunchResult launch_local(const LocalLaunchOptions& options);

}  // namespace remat::distributed
