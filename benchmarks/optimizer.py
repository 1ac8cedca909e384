"""One AdamW step over a model's parameters: PyTorch's per-tensor loop, its foreach form and
its fused kernel (what `runtime.optim.adamw` builds where it can).

    .venv/bin/python benchmarks/optimizer.py [--models tiny,small,medium,0.5b] [--threads 2]

For each model (the presets, and the parameter shapes of Qwen2-0.5B with its 151,936-token
embedding, as in benchmarks/memory.py: 494 M parameters, ~8 GiB with gradients and both
moments) the same random gradients are stepped by each form: the median of `--steps` steps
after 2 warm-up steps (the first allocates the moments), and the largest difference of the
weights from the loop's after all of them. Prints the CPU flags that decide the kernels.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from rlscale.rlvr.model import build_tiny_model
from rlscale.runtime.device import machine_summary

FORMS = {"loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def parameter_shapes(model: str) -> list[tuple[int, ...]]:
    """The parameter shapes of a preset, or of benchmarks/memory.py's Qwen2-0.5B shape
    (built on the meta device: shapes, no memory)."""
    if model != "0.5b":
        net, _ = build_tiny_model(model)
        return [tuple(p.shape) for p in net.parameters()]
    from memory import QWEN2_0_5B  # benchmarks/memory.py, beside this file
    from transformers import Qwen2Config, Qwen2ForCausalLM

    with torch.device("meta"):
        net = Qwen2ForCausalLM(Qwen2Config(**QWEN2_0_5B))
    return [tuple(p.shape) for p in net.parameters()]


def time_form(shapes, form: str, steps: int) -> tuple[float, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, generator=g) * 0.02) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * 1e-3
    optimizer = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, betas=(0.9, 0.99),
                                  **FORMS[form])
    times = []
    for i in range(2 + steps):
        t0 = time.perf_counter()
        optimizer.step()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return statistics.median(times), [p.detach() for p in params]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,small,medium,0.5b")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(machine_summary())
    print(f"threads: {args.threads}; median of {args.steps} steps after 2 warm-up steps\n")
    print("| model | parameters | loop ms | foreach ms | fused ms | loop / fused | "
          "max weight diff fused vs loop |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for model in args.models.split(","):
        shapes = parameter_shapes(model)
        count = sum(torch.Size(s).numel() for s in shapes)
        ms, kept = {}, {}
        for form in FORMS:
            seconds, weights = time_form(shapes, form, args.steps)
            ms[form] = seconds * 1e3
            if form in ("loop", "fused"):  # the foreach form's weights are dropped at once
                kept[form] = weights
            del weights
        diff = max((a - b).abs().max().item()
                   for a, b in zip(kept["loop"], kept["fused"], strict=True))
        del kept
        print(f"| {model} | {count / 1e6:.1f} M | {ms['loop']:.1f} | {ms['foreach']:.1f} | "
              f"{ms['fused']:.1f} | {ms['loop'] / ms['fused']:.1f}x | {diff:.1e} |", flush=True)


if __name__ == "__main__":
    main()
