// progress.h: a progress line that updates in place on a terminal.
//
// Live mode (stdout is a TTY): each update rewrites the same line with "\r"
// and pads over leftovers of a longer previous line; finish() ends the line.
// Plain mode (stdout is a file or pipe): update() prints a whole line, but
// only every `plain_every`-th call and the last one (force), so logs stay
// short and nothing in them is a control character.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

namespace remat::cli {

/// True when stdout is a terminal (isatty), i.e. progress can update live.
bool stdout_is_terminal();

class ProgressLine {
 public:
  /// `live`: update in place (usually stdout_is_terminal()).
  /// `plain_every`: in plain mode, print one call in this many (>= 1).
  ProgressLine(std::ostream& out, bool live, int64_t plain_every = 1);
  ~ProgressLine();
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  /// Shows `text`. In plain mode prints it if this is the plain_every-th
  /// call since the last printed one, or if `force`.
  void update(const std::string& text, bool force = false);
  /// Ends a live line (newline); no-op in plain mode or if nothing is shown.
  void finish();

 private:
  std::ostream& out_;
  bool live_;
  int64_t plain_every_;
  int64_t calls_ = 0;
  size_t shown_chars_ = 0;
};

/// "12 s", "3 min 05 s", "1 h 02 min".
std::string format_duration(double seconds);

}  // namespace remat::cli
