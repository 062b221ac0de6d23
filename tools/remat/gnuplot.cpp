// gnuplot.cpp: finding and running gnuplot (see gnuplot.h).
#include "gnuplot.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace remat::cli {
namespace {

// The gnuplot executable on PATH, or "" if there is none.
std::string gnuplot_path() {
  const char* path = std::getenv("PATH");
  if (path == nullptr) {
    return "";
  }
  std::stringstream folders(path);
  std::string folder;
  while (std::getline(folders, folder, ':')) {
    if (folder.empty()) {
      continue;
    }
    std::error_code error;
    const auto candidate = std::filesystem::path(folder) / "gnuplot";
    if (std::filesystem::is_regular_file(candidate, error)) {
      return candidate.string();
    }
  }
  return "";
}

}  // namespace

bool gnuplot_available() {
  return !gnuplot_path().empty();
}

// NOTE: [gnuplot dies with remat]
// gnuplot runs as a child of its own (fork and exec, no shell), asked to
// receive SIGTERM when remat dies (PR_SET_PDEATHSIG), so that a remat killed
// while it plots leaves no gnuplot running; a Ctrl-C reaches both (one
// process group), and remat is not made to ignore it as std::system() does.
// gnuplot's stderr comes back through a pipe and is written to a log file
// next to the script only when gnuplot fails, so a killed run leaves no
// empty log behind.
std::string run_gnuplot(const std::string& script_path) {
  const std::string executable = gnuplot_path();
  if (executable.empty()) {
    return "gnuplot is not on PATH (Debian: apt-get install gnuplot-nox)";
  }
  const std::filesystem::path script = std::filesystem::absolute(script_path);
  const std::string folder = script.parent_path().string();
  const std::string name = script.filename().string();
  int pipe_ends[2];
  if (::pipe2(pipe_ends, O_CLOEXEC) != 0) {
    return std::string("cannot start gnuplot: ") + std::strerror(errno);
  }
  // Everything the child needs exists before fork(): after it, only
  // async-signal-safe calls run there.
  const char* child_argv[] = {"gnuplot", name.c_str(), nullptr};
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent || ::chdir(folder.c_str()) != 0 ||
        ::dup2(pipe_ends[1], STDERR_FILENO) < 0) {
      ::_exit(127);
    }
    ::execv(executable.c_str(), const_cast<char* const*>(child_argv));
    ::_exit(127);
  }
  const int start_errno = errno;
  ::close(pipe_ends[1]);
  if (pid < 0) {
    ::close(pipe_ends[0]);
    return std::string("cannot start gnuplot: ") + std::strerror(start_errno);
  }
  std::string errors;
  char buffer[4096];
  for (;;) {
    const ssize_t got = ::read(pipe_ends[0], buffer, sizeof(buffer));
    if (got > 0) {
      errors.append(buffer, static_cast<size_t>(got));
    } else if (got == 0 || errno != EINTR) {
      break;
    }
  }
  ::close(pipe_ends[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    return "";
  }
  const std::filesystem::path log =
      script.parent_path() / (script.stem().string() + ".gnuplot.log");
  std::ofstream(log) << errors;
  std::stringstream lines(errors);
  std::string first_lines, line;
  for (int count = 0; count < 3 && std::getline(lines, line); ++count) {
    first_lines += (count ? " | " : "") + line;
  }
  const std::string how =
      WIFEXITED(status) ? "exit status " + std::to_string(WEXITSTATUS(status))
                        : "signal " + std::to_string(WTERMSIG(status));
  return "gnuplot failed (" + how + "): " + first_lines +
         " (full log: " + log.string() + ")";
}

std::string gnuplot_quote(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) {
    quoted += c;
    if (c == '\'') {
      quoted += '\'';
    }
  }
  return quoted + "'";
}

}  // namespace remat::cli
