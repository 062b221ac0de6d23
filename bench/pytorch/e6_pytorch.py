#!/usr/bin/python3
"""e6_pytorch.py - the PyTorch side of benchmark E6 (remat next to PyTorch's own
checkpointing), driven line by line by the C++ scenario (remat_bench e6).

What it does
  Builds the residual FFN stack of models/residual_ffn.h in Python
  (x + fc2(dropout(gelu(fc1(norm(x))))) per block, parameters named as the C++
  Sequential names them), loads the C++ side's parameters and input from the
  manifest it was given, and runs training steps with torch.utils.checkpoint on
  request. Memory is measured by remat's own tracking CPU allocator, loaded
  from libremat_meter.so with ctypes before torch is imported: Debian's
  python3-torch runs on the system libc10, so the allocator that counts the
  C++ process's bytes counts this process's bytes too. A check at start-up
  allocates a known tensor and refuses to report memory if the meter did not
  see it.

Protocol (one JSON object per line; stdout carries nothing else)
  start-up    -> {"ready": true, "torch": ..., "meter": "ok" | why not, ...}
                 or {"ready": false, "error": ...}
  {"cmd": "step", "kind": K, "segments": S, "seed": N, "train": bool,
   "reference": bool}
              -> {"forward_ms", "backward_ms", "peak_bytes", "grad_diff"}
     One timed step (forward + loss, then backward) of schedule K:
       none                  plain autograd
       per-block             checkpoint(block, use_reentrant=False) per block
       per-block-reentrant   checkpoint(block, use_reentrant=True) per block
       sequential            checkpoint_sequential(S) without reentrance
       sequential-reentrant  checkpoint_sequential(S), reentrant
     peak_bytes is the activation peak: the meter is reset just before the
     forward, with the parameter gradients allocated and zeroed, and the peak
     minus that baseline is reported. "reference": true keeps this step's
     gradients; a later step with the same seed reports the largest absolute
     difference from them as grad_diff (else null).
  {"cmd": "grad", ..., "path": P}
              -> {"bytes": n}: one untimed step, its parameter gradients
                 written to P as raw float32 in manifest order.
  {"cmd": "quit"}
  A failed command answers {"error": ...} and the loop goes on.

Versions: written for torch 1.13 and 2.x alike. Every checkpoint call names
use_reentrant. Where checkpoint_sequential takes no use_reentrant (1.13 is
reentrant only), the non-reentrant sequential schedule is built here from the
same segments (size n // S, the last segment not checkpointed) with
checkpoint(use_reentrant=False); the start-up line says which was used.

Standard library and torch only; little-endian machines only (the files are
little-endian float32).
"""

import argparse
import inspect
import json
import os
import sys

from peer_common import Meter, greet, measured_step, reply, serve  # beside


def parse_args():
    parser = argparse.ArgumentParser(
        description="PyTorch side of benchmark E6 (driven by remat_bench)")
    parser.add_argument("--manifest", required=True,
                        help="manifest.json written by the C++ side")
    parser.add_argument("--meter", default="",
                        help="path of libremat_meter.so (memory unmeasured "
                             "without it)")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads (default: the manifest's)")
    return parser.parse_args()


def read_floats(torch, path, offset_bytes, count):
    """count little-endian float32 values of a file, as a 1-D tensor."""
    buffer = bytearray(4 * count)
    with open(path, "rb") as stream:
        stream.seek(offset_bytes)
        if stream.readinto(buffer) != len(buffer):
            raise ValueError("%s: expected %d bytes at offset %d, got fewer"
                             % (path, len(buffer), offset_bytes))
    return torch.frombuffer(buffer, dtype=torch.float32)


def build_model(torch, manifest):
    class ResidualFfnBlock(torch.nn.Module):
        def __init__(self, dim, hidden, dropout):
            super().__init__()
            self.norm = torch.nn.LayerNorm(dim)
            self.fc1 = torch.nn.Linear(dim, hidden)
            self.gelu = torch.nn.GELU()
            self.dropout = torch.nn.Dropout(dropout)
            self.fc2 = torch.nn.Linear(hidden, dim)

        def forward(self, x):
            hidden = self.gelu(self.fc1(self.norm(x)))
            return x + self.fc2(self.dropout(hidden))

    model = torch.nn.Sequential(*[
        ResidualFfnBlock(manifest["dim"], manifest["hidden"],
                         manifest["dropout"])
        for _ in range(manifest["blocks"])])
    directory = os.path.dirname(os.path.abspath(manifest["path"]))
    weights_path = os.path.join(directory, manifest["weights"])
    parameters = dict(model.named_parameters())
    entries = manifest["parameters"]
    if sorted(parameters) != sorted(entry["name"] for entry in entries):
        raise ValueError("the manifest's parameter names differ from the "
                         "Python model's: %s vs %s"
                         % (sorted(entry["name"] for entry in entries)[:4],
                            sorted(parameters)[:4]))
    total = sum(entry["numel"] for entry in entries)
    flat = read_floats(torch, weights_path, 0, total)
    with torch.no_grad():
        for entry in entries:
            parameter = parameters[entry["name"]]
            if list(parameter.shape) != entry["shape"]:
                raise ValueError("%s: shape %s in the manifest, %s here"
                                 % (entry["name"], entry["shape"],
                                    list(parameter.shape)))
            start = entry["offset_bytes"] // 4
            parameter.copy_(
                flat[start:start + entry["numel"]].view(parameter.shape))
    del flat
    model.train()
    order = [parameters[entry["name"]] for entry in entries]
    return model, order


class Schedules:
    """The checkpointing schedules, by the names the C++ side uses."""

    def __init__(self, torch, model):
        from torch.utils import checkpoint as checkpoint_module
        self.torch = torch
        self.model = model
        self.checkpoint = checkpoint_module.checkpoint
        self.checkpoint_sequential = checkpoint_module.checkpoint_sequential
        accepted = inspect.signature(self.checkpoint_sequential).parameters
        self.sequential_takes_mode = "use_reentrant" in accepted
        if self.sequential_takes_mode:
            self.sequential_note = "checkpoint_sequential(use_reentrant=...)"
        else:
            self.sequential_note = (
                "checkpoint_sequential for the reentrant schedule; this "
                "torch's checkpoint_sequential is reentrant only, so the "
                "non-reentrant one is its segments (n // S each, last one "
                "plain) with checkpoint(use_reentrant=False)")

    def run(self, kind, segments, x):
        if kind == "none":
            return self.model(x)
        if kind in ("per-block", "per-block-reentrant"):
            reentrant = kind == "per-block-reentrant"
            for block in self.model:
                x = self.checkpoint(block, x, use_reentrant=reentrant)
            return x
        if kind == "sequential-reentrant":
            if self.sequential_takes_mode:
                return self.checkpoint_sequential(self.model, segments, x,
                                                  use_reentrant=True)
            return self.checkpoint_sequential(self.model, segments, x)
        if kind == "sequential":
            if self.sequential_takes_mode:
                return self.checkpoint_sequential(self.model, segments, x,
                                                  use_reentrant=False)
            return self.segments_without_reentrance(segments, x)
        raise ValueError("unknown schedule %r" % kind)

    def segments_without_reentrance(self, segments, x):
        blocks = list(self.model)
        if not 1 <= segments <= len(blocks):
            raise ValueError("segments must be in [1, %d], got %d"
                             % (len(blocks), segments))
        size = len(blocks) // segments

        def run_range(first, last):
            def forward(value):
                for block in blocks[first:last]:
                    value = block(value)
                return value
            return forward

        end = 0
        for start in range(0, size * (segments - 1), size):
            end = start + size
            x = self.checkpoint(run_range(start, end), x, use_reentrant=False)
        return run_range(end, len(blocks))(x)


class Runner:
    def __init__(self, torch, model, parameters, x, meter):
        self.torch = torch
        self.model = model
        self.parameters = parameters
        self.x = x
        self.meter = meter
        self.schedules = Schedules(torch, model)
        self.reference_seed = None
        self.reference_grads = []
        for parameter in parameters:
            parameter.grad = torch.zeros_like(parameter)

    def step(self, command, timed):
        torch = self.torch
        for parameter in self.parameters:
            parameter.grad.zero_()
        self.x.grad = None
        self.model.train(bool(command.get("train", True)))
        torch.manual_seed(int(command["seed"]))
        kind = command["kind"]
        segments = int(command.get("segments", 1))
        result = measured_step(self.meter, lambda: self.schedules.run(
            kind, segments, self.x).pow(2).mean())
        self.x.grad = None
        if not timed:
            result = {}
        return result

    def timed_step(self, command):
        result = self.step(command, timed=True)
        seed = int(command["seed"])
        if command.get("reference", False):
            self.reference_seed = seed
            self.reference_grads = [p.grad.clone() for p in self.parameters]
            result["grad_diff"] = 0.0
        elif self.reference_seed == seed:
            result["grad_diff"] = max(
                (p.grad - ref).abs().max().item()
                for p, ref in zip(self.parameters, self.reference_grads))
        else:
            result["grad_diff"] = None
        return result

    def write_grads(self, command):
        self.step(command, timed=False)
        torch = self.torch
        total = sum(p.numel() for p in self.parameters)
        buffer = bytearray(4 * total)
        flat = torch.frombuffer(buffer, dtype=torch.float32)
        start = 0
        for parameter in self.parameters:
            count = parameter.numel()
            flat[start:start + count].copy_(parameter.grad.reshape(-1))
            start += count
        del flat
        with open(command["path"], "wb") as stream:
            stream.write(buffer)
        return {"bytes": len(buffer)}


def main():
    args = parse_args()
    if sys.byteorder != "little":
        reply({"ready": False, "error": "a big-endian machine: the E6 files "
                                        "are little-endian float32"})
        return 1
    try:
        with open(args.manifest) as stream:
            manifest = json.load(stream)
        manifest["path"] = args.manifest
    except (OSError, ValueError) as error:
        reply({"ready": False, "error": "cannot read the manifest %s: %s"
                                        % (args.manifest, error)})
        return 1
    # The meter goes in before torch allocates anything this script measures.
    meter = Meter(args.meter)
    try:
        import torch
    except ImportError as error:
        reply({"ready": False, "error": "no torch for %s: %s"
                                        % (sys.executable, error)})
        return 1
    meter.check_sees(torch)
    torch.set_num_threads(args.threads or int(manifest["threads"]))
    try:
        model, parameters = build_model(torch, manifest)
        directory = os.path.dirname(os.path.abspath(args.manifest))
        shape = manifest["input"]["shape"]
        count = 1
        for size in shape:
            count *= size
        x = read_floats(torch, os.path.join(directory,
                                            manifest["input"]["file"]),
                        0, count).view(shape).clone().requires_grad_(True)
        runner = Runner(torch, model, parameters, x, meter)
    except Exception as error:  # reported to the driver, which decides
        reply({"ready": False, "error": "%s: %s"
                                        % (type(error).__name__, error)})
        return 1
    greet(torch, meter, sequential=runner.schedules.sequential_note)
    serve({"step": runner.timed_step, "grad": runner.write_grads})
    return 0


if __name__ == "__main__":
    sys.exit(main())
