"""The decoder's fp32 projections: F.linear against MKL's packed GEMM (`decoder.Projection`),
on the projection shapes of the library's presets at decode's batch sizes.

    .venv/bin/python benchmarks/packed_linear.py [--threads 2] [--rows 1,8,32,64] [--calls 300]

For each preset (tiny 0.8 M, small 6.3 M, medium 31.5 M) and each of its projections (fused
q/k/v, attention output, fused gate/up, down, the output layer) at each batch size: the time
of one call of `F.linear(x, W)`, of MKL's packed GEMM at that batch size (the weight packed
before timing), and of the map through `Projection` as shipped (packed only at
`decoder.PACKED_MIN_ROWS`-`PACKED_MAX_ROWS` rows and `PACKED_MIN_OUTPUTS`+ outputs, else
F.linear), best of 3 rounds of `--calls` calls after a warm-up: the packed column shows where
packing pays, the Projection column what the decoder gets. Prints the CPU flags that decide the kernels.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from rlscale.rlvr.model import build_tiny_model
from rlscale.rlvr.rollout import decoder
from rlscale.runtime.device import machine_summary


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", default="1,8,32,64")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--presets", default="tiny,small,medium")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{machine_summary()}; {args.threads} thread(s); "
          f"MKL packed GEMM available: {decoder.MKL_PACKED}; packed at "
          f"{decoder.PACKED_MIN_ROWS}-{decoder.PACKED_MAX_ROWS} rows, >= "
          f"{decoder.PACKED_MIN_OUTPUTS} outputs")
    print("\n| preset | projection | W shape | rows | F.linear us | packed GEMM us | packed "
          "speed-up | Projection us | Projection speed-up |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    torch.manual_seed(0)
    for preset in args.presets.split(","):
        for name, weight in projections(preset).items():
            proj = decoder.Projection(weight, None)
            for rows in [int(r) for r in args.rows.split(",")]:
                x = torch.randn(rows, weight.shape[1])
                packed_w = torch.ops.mkl._mkl_reorder_linear_weight(weight, rows) \
                    if decoder.MKL_PACKED else None
                with torch.inference_mode():
                    plain = best_call_us(lambda x=x, w=weight: F.linear(x, w), args.calls)
                    packed = float("nan") if packed_w is None else best_call_us(
                        lambda x=x, w=weight, p=packed_w, n=rows:
                        torch.ops.mkl._mkl_linear(x, p, w, None, n), args.calls)
                    shipped = best_call_us(lambda x=x, p=proj: p(x), args.calls)
                print(f"| {preset} | {name} | {tuple(weight.shape)} | {rows} | {plain:,.1f} | "
                      f"{packed:,.1f} | {plain / packed:.2f}x | {shipped:,.1f} | "
                      f"{plain / shipped:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
