// launch.cpp: launch_local, N workers of one program on this machine, none
// of which outlives the launcher (remat/distributed/launch.h; NOTE: [No
// worker outlives its launcher] below).
#include "remat/distributed/launch.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>

#include "remat/distributed/process_group.h"

extern char** environ;

namespace remat::distributed {
namespace {

/// argv or envp for execve: owns the strings, exposes the pointer array.
class CStringArray {
 public:
  explicit CStringArray(std::vector<std::string> strings)
      : strings_(std::move(strings)) {
    for (std::string& text : strings_) {
      pointers_.push_back(text.data());
    }
    pointers_.push_back(nullptr);
  }
  char* const* data() {
    return pointers_.data();
  }

 private:
  std::vector<std::string> strings_;
  std::vector<char*> pointers_;
};

bool is_group_variable(const std::string& entry) {
  for (const char* name :
       {"RANK=",
        "WORLD_SIZE=",
        "MASTER_ADDR=",
        "MASTER_PORT=",
        "LOCAL_RANK=",
        "LOCAL_WORLD_SIZE=",
        // Set below for this launch; one inherited from an outer launch
        // (a launcher that is itself a worker) would come first in the
        // workers' environment and name the wrong launcher.
        "REMAT_LAUNCHER_PID="}) {
    if (entry.rfind(name, 0) == 0) {
      return true;
    }
  }
  return false;
}

/// Exit code and description of a wait status.
std::pair<int, std::string> describe_status(int64_t rank, int status) {
  if (WIFSIGNALED(status)) {
    return {
        128 + WTERMSIG(status),
        "rank " + std::to_string(rank) + " was killed by signal " +
            std::to_string(WTERMSIG(status))};
  }
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  return {
      code,
      "rank " + std::to_string(rank) + " exited with status " +
          std::to_string(code)};
}

void signal_all(const std::vector<pid_t>& pids, int signal_number) {
  for (const pid_t pid : pids) {
    if (pid > 0) {
      ::kill(pid, signal_number);
    }
  }
}

// NOTE: [No worker outlives its launcher]
// A launcher that dies must not leave its workers training (or holding a
// port) on their own. Two mechanisms cover every way it can die:
//  - a signal it can catch (SIGINT, SIGTERM, SIGHUP): while launch_local
//    waits, those are caught; the workers are sent SIGTERM (SIGKILL 5 s
//    later), and once all are reaped the previous handlers are back and the
//    launch returns 128 + the signal's number, naming it;
//  - one it cannot (SIGKILL) or a crash: every worker asks the kernel, before
//    exec, for SIGTERM when its launcher thread dies (PR_SET_PDEATHSIG), and
//    exits at once if the launcher died before that request.
// Workers find the launcher's pid in REMAT_LAUNCHER_PID, so they can tell a
// lost launcher from another sender of SIGTERM in their message.

volatile sig_atomic_t caught_signal = 0;

extern "C" void note_signal(int signal_number) {
  caught_signal = signal_number;
}

constexpr std::array<int, 3> kStopSignals{SIGINT, SIGTERM, SIGHUP};

/// Catches SIGINT, SIGTERM and SIGHUP for its lifetime (the first one caught
/// is in caught_signal); restores the previous handlers. Also gives SIGCHLD
/// its default action meanwhile: if the program ignores it, the kernel reaps
/// the workers itself and waitpid() could not tell their exit statuses (it
/// fails with ECHILD, which would count as a failed worker).
class CatchStopSignals {
 public:
  CatchStopSignals() {
    caught_signal = 0;
    struct sigaction action {};
    action.sa_handler = note_signal;
    sigemptyset(&action.sa_mask);
    for (size_t k = 0; k < kStopSignals.size(); ++k) {
      ::sigaction(kStopSignals[k], &action, &previous_[k]);
    }
    struct sigaction default_action {};
    default_action.sa_handler = SIG_DFL;
    sigemptyset(&default_action.sa_mask);
    ::sigaction(SIGCHLD, &default_action, &previous_child_);
  }
  CatchStopSignals(const CatchStopSignals&) = delete;
  CatchStopSignals& operator=(const CatchStopSignals&) = delete;
  ~CatchStopSignals() {
    for (size_t k = 0; k < kStopSignals.size(); ++k) {
      ::sigaction(kStopSignals[k], &previous_[k], nullptr);
    }
    ::sigaction(SIGCHLD, &previous_child_, nullptr);
  }

 private:
  std::array<struct sigaction, kStopSignals.size()> previous_{};
  struct sigaction previous_child_ {};
};

}  // namespace

LaunchResult launch_local(const LocalLaunchOptions& options) {
  TORCH_CHECK(
      options.nproc() >= 1,
      "remat::distributed::launch_local: expected at least 1 worker, got ",
      options.nproc());
  TORCH_CHECK(
      options.master_port() >= 0 && options.master_port() <= 65535,
      "remat::distributed::launch_local: expected a master port in 0 .. "
      "65535 (0: a free one), got ",
      options.master_port());
  const int64_t port =
      options.master_port() > 0 ? options.master_port() : find_free_port();
  std::vector<std::string> arguments = options.arguments();
  if (arguments.empty()) {
    arguments.push_back(options.executable());
  }
  std::vector<std::string> inherited;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    if (!is_group_variable(*entry)) {
      inherited.emplace_back(*entry);
    }
  }

  const int64_t nproc = options.nproc();
  const pid_t launcher = ::getpid();
  const CatchStopSignals catching;  // NOTE: [No worker outlives its launcher]
  // pid of each rank; 0 once it has been waited for.
  std::vector<pid_t> running;
  for (int64_t rank = 0; rank < nproc; ++rank) {
    std::vector<std::string> environment = inherited;
    environment.push_back("RANK=" + std::to_string(rank));
    environment.push_back("LOCAL_RANK=" + std::to_string(rank));
    environment.push_back("WORLD_SIZE=" + std::to_string(nproc));
    environment.push_back("LOCAL_WORLD_SIZE=" + std::to_string(nproc));
    environment.push_back("MASTER_ADDR=127.0.0.1");
    environment.push_back("MASTER_PORT=" + std::to_string(port));
    environment.push_back("REMAT_LAUNCHER_PID=" + std::to_string(launcher));
    // Everything the child needs is built before fork(): after it, only
    // async-signal-safe calls (execve, _exit) run in the child.
    CStringArray child_argv(arguments);
    CStringArray child_envp(std::move(environment));
    // The child writes execve's errno here if it fails; a successful execve
    // closes the pipe, so the parent reads nothing.
    int exec_status[2] = {-1, -1};
    if (::pipe2(exec_status, O_CLOEXEC) != 0) {
      exec_status[0] = exec_status[1] = -1;
    }
    const pid_t pid = ::fork();
    if (pid == 0) {
      // NOTE: [No worker outlives its launcher]. The launcher's handlers
      // would swallow a SIGTERM that comes before execve resets them.
      struct sigaction default_action {};
      default_action.sa_handler = SIG_DFL;
      for (const int signal_number : kStopSignals) {
        ::sigaction(signal_number, &default_action, nullptr);
      }
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != launcher) {
        ::_exit(128 + SIGTERM);  // the launcher died before the request
      }
      ::execve(
          options.executable().c_str(), child_argv.data(), child_envp.data());
      const int exec_errno = errno;
      if (exec_status[1] >= 0) {
        [[maybe_unused]] const ssize_t written =
            ::write(exec_status[1], &exec_errno, sizeof(exec_errno));
      }
      ::_exit(127);  // the forked child only; the caller's process goes on
    }
    const int fork_errno = errno;
    int exec_errno = 0;
    if (exec_status[1] >= 0) {
      ::close(exec_status[1]);
      if (pid > 0) {
        ssize_t got = 0;
        do {
          got = ::read(exec_status[0], &exec_errno, sizeof(exec_errno));
        } while (got < 0 && errno == EINTR);
        if (got != static_cast<ssize_t>(sizeof(exec_errno))) {
          exec_errno = 0;
        }
      }
      ::close(exec_status[0]);
    }
    if (pid > 0 && exec_errno != 0) {
      ::waitpid(pid, nullptr, 0);  // the child that could not exec
    }
    if (pid < 0 || exec_errno != 0) {
      signal_all(running, SIGKILL);
      for (const pid_t started : running) {
        ::waitpid(started, nullptr, 0);
      }
      TORCH_CHECK(
          false,
          "remat::distributed::launch_local: cannot start rank ",
          rank,
          ": ",
          pid < 0 ? std::string(std::strerror(fork_errno))
                  : "cannot execute '" + options.executable() +
                        "': " + std::strerror(exec_errno));
    }
    running.push_back(pid);
  }

  LaunchResult result;
  // After a failure: when the workers still running get SIGKILL.
  bool killing = false;
  auto kill_at = std::chrono::steady_clock::time_point::max();
  int64_t left = nproc;
  while (left > 0) {
    bool reaped = false;
    if (caught_signal != 0 && result.exit_code == 0) {
      const int signal_number = caught_signal;
      result.exit_code = 128 + signal_number;
      result.message =
          "the launcher received signal " + std::to_string(signal_number) +
          " (" + ::strsignal(signal_number) + "); every worker was stopped";
      signal_all(running, SIGTERM);
      killing = true;
      kill_at = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    }
    for (int64_t rank = 0; rank < nproc; ++rank) {
      if (running[rank] == 0) {
        continue;
      }
      int status = 0;
      const pid_t done = ::waitpid(running[rank], &status, WNOHANG);
      if (done == 0) {
        continue;
      }
      running[rank] = 0;
      --left;
      reaped = true;
      const bool failed =
          done < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0;
      if (failed && result.exit_code == 0) {
        auto [code, text] = describe_status(rank, done < 0 ? 1 << 8 : status);
        result.exit_code = code;
        result.failed_rank = rank;
        result.message = text;
        signal_all(running, SIGTERM);
        killing = true;
        kill_at = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      }
    }
    if (killing && std::chrono::steady_clock::now() >= kill_at) {
      signal_all(running, SIGKILL);
      killing = false;
    }
    if (!reaped && left > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  return result;
}

}  // namespace remat::distributed
