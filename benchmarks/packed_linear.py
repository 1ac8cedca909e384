"""The decoder's fp32 projections: F.linear against MKL's packed GEMM (`decoder.Projection`),
on the projection shapes of the library's presets at decode's batch sizes.

    .venv/bin/python benchmarks/packed_linear.py [--threads 2] [--rows 1,8,32,64] [--calls 300]

For each preset (tiny 0.8 M, small 6.3 M, medium 31.5 M) and each of its projections (fused
q/k/v, attention output, fused gate/up, down, the output layer) at each batch size: the time
of one call of `F.linear(x, W)` and of the same map through `Projection` (its packed copy made
before timing), best of 3 rounds of `--calls` calls after a warm-up, and their ratio. Rows
above `decoder.PACKED_MAX_ROWS` go to F.linear inside Projection too (ratio ~1), so the table
shows why the threshold is where it is. Prints the CPU flags that decide the kernels.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from rlscale.rlvr.model import build_tiny_model
from rlscale.rlvr.rollout import decoder


def best_call_us(fn, calls: int) -> float:
    for _ in range(max(10, calls // 10)):
        fn()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


def projections(preset: str) -> dict[str, torch.Tensor]:
    model, _ = build_tiny_model(preset, seed=0)
    weights = decoder.DecoderWeights.from_model(model.eval(), torch.float32)
    layer = weights.layers[0]
    return {"qkv": layer.qkv.weight, "out": layer.out.weight, "gate_up": layer.gate_up.weight,
            "down": layer.down.weight, "lm_head": weights.lm_head.weight}


def cpu_flags() -> str:
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("flags")).split(":", 1)[1].split()
    except (OSError, StopIteration):
        return "unknown"
    return " ".join(f for f in flags if f.startswith(("avx2", "avx512", "amx")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", default="1,8,32,64")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--presets", default="tiny,small,medium")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"CPU flags: {cpu_flags()}; torch {torch.__version__}; {args.threads} thread(s); "
          f"MKL packed GEMM available: {decoder.MKL_PACKED}; packed up to "
          f"{decoder.PACKED_MAX_ROWS} rows")
    print("\n| preset | projection | W shape | rows | F.linear us | Projection us | speed-up |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    torch.manual_seed(0)
    for preset in args.presets.split(","):
        for name, weight in projections(preset).items():
            proj = decoder.Projection(weight, None)
            for rows in [int(r) for r in args.rows.split(",")]:
                x = torch.randn(rows, weight.shape[1])
                with torch.inference_mode():
                    plain = best_call_us(lambda x=x, w=weight: F.linear(x, w), args.calls)
                    packed = best_call_us(lambda x=x, p=proj: p(x), args.calls)
                print(f"| {preset} | {name} | {tuple(weight.shape)} | {rows} | {plain:,.1f} | "
                      f"{packed:,.1f} | {plain / packed:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
