// remat_meter.h — remat's CPU memory meter behind a C interface, for processes
// that are not C++: benchmark E6 loads libremat_meter.so into Python with
// ctypes so that PyTorch's own checkpointing is measured by exactly the code
// that measures remat (remat::MemoryMeter on its tracking CPU allocator).
//
// The library links the same libc10 as Debian's python3-torch, so installing
// the tracking allocator here replaces the CPU allocator of `import torch` as
// well. Call remat_meter_install() before the process allocates the tensors
// to be measured: memory allocated earlier is never counted.
//
// One process-wide meter; the functions are thread-safe only in the sense of
// remat::MemoryMeter (counts are process-wide, the meter itself is meant to be
// driven from one thread).
#pragma once

#include <stdint.h>

// The library is built with hidden visibility; these are its only exports.
#define REMAT_METER_API __attribute__((visibility("default")))

#ifdef __cplusplus
extern "C" {
#endif

/// Installs the tracking CPU allocator and starts the meter. Idempotent.
/// Returns 0 on success, -1 on failure (remat_meter_error() says why).
REMAT_METER_API int remat_meter_install(void);

/// The reason of the last failure, or "" when none.
REMAT_METER_API const char* remat_meter_error(void);

/// Restarts the peak (and baseline) at the live bytes now. No-op before a
/// successful remat_meter_install().
REMAT_METER_API void remat_meter_reset(void);

/// Live CPU tensor bytes now (process-wide); -1 before install.
REMAT_METER_API int64_t remat_meter_current_bytes(void);

/// Highest live bytes since install or the last reset; -1 before install.
REMAT_METER_API int64_t remat_meter_peak_bytes(void);

/// Live bytes at install or the last reset; -1 before install.
REMAT_METER_API int64_t remat_meter_baseline_bytes(void);

#ifdef __cplusplus
}  // extern "C"
#endif
