"""`torch.compile` of the update's forward and backward against eager, on this CPU.

    python benchmarks/compile_update.py                        # tiny (0.8 M) and small (6.3 M)
    python benchmarks/compile_update.py --models small --tokens 128 --updates 8

What the GRPO update runs: the trainer's packed forward (`rlvr.logprobs.completion_logprobs`,
the decoder on the packed layout, the vocabulary projection on completion positions) and the
backward of a token-mean loss, on batches of 64 sequences (16-token prompts, completions of
`--tokens / 4` to `--tokens` tokens, a new draw of lengths every update, so the packed shape
changes as in training). Compiled: the decoder wrapped in `torch.compile(dynamic=True)`
(inductor), one graph for every shape. Each model runs in its own process with an empty
inductor cache (what a run pays the first time), fp32, `--threads` threads.

Printed per model: eager and compiled seconds per update (the median after 2 warm-up
updates), the compiled first update (compilation included), the speed-up, the updates it
takes to earn the compilation back, and the largest difference of the loss and of any
gradient entry between the two on the same batch.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parent.parent
PROMPTS, PROMPT_TOKENS = 64, 16


def batch(seed: int, tokens: int):
    """A PolicyBatch-shaped record: random ids, completion lengths in [tokens / 4, tokens]."""
    import torch

    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(5, 100, (PROMPTS, PROMPT_TOKENS), generator=g)
    completion = torch.randint(5, 100, (PROMPTS, tokens), generator=g)
    lengths = torch.randint(tokens // 4, tokens + 1, (PROMPTS,), generator=g)
    mask = (torch.arange(tokens)[None] < lengths[:, None]).long()
    return SimpleNamespace(
        input_ids=torch.cat([prompt, completion * mask], 1),
        attention_mask=torch.cat([torch.ones(PROMPTS, PROMPT_TOKENS, dtype=torch.long), mask], 1),
        prompt_width=PROMPT_TOKENS, completion_ids=completion * mask, mask=mask.bool())


def update(model, b) -> float:
    """One forward and backward of a token-mean loss; the loss."""
    from rlscale.rlvr.logprobs import completion_logprobs

    model.zero_grad(set_to_none=True)
    logp, _ = completion_logprobs(model, b, pack=True)
    loss = -(logp * b.mask).sum() / b.mask.sum()
    loss.backward()
    return float(loss)


def timed(model, tokens: int, updates: int, first_seed: int) -> list[float]:
    times = []
    for i in range(updates):
        b = batch(first_seed + i, tokens)
        t = time.perf_counter()
        update(model, b)
        times.append(time.perf_counter() - t)
    return times


def measure(preset: str, tokens: int, updates: int) -> dict:
    """Run in a child process: eager, then the same model compiled."""
    import torch

    from rlscale.rlvr.model import build_tiny_model, count_parameters

    torch.manual_seed(0)
    model, _ = build_tiny_model(preset, seed=0)
    model.train()
    eager = timed(model, tokens, updates, first_seed=0)
    # the same batch both ways: the loss and every gradient entry
    check = batch(10_000, tokens)
    eager_loss = update(model, check)
    eager_grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    decoder = model.get_decoder()
    compiled_decoder = torch.compile(decoder, dynamic=True)
    model.get_decoder = lambda: compiled_decoder  # what completion_logprobs calls
    compiled = timed(model, tokens, updates, first_seed=0)
    compiled_loss = update(model, check)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    grad_diff = max(float((a - b).abs().max()) for a, b in zip(eager_grads, grads, strict=True))
    grad_scale = max(float(a.abs().max()) for a in eager_grads)
    return {"model": preset, "parameters": count_parameters(model), "tokens": tokens,
            "eager_s": statistics.median(eager[2:]), "compiled_first_s": compiled[0],
            "compiled_s": statistics.median(compiled[2:]),
            "loss_diff": abs(eager_loss - compiled_loss), "grad_diff": grad_diff,
            "grad_scale": grad_scale}


def cpu_flags() -> str:
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return platform.processor() or "unknown"
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
    return " ".join(f for f in wanted if f in flags) or "no avx2"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,small")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--updates", type=int, default=6, help="per side, 2 of them warm-up")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.updates < 3:
        parser.error("--updates must be at least 3 (2 warm-up updates, then the timed ones)")
    if args.child:
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps(measure(args.child, args.tokens, args.updates)))
        return
    rows = []
    for preset in args.models.split(","):
        with tempfile.TemporaryDirectory(prefix="inductor-") as cache:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache,
                   "OMP_NUM_THREADS": str(args.threads)}
            out = subprocess.run(
                [sys.executable, __file__, "--child", preset, "--tokens", str(args.tokens),
                 "--updates", str(args.updates), "--threads", str(args.threads)],
                env=env, capture_output=True, text=True)
        if out.returncode != 0:
            tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
            sys.exit(f"error: the {preset} model's run failed: {tail}")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"# torch.compile of the update, fp32, {args.threads} threads, {PROMPTS} sequences, "
          f"completions {args.tokens // 4}-{args.tokens} tokens; CPU flags: {cpu_flags()}")
    print("| model | eager s/update | compiled s/update | speed-up | first compiled update s "
          "| updates to earn it back | loss diff | max grad diff (of max grad) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        saved = r["eager_s"] - r["compiled_s"]
        extra = r["compiled_first_s"] - r["eager_s"]
        back = f"{extra / saved:,.0f}" if saved > 0 else "never"
        print(f"| {r['model']} ({r['parameters'] / 1e6:.1f} M) | {r['eager_s']:.3f} | "
              f"{r['compiled_s']:.3f} | {r['eager_s'] / r['compiled_s']:.2f}x | "
              f"{r['compiled_first_s']:.1f} | {back} | {r['loss_diff']:.1e} | "
              f"{r['grad_diff']:.1e} ({r['grad_scale']:.1e}) |")


if __name__ == "__main__":
    main()
