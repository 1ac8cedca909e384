"""The decode step's forms on this device, against its projections alone, and `generate`'s
decode tokens/s with each form.

    .venv/bin/python benchmarks/decode_step.py --models small,medium --rows 32,64,256
    python benchmarks/decode_step.py --models 0.5b --device cuda --dtype bfloat16 \\
        --rows 32,128,256 --tokens 128,512 --forms eager,static

Table 1, one decode step against a cache window of `--window` columns (median of
`--repeats` runs of `--steps` steps, the window growing by one column a step), forms:
- `projections`: the step's matmuls alone (every layer's qkv, out, gate-up and down, and the
  output layer, as the shipped step calls them): the floor the step is held to;
- `eager`: `decoder.decode_step` as `generate` runs it, attention over the live window;
- `static`: `decoder.static_decode_step` (attention over the whole cache, the column a
  tensor), eager on a CPU, replayed as a CUDA graph per bucket on a GPU
  (`graphs.BucketedDecodeStep`);
- `static compiled` (CPU only): the static step through `torch.compile(dynamic=False)` on
  `F.linear` weights (inductor has no lowering for the packed GEMM ops), compiled once per
  shape; its first call's seconds are shown.
Table 2 (`--tokens`): `generate` of `--rows` prompts of 16 tokens to exactly each budget (no
EOS), eager against the static step, at each `--eos-check-every`, decode tokens/s, and on
CUDA the host synchronisations per token step (`torch.cuda.set_sync_debug_mode`, counted).
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from pathlib import Path

import torch
from sampler_step import load, synchronize, timed_ms  # benchmarks/sampler_step.py, beside this file

from rlscale.rlvr.model import DTYPES
from rlscale.rlvr.rollout import decoder
from rlscale.rlvr.rollout.graphs import BucketedDecodeStep
from rlscale.rlvr.rollout.kv_cache import KVCache
from rlscale.rlvr.rollout.sampler import SamplingParams, generate
from rlscale.runtime.device import machine_summary, resolve_device


def fused_weights(model, dtype: torch.dtype, packed: bool) -> decoder.DecoderWeights:
    """The decode weights as shipped (`packed`), or with every projection a plain F.linear."""
    saved = decoder.MKL_PACKED, decoder.ONEDNN_PACKED
    if not packed:
        decoder.MKL_PACKED = decoder.ONEDNN_PACKED = False
    try:
        return decoder.DecoderWeights.from_model(model, dtype)
    finally:
        decoder.MKL_PACKED, decoder.ONEDNN_PACKED = saved


class Form:
    """One way to run decode steps, on its own cache of `rows` rows holding `window` columns
    of random keys and values, with room for `steps` more; `reset` empties those again."""

    def __init__(self, kind: str, w: decoder.DecoderWeights, rows: int, args,
                 device: torch.device) -> None:
        self.kind, self.w, self.window = kind, w, args.window
        self.cache = KVCache(layers=len(w.layers), rows=rows, kv_heads=w.kv_heads,
                             head_dim=w.head_dim, capacity=args.window + args.steps + 1,
                             dtype=w.dtype, device=device)
        gen = torch.Generator(device=device).manual_seed(0)
        shape = (*self.cache.keys.shape[:3], args.window, w.head_dim)
        for buffer in (self.cache.keys, self.cache.values):
            buffer[..., :args.window, :] = torch.randn(shape, generator=gen, dtype=w.dtype,
                                                       device=device)
        self.runner = BucketedDecodeStep(w, self.cache) if kind == "static" else None
        self.compiled = (torch.compile(decoder.static_decode_step, dynamic=False)
                         if kind == "static compiled" else None)
        self.column = torch.zeros(1, dtype=torch.long, device=device)
        self.reset()

    def reset(self) -> None:
        self.cache.bias.fill_(float("-inf"))
        self.cache.bias[..., :self.window] = 0
        self.cache.end = self.window
        self.column.fill_(self.window)
        if self.runner is not None:
            self.runner.column.fill_(self.window)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self.kind == "eager":
            return decoder.decode_step(self.w, self.cache, tokens, positions)
        if self.kind == "static":
            return self.runner(self.cache, tokens, positions)
        self.cache.end += 1
        return self.compiled(self.w, self.cache, tokens, positions, self.column)


def projections_ms(w: decoder.DecoderWeights, rows: int, steps: int,
                   device: torch.device) -> float:
    """ms of the step's matmuls alone, as the shipped step calls them."""
    x = torch.randn(rows, w.embed.shape[1], dtype=w.dtype, device=device)
    attn = torch.randn(rows, w.heads * w.head_dim, dtype=w.dtype, device=device)
    hidden = torch.randn(rows, w.intermediate, dtype=w.dtype, device=device)

    def run():
        for layer in w.layers:
            layer.qkv(x), layer.out(attn), layer.gate_up(x), layer.down(hidden)
        w.lm_head(x)
    return timed_ms(run, device, steps)


def time_form(form: Form, rows: int, steps: int, device: torch.device) -> float:
    """ms per step over `steps` steps from the form's initial window."""
    form.reset()
    tokens = torch.arange(rows, device=device) % form.w.embed.shape[0]
    synchronize(device)
    t0 = time.perf_counter()
    for i in range(steps):
        form.step(tokens, torch.full((rows,), form.window + i, device=device))
    synchronize(device)
    return (time.perf_counter() - t0) / steps * 1e3


def step_table(name: str, model, rows: int, args, device, dtype) -> list[str]:
    w = fused_weights(model, dtype, packed=True)
    kinds = ["eager"] + [k for k in ("static",) if k in args.forms.split(",")]
    if device.type == "cpu" and "compiled" in args.forms.split(","):
        kinds.append("static compiled")
    with torch.no_grad(), torch.autocast(device.type, enabled=False):
        forms = {kind: Form(kind, fused_weights(model, dtype, packed=False)
                            if kind == "static compiled" else w, rows, args, device)
                 for kind in kinds}
        first = {}
        for kind, form in forms.items():  # warm-up: compiles and captures
            t0 = time.perf_counter()
            time_form(form, rows, args.steps, device)
            first[kind] = time.perf_counter() - t0
        times: dict[str, list[float]] = {kind: [] for kind in forms}
        for _ in range(args.repeats):
            for kind, form in forms.items():
                times[kind].append(time_form(form, rows, args.steps, device))
        floor = projections_ms(w, rows, args.steps, device)
    ms = {kind: statistics.median(t) for kind, t in times.items()}
    lines = [f"| {name} | {str(dtype).removeprefix('torch.')} | {rows} | projections | "
             f"{floor:.2f} | | 1.00x | |"]
    return lines + [f"| {name} | {str(dtype).removeprefix('torch.')} | {rows} | {kind} | "
                    f"{ms[kind]:.2f} | {ms['eager'] / ms[kind]:.2f}x | {ms[kind] / floor:.2f}x "
                    f"| {first[kind]:.1f} |" for kind in forms]


def syncs_during(fn) -> int:
    """Host synchronisations CUDA reports while `fn` runs (0 off CUDA)."""
    if not torch.cuda.is_available():
        fn()
        return 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def generate_table(name: str, model, rows: int, tokens: int, args, device, dtype) -> list[str]:
    prompts = [[5 + (i * 7 + j) % 60 for j in range(16)] for i in range(rows)]
    params = SamplingParams(max_new_tokens=tokens, temperature=1.0)
    out = []
    for form in ("eager", "static"):
        if form not in args.forms.split(","):
            continue
        for every in map(int, args.eos_check_every.split(",")):
            def once(form=form, every=every):
                return generate(model, prompts, params, eos_token_id=-1, pad_token_id=0,
                                generator=torch.Generator().manual_seed(0),
                                static_step=form == "static", eos_check_every=every)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                once()  # warm-up (and the graphs' captures)
                synchronize(device)
                t0 = time.perf_counter()
                once()
                synchronize(device)
                seconds = time.perf_counter() - t0
                syncs = syncs_during(once) if device.type == "cuda" else 0
            per_step = f"{syncs / tokens:.2f}" if device.type == "cuda" else "-"
            out.append(f"| {name} | {rows} | {tokens} | {form} | {every} | {seconds:.2f} | "
                       f"{rows * tokens / seconds:,.0f} | {per_step} |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="small,medium")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--rows", default="32,64,256")
    parser.add_argument("--tokens", default="", help="generate budgets for table 2 (none: skip)")
    parser.add_argument("--forms", default="eager,static,compiled")
    parser.add_argument("--eos-check-every", default="1",
                        help="table 2: token steps between checks for finished rows (a list)")
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cache", default="runs/memory")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device, dtype = resolve_device(args.device), DTYPES[args.dtype]
    print(machine_summary() if device.type == "cpu" else torch.cuda.get_device_name(0))
    print(f"{args.threads} threads; window {args.window} columns, {args.steps} steps a timing, "
          f"median of {args.repeats}")
    models = {name: load(name, Path(args.cache), device).eval()
              for name in args.models.split(",")}
    print("| model | dtype | rows | form | ms/step | vs eager | x projections | first run s |")
    print("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for name, model in models.items():
        for rows in map(int, args.rows.split(",")):
            for line in step_table(name, model, rows, args, device, dtype):
                print(line, flush=True)
    if not args.tokens:
        return
    print("\n| model | rows | tokens | form | EOS check every | generate s | decode tok/s | "
          "syncs per token step |")
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |")
    for name, model in models.items():
        for rows in map(int, args.rows.split(",")):
            for tokens in map(int, args.tokens.split(",")):
                for line in generate_table(name, model, rows, tokens, args, device, dtype):
                    print(line, flush=True)


if __name__ == "__main__":
    main()
