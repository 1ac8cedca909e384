"""The optimiser both loops' learners build."""

from __future__ import annotations

from collections.abc import Iterable

import torch


def adamw(params: Iterable[torch.nn.Parameter], lr: float, weight_decay: float,
          betas: tuple[float, float] = (0.9, 0.999)) -> torch.optim.AdamW:
    """AdamW, fused into one kernel per tensor where torch has the kernel for every tensor
    (floating point, on a CPU or a CUDA GPU): on 2 CPU threads its step took 22 ms against 103
    ms for the default per-tensor loop on the 31.5 M model, and 1.0 against 3.0 ms on the
    0.8 M one (foreach=True: no gain on a CPU). Same update rule; last-bit rounding may differ."""
    params = list(params)
    fused = bool(params) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda")
                                 for p in params)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=betas,
                             fused=fused or None)
