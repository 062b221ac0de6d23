"""peer_common.py - what the PyTorch sides of the benchmarks share (E3, E6):
the reply channel and remat's memory meter.

The meter is remat's tracking CPU allocator, loaded from libremat_meter.so with
ctypes before torch is imported: Debian's python3-torch runs on the system
libc10, so the allocator that counts the C++ process's bytes counts this
process's bytes too. check_sees() allocates a known tensor and refuses to
report memory if the meter did not see it.

Standard library only.
"""

import ctypes
import json
import sys


def reply(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


class Meter:
    """remat's tracking CPU allocator through libremat_meter.so (ctypes)."""

    def __init__(self, path):
        self.library = None
        self.status = "no meter library given (--meter)"
        if not path:
            return
        try:
            library = ctypes.CDLL(path)
        except OSError as error:
            self.status = "cannot load %s: %s" % (path, error)
            return
        for name in ("remat_meter_current_bytes", "remat_meter_peak_bytes",
                     "remat_meter_baseline_bytes"):
            getattr(library, name).restype = ctypes.c_int64
        library.remat_meter_install.restype = ctypes.c_int
        library.remat_meter_error.restype = ctypes.c_char_p
        library.remat_meter_reset.restype = None
        if library.remat_meter_install() != 0:
            self.status = library.remat_meter_error().decode(errors="replace")
            return
        self.library = library
        self.status = "ok"

    def available(self):
        return self.library is not None

    def check_sees(self, torch):
        """Refuses the meter if a fresh torch tensor does not show in it."""
        if not self.available():
            return
        nbytes = 1 << 22
        before = self.library.remat_meter_current_bytes()
        probe = torch.empty(nbytes // 4, dtype=torch.float32)
        during = self.library.remat_meter_current_bytes()
        del probe
        if during - before < nbytes:
            self.library = None
            self.status = ("the meter did not see a %d-byte torch tensor "
                           "(saw %d bytes): this torch does not allocate "
                           "through the libc10 the meter was built against"
                           % (nbytes, during - before))

    def reset(self):
        if self.available():
            self.library.remat_meter_reset()

    def peak_delta_bytes(self):
        if not self.available():
            return None
        return (self.library.remat_meter_peak_bytes() -
                self.library.remat_meter_baseline_bytes())


def measured_step(meter, forward_loss):
    """One step as the C++ harness times it: forward_loss() (the forward and
    the loss, the output not held past the loss), then backward. The meter is
    restarted just before the forward; its peak minus that baseline is the
    activation peak (None without a meter)."""
    import gc
    import time
    gc.collect()
    meter.reset()
    start = time.perf_counter()
    loss = forward_loss()
    forward_end = time.perf_counter()
    loss.backward()
    backward_end = time.perf_counter()
    peak_bytes = meter.peak_delta_bytes()
    del loss
    return {"forward_ms": 1e3 * (forward_end - start),
            "backward_ms": 1e3 * (backward_end - forward_end),
            "peak_bytes": peak_bytes}


def greet(torch, meter, **extra):
    """The start-up line of a peer that is ready: torch, Python, threads and
    the meter's status, and the peer's own fields."""
    import platform
    reply(dict({"ready": True,
                "torch": torch.__version__,
                "python": platform.python_version(),
                "executable": sys.executable,
                "threads": torch.get_num_threads(),
                "meter": meter.status}, **extra))


def serve(handlers):
    """Answers one JSON command per line of stdin with handlers[cmd](command)
    until {"cmd": "quit"} or the end of stdin. A failed command answers
    {"error": ...} and the loop goes on."""
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            command = json.loads(line)
            name = command.get("cmd")
            if name == "quit":
                break
            if name not in handlers:
                reply({"error": "unknown command %r" % name})
                continue
            reply(handlers[name](command))
        except Exception as error:  # one failed command ends nothing else
            reply({"error": "%s: %s" % (type(error).__name__, error)})
