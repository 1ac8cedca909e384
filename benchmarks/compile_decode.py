"""`torch.compile` and the engine's decode step (`decoder.decode_step`): does it pay?

    .venv/bin/python benchmarks/compile_decode.py [--presets small,medium] [--rows 32]
        [--window 150] [--steps 64] [--repeats 4] [--threads 2]

For each preset, one decode step of `--rows` rows against a KV cache holding `--window`
columns, `--steps` steps in a row (the cache grows by one column each), timed as shipped
(eager, fp32 projections on MKL's packed GEMM where it pays), eager with every projection a
plain `F.linear`, and two compiled forms on the `F.linear` weights (inductor has no lowering
for MKL's packed op at dynamic shapes):

- `whole step`: `torch.compile(decode_step, dynamic=True)`; the cache's column counters are
  Python ints, so each new column is a guard failure and a recompilation, until dynamo's
  recompile limit sends the step back to eager through a failed guard on every call.
- `elementwise`: only RMSNorm, the rotary and the SiLU gate compiled (`dynamic=True`), the
  matmuls and the cache writes eager: the fusions a compiled update gains from.

Each repeat runs every form once, interleaved; the table has the median ms/step, the speed-up
over the shipped step, the compile seconds and the largest logit difference from eager.
Prints the CPU flags that decide the kernels.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from rlscale.rlvr.model import build_tiny_model
from rlscale.rlvr.rollout import decoder
from rlscale.rlvr.rollout.kv_cache import KVCache
from rlscale.runtime.device import machine_summary


def fresh_cache(w: decoder.DecoderWeights, rows: int, window: int, steps: int) -> KVCache:
    gen = torch.Generator().manual_seed(0)
    cache = KVCache(layers=len(w.layers), rows=rows, kv_heads=w.kv_heads, head_dim=w.head_dim,
                    capacity=window + steps + 1, dtype=w.dtype, device=torch.device("cpu"))
    shape = (*cache.keys.shape[:3], window, w.head_dim)  # the same window at any capacity
    cache.keys[..., :window, :] = torch.randn(shape, generator=gen, dtype=w.dtype)
    cache.values[..., :window, :] = torch.randn(shape, generator=gen, dtype=w.dtype)
    cache.bias[..., :window] = 0
    cache.end = window
    return cache


def time_steps(step, w, rows: int, window: int, steps: int) -> tuple[float, torch.Tensor]:
    """Seconds per step over `steps` steps on a fresh cache, and the first step's logits."""
    cache = fresh_cache(w, rows, window, steps)
    tokens = torch.arange(rows) % w.embed.shape[0]
    first = None
    with torch.no_grad():
        t0 = time.perf_counter()
        for i in range(steps):
            logits = step(w, cache, tokens, torch.full((rows,), window + i))
            first = logits if first is None else first
        return (time.perf_counter() - t0) / steps, first


class ElementwiseCompiled:
    """decode_step with decoder.rms_norm, the rotary's half-rotation and SiLU compiled:
    swapped into the decoder module for the duration of a call."""

    def __init__(self) -> None:
        self.norm = torch.compile(decoder.rms_norm, dynamic=True)
        self.rotate = torch.compile(decoder._rotate_half, dynamic=True)
        self.silu = torch.compile(F.silu, dynamic=True)

    def __call__(self, w, cache, tokens, positions):
        saved = decoder.rms_norm, decoder._rotate_half, decoder.F
        decoder.rms_norm, decoder._rotate_half = self.norm, self.rotate
        decoder.F = _FWithSilu(self.silu)
        try:
            return decoder.decode_step(w, cache, tokens, positions)
        finally:
            decoder.rms_norm, decoder._rotate_half, decoder.F = saved


class _FWithSilu:
    def __init__(self, silu) -> None:
        self.silu = silu

    def __getattr__(self, name):
        return getattr(F, name)


def weights(model, packed: bool) -> decoder.DecoderWeights:
    saved = decoder.MKL_PACKED
    decoder.MKL_PACKED = packed
    try:
        return decoder.DecoderWeights.from_model(model, torch.float32)
    finally:
        decoder.MKL_PACKED = saved


def bench(preset: str, args) -> list[str]:
    torch.manual_seed(0)
    model = build_tiny_model(preset, max_positions=args.window + args.steps + 8)[0].eval()
    shipped, plain = weights(model, packed=True), weights(model, packed=False)
    forms = {"eager, as shipped": (decoder.decode_step, shipped),
             "eager, F.linear": (decoder.decode_step, plain),
             "compiled: whole step": (torch.compile(decoder.decode_step, dynamic=True), plain),
             "compiled: elementwise": (ElementwiseCompiled(), plain)}
    compile_s, first_logits = {}, {}
    for name, (step, w) in forms.items():  # warm-up; the shipped step's logits are the base
        t0 = time.perf_counter()
        first_logits[name] = time_steps(step, w, args.rows, args.window, args.steps)[1]
        compile_s[name] = time.perf_counter() - t0
    base = first_logits["eager, as shipped"]
    diff = {name: (logits - base).abs().max().item() for name, logits in first_logits.items()}
    times: dict[str, list[float]] = {name: [] for name in forms}
    for _ in range(args.repeats):
        for name, (step, w) in forms.items():
            times[name].append(time_steps(step, w, args.rows, args.window, args.steps)[0])
    shipped_ms = statistics.median(times["eager, as shipped"]) * 1e3
    rows = []
    for name in forms:
        ms = statistics.median(times[name]) * 1e3
        rows.append(f"| {preset} | {name} | {ms:.2f} | {shipped_ms / ms:.2f}x | "
                    f"{compile_s[name]:.1f} | {diff[name]:.1e} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", default="small,medium")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--window", type=int, default=150)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(machine_summary())
    print(f"{args.rows} rows, cache window {args.window} columns growing by one per step, "
          f"{args.steps} steps a timing, median of {args.repeats} interleaved repeats, fp32, "
          f"{args.threads} threads")
    print("| model | decode step | ms/step | vs shipped | first run s (compile) | max logit diff |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for preset in args.presets.split(","):
        for row in bench(preset, args):
            print(row, flush=True)


if __name__ == "__main__":
    main()
