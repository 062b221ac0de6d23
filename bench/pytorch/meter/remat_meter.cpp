// remat_meter.cpp — the C interface of remat_meter.h over remat::MemoryMeter.
//
// Uses the public remat API only. No C++ exception crosses the C boundary:
// install() turns one into -1 and a stored message.
#include "remat_meter.h"

#include <remat/memory_meter.h>

#include <exception>
#include <memory>
#include <mutex>
#include <string>

namespace {

std::mutex g_mutex;
std::string g_error;
// Leaked on purpose: tensors freed during static destruction still reach the
// tracking allocator, and the meter must not die before them.
remat::MemoryMeter* g_meter = nullptr;

}  // namespace

extern "C" int remat_meter_install(void) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_meter != nullptr) {
    return 0;
  }
  try {
    remat::install_tracking_allocator();
    g_meter = new remat::MemoryMeter(c10::kCPU);
    g_error.clear();
    return 0;
  } catch (const std::exception& error) {
    g_error = std::string("remat_meter_install: ") + error.what();
  } catch (...) {
    g_error = "remat_meter_install: an unknown exception";
  }
  return -1;
}

extern "C" const char* remat_meter_error(void) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_error.c_str();
}

extern "C" void remat_meter_reset(void) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_meter != nullptr) {
    g_meter->reset();
  }
}

extern "C" int64_t remat_meter_current_bytes(void) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_meter != nullptr ? g_meter->current_bytes() : -1;
}

extern "C" int64_t remat_meter_peak_bytes(void) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_meter != nullptr ? g_meter->peak_bytes() : -1;
}

extern "C" int64_t remat_meter_baseline_bytes(void) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_meter != nullptr ? g_meter->baseline_bytes() : -1;
}
