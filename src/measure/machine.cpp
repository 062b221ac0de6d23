// machine.cpp — describe_machine (see machine.h). Linux: /proc is read; where
// it is missing the fields say "unknown".
#include "remat/measure/machine.h"

#include <ctime>
#include <fstream>
#include <sstream>
#include <thread>

#include <torch/torch.h>
#include <torch/version.h>

namespace remat::measure {
namespace {

std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos && colon + 2 <= line.size()) {
        return line.substr(colon + 2);
      }
    }
  }
  return "unknown CPU";
}

std::string load_average() {
  std::ifstream loadavg("/proc/loadavg");
  std::string one_minute;
  return loadavg >> one_minute ? one_minute : "unknown";
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%d %H:%M UTC", &utc);
  return text;
}

}  // namespace

std::string Machine::to_string() const {
  std::ostringstream out;
  out << date << "; " << cpu_model << "; " << cores << " cores; "
      << torch_threads << " torch threads; LibTorch " << libtorch
      << "; load average " << load_average;
  return out.str();
}

double read_load_average() {
  std::ifstream loadavg("/proc/loadavg");
  double one_minute = -1;
  return loadavg >> one_minute ? one_minute : -1;
}

Machine describe_machine() {
  Machine machine;
  machine.date = utc_now();
  machine.cpu_model = cpu_model();
  machine.cores = static_cast<int>(std::thread::hardware_concurrency());
  machine.torch_threads = torch::get_num_threads();
  machine.libtorch = TORCH_VERSION;
  machine.load_average = load_average();
  return machine;
}

}  // namespace remat::measure
