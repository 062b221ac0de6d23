// remat/measure/machine.h — where and when a benchmark ran: the machine line of
// every section.
//
// CONTRACT (stable): describe_machine() reads /proc (CPU model, 1-minute load
// average), std::thread (hardware threads), torch (intra-op threads, the
// LibTorch version this program was built with) and the clock (UTC date and
// time). It never throws: what cannot be read is "unknown". to_string()
// gives the one-line form printed under every section heading, e.g.
//   2025-01-31 14:02 UTC; Intel Xeon ... ; 2 cores; 2 torch threads;
//   LibTorch 1.13.1; load average 1.52
#pragma once

#include <string>

namespace remat::measure {

/// The machine and moment of a run.
struct Machine {
  std::string date;          // "2025-01-31 14:02 UTC"
  std::string cpu_model;     // /proc/cpuinfo "model name"
  int cores = 0;             // hardware threads (std::thread)
  int torch_threads = 0;     // torch::get_num_threads() when described
  std::string libtorch;      // TORCH_VERSION, e.g. "1.13.1"
  std::string load_average;  // 1-minute load average, e.g. "1.52"
  /// The one-line form (see the top of this header).
  std::string to_string() const;
};

/// The 1-minute load average (/proc/loadavg), or -1 if it cannot be read.
double read_load_average();

/// Describes this machine now. Call after torch::set_num_threads().
Machine describe_machine();

}  // namespace remat::measure
