// remat/planner/units.h: how remat writes byte counts for people.
#pragma once

#include <cstdint>
#include <string>

namespace remat::planner {

/// `bytes` with a binary unit and three significant digits: "512 B",
/// "1.50 KiB", "37.2 MiB", "2.00 GiB" (B, KiB, MiB, GiB, TiB, PiB, EiB).
/// Negative values get a leading "-". Never throws.
std::string format_bytes(int64_t bytes);

}  // namespace remat::planner
