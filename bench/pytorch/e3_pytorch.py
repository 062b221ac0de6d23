#!/usr/bin/python3
"""e3_pytorch.py - the PyTorch side of benchmark E3 (the transformer recipes),
driven line by line by the C++ scenario (remat_bench E3).

What it does
  Builds the GPT of models/gpt.h in Python at the sizes it is given (token +
  position embedding and dropout; pre-LayerNorm blocks with explicit causal
  attention, so the [batch, heads, seq, seq] scores and probabilities exist,
  dropout on the probabilities and on both residual branches, a GELU MLP of
  width 4 * hidden; final LayerNorm and a bias-free vocabulary projection),
  with its own seeded weights: E3 compares each side's recipes against that
  side's own plain run, so the weights need not be the C++ side's. Memory is
  measured by remat's tracking allocator (peer_common.Meter).

Protocol (one JSON object per line; stdout carries nothing else)
  start-up -> {"ready": true, "torch": ..., "meter": "ok" | why not,
               "kinds": [...], "missing": {kind: why}}
              or {"ready": false, "error": ...}
  {"cmd": "step", "kind": K, "seed": N}
           -> {"forward_ms", "backward_ms", "peak_bytes"}
     One timed step (forward + next-token cross-entropy, then backward):
       none       plain autograd
       full       checkpoint(block, use_reentrant=False) per block
       attention  only each attention core (scores, mask, softmax, dropout,
                  weighted sum) checkpointed, use_reentrant=False
       sac        each block checkpointed with selective checkpointing
                  (torch >= 2.4): aten.mm, aten.bmm and aten.addmm
                  MUST_SAVE, everything else PREFER_RECOMPUTE
  {"cmd": "quit"}
  A failed command answers {"error": ...} and the loop goes on.

Standard library and torch only.
"""

import argparse
import functools
import math
import sys

from peer_common import Meter, greet, measured_step, reply, serve  # beside


def parse_args():
    parser = argparse.ArgumentParser(
        description="PyTorch side of benchmark E3 (driven by remat_bench)")
    parser.add_argument("--meter", default="",
                        help="path of libremat_meter.so (memory unmeasured "
                             "without it)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=96)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--dropout", type=float, default=0.1)
    return parser.parse_args()


def build(torch, args):
    """The GPT and its recipes; returns (model, run(kind, tokens), kinds,
    missing)."""
    nn = torch.nn
    from torch.utils.checkpoint import checkpoint

    class AttentionCore(nn.Module):
        def __init__(self):
            super().__init__()
            self.dropout = nn.Dropout(args.dropout)
            self.register_buffer("causal_mask", torch.ones(
                args.seq, args.seq, dtype=torch.bool).triu(1))

        def forward(self, qkv):
            batch, seq, _ = qkv.shape
            head_dim = args.hidden // args.heads
            parts = qkv.view(batch, seq, 3, args.heads, head_dim).permute(
                2, 0, 3, 1, 4)
            query, key, value = parts[0], parts[1], parts[2]
            scores = torch.matmul(query, key.transpose(-2, -1)) * (
                1.0 / math.sqrt(head_dim))
            mask = self.causal_mask[:seq, :seq]
            scores = scores.masked_fill(mask, float("-inf"))
            probabilities = self.dropout(torch.softmax(scores, -1))
            context = torch.matmul(probabilities, value)
            return context.transpose(1, 2).reshape(batch, seq, args.hidden)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(args.hidden)
            self.qkv = nn.Linear(args.hidden, 3 * args.hidden)
            self.core = AttentionCore()
            self.proj = nn.Linear(args.hidden, args.hidden)
            self.attention_dropout = nn.Dropout(args.dropout)
            self.ln2 = nn.LayerNorm(args.hidden)
            self.fc1 = nn.Linear(args.hidden, 4 * args.hidden)
            self.fc2 = nn.Linear(4 * args.hidden, args.hidden)
            self.dropout = nn.Dropout(args.dropout)
            self.checkpoint_core = False

        def forward(self, x):
            packed = self.qkv(self.ln1(x))
            if self.checkpoint_core:
                context = checkpoint(self.core, packed, use_reentrant=False)
            else:
                context = self.core(packed)
            x = x + self.attention_dropout(self.proj(context))
            mlp = self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))
            return x + self.dropout(mlp)

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.token = nn.Embedding(args.vocab, args.hidden)
            self.position = nn.Embedding(args.seq, args.hidden)
            self.embedding_dropout = nn.Dropout(args.dropout)
            self.blocks = nn.ModuleList(Block() for _ in range(args.layers))
            self.norm = nn.LayerNorm(args.hidden)
            self.head = nn.Linear(args.hidden, args.vocab, bias=False)

        def forward(self, tokens, wrap_block):
            positions = torch.arange(tokens.shape[1])
            x = self.embedding_dropout(
                self.token(tokens) + self.position(positions))
            for block in self.blocks:
                x = wrap_block(block, x)
            return self.head(self.norm(x))

    torch.manual_seed(5)
    model = Gpt()
    model.train()

    def plain(block, x):
        return block(x)

    def whole_block(block, x):
        return checkpoint(block, x, use_reentrant=False)

    wrappers = {"none": plain, "full": whole_block, "attention": plain}
    missing = {}
    try:
        from torch.utils.checkpoint import (
            CheckpointPolicy, create_selective_checkpoint_contexts)
        ops = torch.ops.aten
        saved = {ops.mm.default, ops.bmm.default, ops.addmm.default}

        def policy(ctx, op, *args, **kwargs):
            return (CheckpointPolicy.MUST_SAVE if op in saved
                    else CheckpointPolicy.PREFER_RECOMPUTE)

        contexts = functools.partial(create_selective_checkpoint_contexts,
                                     policy)

        def selective(block, x):
            return checkpoint(block, x, use_reentrant=False,
                              context_fn=contexts)

        wrappers["sac"] = selective
    except ImportError:
        missing["sac"] = ("torch %s has no selective checkpointing "
                          "(create_selective_checkpoint_contexts, torch >= "
                          "2.4)" % torch.__version__)

    def run(kind, tokens, targets):
        if kind not in wrappers:
            raise ValueError("unknown or unavailable recipe %r" % kind)
        for block in model.blocks:
            block.checkpoint_core = kind == "attention"
        logits = model(tokens, wrappers[kind])
        return nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[2]), targets.reshape(-1))

    return model, run, list(wrappers), missing


def main():
    args = parse_args()
    # The meter goes in before torch allocates anything this script measures.
    meter = Meter(args.meter)
    try:
        import torch
    except ImportError as error:
        reply({"ready": False, "error": "no torch for %s: %s"
                                        % (sys.executable, error)})
        return 1
    meter.check_sees(torch)
    torch.set_num_threads(args.threads)
    try:
        model, run, kinds, missing = build(torch, args)
        generator = torch.Generator().manual_seed(6)
        tokens = torch.randint(args.vocab, (args.batch, args.seq),
                               generator=generator)
        targets = torch.randint(args.vocab, (args.batch, args.seq),
                                generator=generator)
        for parameter in model.parameters():
            parameter.grad = torch.zeros_like(parameter)
    except Exception as error:  # reported to the driver, which decides
        reply({"ready": False, "error": "%s: %s"
                                        % (type(error).__name__, error)})
        return 1
    greet(torch, meter, kinds=kinds, missing=missing)

    def step(command):
        for parameter in model.parameters():
            parameter.grad.zero_()
        torch.manual_seed(int(command["seed"]))
        kind = command["kind"]
        return measured_step(meter, lambda: run(kind, tokens, targets))

    serve({"step": step})
    return 0


if __name__ == "__main__":
    sys.exit(main())
