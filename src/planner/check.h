// Private: REMAT_PLANNER_CHECK, the planner's one way to state an internal
// invariant, and number_text() for the values error messages name.
//
// A failed check is a bug in the planner, never the caller's mistake: it
// throws std::logic_error naming the condition, file:line and what broke, in
// every build (assert() vanishes under NDEBUG, so a Release build would
// carry on with a broken table or plan). Errors in what the caller passed
// stay std::invalid_argument (or std::out_of_range) with the value received,
// thrown where the input is read. The check is one predictable branch; the
// message is only built on failure.
#pragma once

#include <cstdio>
#include <stdexcept>
#include <string>

namespace remat::planner::detail {

/// `value` as an error message names it: "%g" (1.7e+308, not 309 digits).
inline std::string number_text(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", value);
  return text;
}

[[noreturn]] inline void check_failed(
    const char* condition, const char* file, int line, const char* message) {
  throw std::logic_error(
      std::string("remat::planner internal error: ") + message + " (" +
      condition + " failed at " + file + ":" + std::to_string(line) + ")");
}

}  // namespace remat::planner::detail

/// Throws std::logic_error unless `condition` holds; `message` (a string
/// literal) says which invariant broke.
#define REMAT_PLANNER_CHECK(condition, message)     \
  do {                                              \
    if (__builtin_expect(!(condition), 0)) {        \
      ::remat::planner::detail::check_failed(       \
          #condition, __FILE__, __LINE__, message); \
    }                                               \
  } while (false)
