// progress.cpp: live (\r) or plain progress lines; see progress.h.
#include "progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace remat::cli {

bool stdout_is_terminal() {
  return isatty(STDOUT_FILENO) == 1;
}

ProgressLine::ProgressLine(std::ostream& out, bool live, int64_t plain_every)
    : out_(out), live_(live), plain_every_(std::max<int64_t>(1, plain_every)) {}

ProgressLine::~ProgressLine() {
  finish();
}

void ProgressLine::update(const std::string& text, bool force) {
  ++calls_;
  if (live_) {
    out_ << '\r' << text;
    if (text.size() < shown_chars_) {
      out_ << std::string(shown_chars_ - text.size(), ' ');
    }
    shown_chars_ = text.size();
    out_.flush();
    return;
  }
  if (force || calls_ % plain_every_ == 0 || calls_ == 1) {
    out_ << text << '\n';
    out_.flush();
  }
}

void ProgressLine::finish() {
  if (live_ && shown_chars_ > 0) {
    out_ << '\n';
    out_.flush();
    shown_chars_ = 0;
  }
}

std::string format_duration(double seconds) {
  char text[64];
  const auto whole = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  if (whole < 60) {
    std::snprintf(text, sizeof(text), "%lld s", static_cast<long long>(whole));
  } else if (whole < 3600) {
    std::snprintf(
        text,
        sizeof(text),
        "%lld min %02lld s",
        static_cast<long long>(whole / 60),
        static_cast<long long>(whole % 60));
  } else {
    std::snprintf(
        text,
        sizeof(text),
        "%lld h %02lld min",
        static_cast<long long>(whole / 3600),
        static_cast<long long>((whole % 3600) / 60));
  }
  return text;
}

}  // namespace remat::cli
