// budget.h: the --budget flag: bytes with units, a percentage, or "none".
//
// Grammar (case-insensitive units, optional spaces before the unit):
//   budget  := "none" | number "%" | number [unit]
//   unit    := "B" | "KB" | "MB" | "GB" | "TB"       (powers of 1000)
//            | "KiB" | "MiB" | "GiB" | "TiB"         (powers of 1024)
//   number  := digits ["." digits]
// A byte budget must be a positive whole number of bytes after scaling
// ("1.5KiB" is 1536 bytes; "1.5" is rejected) and at most 2^60 bytes. A
// percentage must be in (0, 1000]; it is a fraction of the no-checkpoint
// activation peak, which the command resolves (resolve_budget_bytes).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace remat::cli {

/// A parsed --budget value.
struct BudgetSpec {
  enum class Kind {
    kNone,      ///< no budget: keep everything (no checkpointing needed)
    kBytes,     ///< an absolute number of bytes
    kFraction,  ///< a fraction of the no-checkpoint activation peak
  };
  Kind kind = Kind::kNone;
  /// Bytes, for kBytes; > 0.
  int64_t bytes = 0;
  /// Fraction, for kFraction; in (0, 10]. "50%" is 0.5.
  double fraction = 0;

  /// The canonical text: "none", "50%", or "512 MiB (536870912 bytes)".
  std::string to_string() const;
};

/// Parses a --budget value (grammar at the top of this header).
/// Throws std::invalid_argument naming the value and what was expected, e.g.
/// "expected bytes (512MiB, 1GiB, 300MB, 1000000), a percentage of the
/// no-checkpoint peak (50%) or 'none'; got '10XB' (unknown unit 'XB')".
///
/// Example:
///   BudgetSpec budget = parse_budget("512MiB");  // kBytes, 536870912
BudgetSpec parse_budget(std::string_view text);

/// The budget in bytes: `budget.bytes`, `budget.fraction` times
/// `no_checkpoint_peak_bytes` (rounded to nearest, at least 1), or
/// `no_checkpoint_peak_bytes` for kNone.
int64_t resolve_budget_bytes(
    const BudgetSpec& budget, int64_t no_checkpoint_peak_bytes);

/// Human-readable bytes with a binary unit and three significant digits:
/// "512 B", "1.50 KiB", "37.2 MiB", "2.00 GiB". Negative values get a "-".
std::string format_bytes(int64_t bytes);

}  // namespace remat::cli
