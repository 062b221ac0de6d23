#!/usr/bin/python3
"""e7_pytorch.py - the PyTorch side of benchmark E7 (U-Nets), driven line by
line by the C++ scenario (remat_bench E7, bench/scenarios/e7_unet.cpp).

What it does
  Builds the U-Net of models/unet.h in Python (encoder blocks of two
  conv3x3 -> BatchNorm -> ReLU, max-pooling, a bottleneck block, decoder
  levels of a transposed convolution concatenated after the skip and a block,
  a 1x1 head; parameters named as the C++ module names them), loads the C++
  side's parameters, images and labels from the manifest it was given, and
  runs training steps with the loss of models/segmentation_data.h
  (cross-entropy + soft Dice). Memory is measured as in E6: remat's tracking
  CPU allocator from libremat_meter.so, loaded before torch (peer_common.py).

Protocol (one JSON object per line; stdout carries nothing else)
  start-up    -> {"ready": true, "torch": ..., "meter": "ok" | why not, ...}
                 or {"ready": false, "error": ...}
  {"cmd": "step", "kind": K, "seed": N}
              -> {"forward_ms", "backward_ms", "cpu_ms", "peak_bytes"}
     One timed step (forward + loss, then backward) of schedule K:
       none        plain autograd
       per-block   torch.utils.checkpoint(stage, use_reentrant=False) on
                   every stage of UNet::stages() (encoder blocks, pools,
                   bottleneck, decoder levels, head); the loss plain
     cpu_ms is the process's CPU time of the step (time.process_time).
  {"cmd": "grad", "kind": K, "seed": N, "path": P}
              -> {"bytes": n}: one untimed step, its parameter gradients
                 written to P as raw float32 in manifest order.
  {"cmd": "quit"}

Standard library and torch only; little-endian machines only.
"""

import argparse
import gc
import json
import os
import sys
import time

from peer_common import Meter, greet, reply, serve  # beside this file


def parse_args():
    parser = argparse.ArgumentParser(
        description="PyTorch side of benchmark E7 (driven by remat_bench)")
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--meter", default="")
    parser.add_argument("--threads", type=int, default=2)
    return parser.parse_args()


def read_floats(torch, path, count):
    buffer = bytearray(4 * count)
    with open(path, "rb") as stream:
        if stream.readinto(buffer) != len(buffer):
            raise ValueError("%s: expected %d bytes, got fewer"
                             % (path, len(buffer)))
    return torch.frombuffer(buffer, dtype=torch.float32)


def build_unet(torch, manifest):
    nn = torch.nn
    dims = manifest["dims"]
    conv = nn.Conv2d if dims == 2 else nn.Conv3d
    norm = nn.BatchNorm2d if dims == 2 else nn.BatchNorm3d
    pool = nn.MaxPool2d if dims == 2 else nn.MaxPool3d
    up = nn.ConvTranspose2d if dims == 2 else nn.ConvTranspose3d

    class Block(nn.Module):
        def __init__(self, in_channels, out_channels):
            super().__init__()
            self.layers = nn.Sequential(
                conv(in_channels, out_channels, 3, padding=1, bias=False),
                norm(out_channels), nn.ReLU(),
                conv(out_channels, out_channels, 3, padding=1, bias=False),
                norm(out_channels), nn.ReLU())

        def forward(self, x):
            return self.layers(x)

    class Decoder(nn.Module):
        def __init__(self, in_channels, out_channels):
            super().__init__()
            self.up = up(in_channels, out_channels, 2, stride=2)
            self.block = Block(2 * out_channels, out_channels)

        def forward(self, below, skip):
            return self.block(torch.cat([skip, self.up(below)], 1))

    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            levels = manifest["levels"]
            width = manifest["base_width"]
            self.levels = levels
            channels = manifest["in_channels"]
            for level in range(levels):
                setattr(self, "encoder%d" % level,
                        Block(channels, width << level))
                setattr(self, "pool%d" % level, pool(2))
                channels = width << level
            self.bottleneck = Block(channels, width << levels)
            for level in range(levels - 1, -1, -1):
                setattr(self, "decoder%d" % level,
                        Decoder(width << (level + 1), width << level))
            self.head = conv(width, manifest["classes"], 1, bias=True)

        def stages(self):
            """(function, takes the skip) in UNet::stages() order."""
            result = []
            for level in range(self.levels):
                result.append(("encoder", getattr(self, "encoder%d" % level)))
                result.append(("pool", getattr(self, "pool%d" % level)))
            result.append(("bottleneck", self.bottleneck))
            for level in range(self.levels - 1, -1, -1):
                result.append(("decoder%d" % level,
                               getattr(self, "decoder%d" % level)))
            result.append(("head", self.head))
            return result

        def run(self, x, wrap):
            skips = []
            for kind, module in self.stages():
                if kind.startswith("decoder"):
                    x = wrap(module, x, skips.pop())
                else:
                    x = wrap(module, x)
                if kind == "encoder":
                    skips.append(x)
            return x

    return UNet()


def load(torch, model, manifest, directory):
    parameters = dict(model.named_parameters())
    entries = manifest["parameters"]
    if sorted(parameters) != sorted(entry["name"] for entry in entries):
        raise ValueError("parameter names differ: %s vs %s"
                         % (sorted(entry["name"] for entry in entries)[:4],
                            sorted(parameters)[:4]))
    total = sum(entry["numel"] for entry in entries)
    flat = read_floats(torch, os.path.join(directory, manifest["weights"]),
                       total)
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
    return [parameters[entry["name"]] for entry in entries]


def read_tensor(torch, directory, spec):
    count = 1
    for size in spec["shape"]:
        count *= size
    return read_floats(torch, os.path.join(directory, spec["file"]),
                       count).view(spec["shape"]).clone()


def segmentation_loss(torch, logits, labels):
    """models::segmentation_loss, op for op."""
    cross_entropy = torch.nn.functional.cross_entropy(logits, labels)
    foreground_probability = 1.0 - torch.softmax(logits, 1).select(1, 0)
    foreground = labels.ne(0).to(logits.dtype)
    overlap = (foreground_probability * foreground).sum()
    soft_dice = (2.0 * overlap + 1.0) / (foreground_probability.sum() +
                                        foreground.sum() + 1.0)
    return cross_entropy + (1.0 - soft_dice)


class Runner:
    def __init__(self, torch, model, parameters, images, labels, meter):
        from torch.utils.checkpoint import checkpoint
        self.torch = torch
        self.checkpoint = checkpoint
        self.model = model
        self.parameters = parameters
        self.images = images
        self.labels = labels
        self.meter = meter
        for parameter in parameters:
            parameter.grad = torch.zeros_like(parameter)
        model.train()

    def forward_loss(self, kind):
        if kind == "none":
            wrap = lambda module, *args: module(*args)
        elif kind == "per-block":
            wrap = lambda module, *args: self.checkpoint(
                module, *args, use_reentrant=False)
        else:
            raise ValueError("unknown schedule %r" % kind)
        return segmentation_loss(self.torch, self.model.run(self.images, wrap),
                                 self.labels)

    def step(self, command):
        torch = self.torch
        for parameter in self.parameters:
            parameter.grad.zero_()
        torch.manual_seed(int(command["seed"]))
        kind = command["kind"]
        gc.collect()
        self.meter.reset()
        cpu_start = time.process_time()
        start = time.perf_counter()
        loss = self.forward_loss(kind)
        forward_end = time.perf_counter()
        loss.backward()
        backward_end = time.perf_counter()
        cpu_end = time.process_time()
        peak_bytes = self.meter.peak_delta_bytes()
        del loss
        return {"forward_ms": 1e3 * (forward_end - start),
                "backward_ms": 1e3 * (backward_end - forward_end),
                "cpu_ms": 1e3 * (cpu_end - cpu_start),
                "peak_bytes": peak_bytes}

    def write_grads(self, command):
        self.step(command)
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
        reply({"ready": False, "error": "a big-endian machine"})
        return 1
    try:
        with open(args.manifest) as stream:
            manifest = json.load(stream)
    except (OSError, ValueError) as error:
        reply({"ready": False, "error": "cannot read the manifest %s: %s"
                                        % (args.manifest, error)})
        return 1
    meter = Meter(args.meter)  # before torch allocates anything measured
    try:
        import torch
    except ImportError as error:
        reply({"ready": False, "error": "no torch for %s: %s"
                                        % (sys.executable, error)})
        return 1
    meter.check_sees(torch)
    torch.set_num_threads(args.threads)
    try:
        directory = os.path.dirname(os.path.abspath(args.manifest))
        model = build_unet(torch, manifest)
        parameters = load(torch, model, manifest, directory)
        images = read_tensor(torch, directory, manifest["images"])
        labels = read_tensor(torch, directory, manifest["labels"]).long()
        runner = Runner(torch, model, parameters, images, labels, meter)
    except Exception as error:  # reported to the driver, which decides
        reply({"ready": False, "error": "%s: %s"
                                        % (type(error).__name__, error)})
        return 1
    greet(torch, meter)
    serve({"step": runner.step, "grad": runner.write_grads})
    return 0


if __name__ == "__main__":
    sys.exit(main())
