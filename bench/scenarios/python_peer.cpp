// python_peer.cpp — see python_peer.h.
//
// The child is started with posix_spawn (no fork of a multithreaded LibTorch
// process, and glibc reports a failed exec as the call's error). The parent's
// pipe ends are close-on-exec so that the child holds only its own ends.
// Writes to a child that died would raise SIGPIPE; it is ignored while a
// command is written and restored afterwards.
#include "python_peer.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <fstream>
#include <thread>

#include "remat/measure/cpu_memory.h"

extern char** environ;

namespace remat::bench {
namespace {

// Restores the previous SIGPIPE disposition when it goes out of scope.
class IgnoreSigpipe {
 public:
  IgnoreSigpipe() {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ignore, &previous_);
  }
  ~IgnoreSigpipe() {
    sigaction(SIGPIPE, &previous_, nullptr);
  }
  IgnoreSigpipe(const IgnoreSigpipe&) = delete;
  IgnoreSigpipe& operator=(const IgnoreSigpipe&) = delete;

 private:
  struct sigaction previous_ {};
};

void close_fd(int& fd) {
  if (fd >= 0) {
    ::close(fd);
    fd = -1;
  }
}

}  // namespace

PythonPeer::PythonPeer(
    const std::vector<std::string>& argv,
    const std::string& log_path,
    int greeting_timeout_s)
    : log_path_(log_path) {
  int to_child[2] = {-1, -1};
  int from_child[2] = {-1, -1};
  if (::pipe2(to_child, O_CLOEXEC) != 0 ||
      ::pipe2(from_child, O_CLOEXEC) != 0) {
    why_unavailable_ =
        std::string("cannot make pipes: ") + std::strerror(errno);
    for (int fd : {to_child[0], to_child[1], from_child[0], from_child[1]}) {
      close_fd(fd);
    }
    return;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, to_child[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, from_child[1], STDOUT_FILENO);
  posix_spawn_file_actions_addopen(
      &actions,
      STDERR_FILENO,
      log_path.c_str(),
      O_WRONLY | O_CREAT | O_APPEND,
      0644);
  std::vector<char*> args;
  for (const auto& arg : argv) {
    args.push_back(const_cast<char*>(arg.c_str()));
  }
  args.push_back(nullptr);
  // The child's malloc keeps freed memory as this process's does
  // (remat/measure/cpu_memory.h), so that the two sides' steps compare like
  // for like: this environment with GLIBC_TUNABLES set to the same settings.
  const std::string tunables =
      "GLIBC_TUNABLES=" + measure::keep_freed_cpu_memory_tunables();
  std::vector<char*> env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    if (std::strncmp(*entry, "GLIBC_TUNABLES=", 15) != 0) {
      env.push_back(*entry);
    }
  }
  env.push_back(const_cast<char*>(tunables.c_str()));
  env.push_back(nullptr);
  const int spawn_error = posix_spawn(
      &pid_, argv.at(0).c_str(), &actions, nullptr, args.data(), env.data());
  posix_spawn_file_actions_destroy(&actions);
  ::close(to_child[0]);
  ::close(from_child[1]);
  to_child_fd_ = to_child[1];
  from_child_fd_ = from_child[0];
  if (spawn_error != 0) {
    pid_ = -1;
    fail("cannot run " + argv.at(0) + ": " + std::strerror(spawn_error));
    return;
  }
  const auto line = read_line(greeting_timeout_s);
  if (!line) {
    return;  // read_line said why
  }
  try {
    greeting_ = nlohmann::json::parse(*line);
  } catch (const nlohmann::json::exception&) {
    fail("its first line is not JSON: " + *line);
    return;
  }
  if (!greeting_.value("ready", false)) {
    fail(greeting_.value("error", std::string("it did not say it is ready")));
  }
}

PythonPeer::~PythonPeer() {
  if (pid_ > 0) {
    if (to_child_fd_ >= 0) {
      IgnoreSigpipe guard;
      const std::string quit = "{\"cmd\": \"quit\"}\n";
      [[maybe_unused]] const auto written =
          ::write(to_child_fd_, quit.data(), quit.size());
    }
    close_fd(to_child_fd_);
    int status = 0;
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  close_fd(to_child_fd_);
  close_fd(from_child_fd_);
}

std::optional<nlohmann::json> PythonPeer::request(
    const nlohmann::json& command, int timeout_s) {
  if (!available()) {
    return std::nullopt;
  }
  const std::string text = command.dump() + "\n";
  {
    IgnoreSigpipe guard;
    size_t sent = 0;
    while (sent < text.size()) {
      const auto written =
          ::write(to_child_fd_, text.data() + sent, text.size() - sent);
      if (written < 0 && errno == EINTR) {
        continue;
      }
      if (written <= 0) {
        fail(std::string("cannot send a command: ") + std::strerror(errno));
        return std::nullopt;
      }
      sent += static_cast<size_t>(written);
    }
  }
  const auto line = read_line(timeout_s);
  if (!line) {
    return std::nullopt;
  }
  try {
    return nlohmann::json::parse(*line);
  } catch (const nlohmann::json::exception&) {
    fail("a reply that is not JSON: " + *line);
    return std::nullopt;
  }
}

std::optional<std::string> PythonPeer::read_line(int timeout_s) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (true) {
    const auto newline = pending_.find('\n');
    if (newline != std::string::npos) {
      std::string line = pending_.substr(0, newline);
      pending_.erase(0, newline + 1);
      return line;
    }
    const auto left_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             deadline - std::chrono::steady_clock::now())
                             .count();
    if (left_ms <= 0) {
      fail("no reply within " + std::to_string(timeout_s) + " s");
      return std::nullopt;
    }
    pollfd ready{from_child_fd_, POLLIN, 0};
    const int polled = ::poll(&ready, 1, static_cast<int>(left_ms));
    if (polled < 0 && errno == EINTR) {
      continue;
    }
    if (polled < 0) {
      fail(std::string("poll failed: ") + std::strerror(errno));
      return std::nullopt;
    }
    if (polled == 0) {
      continue;  // the deadline check above reports it
    }
    char chunk[4096];
    const auto count = ::read(from_child_fd_, chunk, sizeof(chunk));
    if (count < 0 && errno == EINTR) {
      continue;
    }
    if (count <= 0) {
      int status = 0;
      std::string how = "it closed its output";
      if (pid_ > 0 && ::waitpid(pid_, &status, 0) == pid_) {
        pid_ = -1;
        if (WIFEXITED(status)) {
          how = "it exited with status " + std::to_string(WEXITSTATUS(status));
        } else if (WIFSIGNALED(status)) {
          how = "it was killed by signal " + std::to_string(WTERMSIG(status));
        }
      }
      fail(how);
      return std::nullopt;
    }
    pending_.append(chunk, static_cast<size_t>(count));
  }
}

void PythonPeer::fail(const std::string& why) {
  if (!why_unavailable_.empty()) {
    return;
  }
  why_unavailable_ = why;
  const std::string tail = log_tail();
  if (!tail.empty()) {
    why_unavailable_ += " (its stderr, " + log_path_ + ", ends: " + tail + ")";
  }
}

std::string PythonPeer::log_tail() const {
  std::ifstream log(log_path_);
  std::deque<std::string> lines;
  for (std::string line; std::getline(log, line);) {
    if (!line.empty()) {
      lines.push_back(line);
    }
    if (lines.size() > 3) {
      lines.pop_front();
    }
  }
  std::string tail;
  for (const auto& line : lines) {
    tail += (tail.empty() ? "" : " | ") + line;
  }
  return tail;
}

}  // namespace remat::bench
