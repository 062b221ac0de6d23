// python_peer.h — a Python process driven line by line over pipes (E6).
//
// PythonPeer starts a program (here /usr/bin/python3 running
// bench/pytorch/e6_pytorch.py), reads its first line as a JSON greeting and
// then exchanges one JSON command for one JSON reply per line. The child's
// stdin and stdout are the pipes; its stderr goes to a log file, whose last
// lines explain a failure.
//
// Failures never throw and never end the calling program: a program that
// cannot start, a greeting that says {"ready": false}, a reply that does not
// come within its timeout, or a child that exits make the peer unavailable,
// with a sentence saying why (why_unavailable()). The destructor asks the
// child to quit, waits a few seconds, then kills it.
//
// Not supported: commands or replies that span lines; more than one command
// in flight.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace remat::bench {

class PythonPeer {
 public:
  /// Starts argv[0] (a path, not searched in PATH) with argv, its stderr
  /// appended to log_path, and waits up to greeting_timeout_s for the
  /// greeting line.
  PythonPeer(
      const std::vector<std::string>& argv,
      const std::string& log_path,
      int greeting_timeout_s);
  ~PythonPeer();
  PythonPeer(const PythonPeer&) = delete;
  PythonPeer& operator=(const PythonPeer&) = delete;

  /// True while the child runs and has answered every command.
  bool available() const {
    return why_unavailable_.empty();
  }
  /// Why the peer is unavailable; empty while available.
  const std::string& why_unavailable() const {
    return why_unavailable_;
  }
  /// The greeting line (the JSON object the child printed first).
  const nlohmann::json& greeting() const {
    return greeting_;
  }
  /// Sends `command` and returns the reply; nullopt (and the peer becomes
  /// unavailable) when none arrives within timeout_s. A reply carrying an
  /// "error" field is returned as it is.
  std::optional<nlohmann::json> request(
      const nlohmann::json& command, int timeout_s);

 private:
  std::optional<std::string> read_line(int timeout_s);
  void fail(const std::string& why);
  std::string log_tail() const;

  pid_t pid_ = -1;
  int to_child_fd_ = -1;
  int from_child_fd_ = -1;
  std::string pending_;  // bytes read past the last line
  std::string log_path_;
  std::string why_unavailable_;
  nlohmann::json greeting_;
};

}  // namespace remat::bench
