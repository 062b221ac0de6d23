// gnuplot.cpp: finding and running gnuplot (see gnuplot.h).
#include "gnuplot.h"

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace remat::cli {
namespace {

// `text` quoted for /bin/sh.
std::string shell_quote(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted += c;
    }
  }
  return quoted + "'";
}

}  // namespace

bool gnuplot_available() {
  const char* path = std::getenv("PATH");
  if (path == nullptr) {
    return false;
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
      return true;
    }
  }
  return false;
}

std::string run_gnuplot(const std::string& script_path) {
  if (!gnuplot_available()) {
    return "gnuplot is not on PATH (Debian: apt-get install gnuplot-nox)";
  }
  const std::filesystem::path script = std::filesystem::absolute(script_path);
  const std::filesystem::path log =
      script.parent_path() / (script.stem().string() + ".gnuplot.log");
  const std::string command =
      "cd " + shell_quote(script.parent_path().string()) + " && gnuplot " +
      shell_quote(script.filename().string()) + " 2> " +
      shell_quote(log.string());
  const int status = std::system(command.c_str());
  if (status == 0) {
    std::error_code error;
    std::filesystem::remove(log, error);
    return "";
  }
  std::ifstream log_file(log);
  std::string first_lines, line;
  for (int lines = 0; lines < 3 && std::getline(log_file, line); ++lines) {
    first_lines += (lines ? " | " : "") + line;
  }
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : status;
  return "gnuplot failed (exit status " + std::to_string(code) +
         "): " + first_lines + " (full log: " + log.string() + ")";
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
