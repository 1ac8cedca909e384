"""Continuous batching vs static batching vs HF `generate` on a long-tailed length mix.

    .venv/bin/python benchmarks/engine.py [--requests 256] [--slots 32] [--repeats 3] [--clock cpu]

Same model, same prompts, same run; response lengths drawn log-normal (median 24, sigma 1)
clipped to [4, 256] with EOS ignored, so every request generates exactly its length and all
three produce the same number of useful tokens. Static batching (our KV-cached sampler and
HF `generate`) runs batches of `slots` requests until the longest finishes; the engine
refills a slot as soon as it frees. Prints tokens/s (useful tokens over wall time), slot
utilisation and the ratios, for each model size; interleaved repeats, median reported. The
static sampler runs twice: with its decode steps (`rollout/decoder.py`, the default) and on
the model's own forward (`fast_decode=False`), which shows what the decode steps buy.
`--clock cpu` times each runner by the process's CPU time instead of the wall clock: with one
thread, a fairer measure on a machine that other jobs share.

`--models` takes the presets `tiny`, `small` and `medium` (character vocabulary, freshly
initialised; `small` was a 4.4 M model of its own before 2026-12-05) and
NAME=PATH for a local Hugging Face folder with its own tokenizer, e.g. SmolLM2-135M-Instruct
with its 49,152-token BPE vocabulary (`make smollm` imports it to runs/smollm/base):

    .venv/bin/python benchmarks/engine.py --models smollm2=runs/smollm/base --requests 64 \
        --threads 2
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import numpy as np
import torch

from rlscale.rlvr.model import TINY_PRESETS, build_char_tokenizer, build_tiny_model
from rlscale.rlvr.rollout.engine import ContinuousBatchingEngine
from rlscale.rlvr.rollout.sampler import SamplingParams, generate
from rlscale.rlvr.rollout.types import EngineSampling, GenerationRequest


def mixed_length_workload(requests: int = 256, seed: int = 0, median: float = 24.0,
                          sigma: float = 1.0, low: int = 4, high: int = 256
                          ) -> list[tuple[str, int]]:
    """(prompt, exact response length) pairs: arithmetic prompts, log-normal lengths."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.round(rng.lognormal(np.log(median), sigma, requests)), low, high)
    prompt_rng = random.Random(seed)
    prompts = [f"{prompt_rng.randint(0, 999)}+{prompt_rng.randint(0, 999)}="
               for _ in range(requests)]
    return list(zip(prompts, lengths.astype(int).tolist(), strict=True))


def build_model(size: str):
    """(model, tokenizer): a preset of the library (`tiny` is the quickstart's 0.8 M model);
    NAME=PATH a local Hugging Face folder and its own tokenizer."""
    if "=" in size:
        from rlscale.rlvr.model import load_model

        model, tokenizer = load_model(size.split("=", 1)[1])
        return model.eval(), tokenizer
    return build_char_model(size), build_char_tokenizer()


def build_char_model(size: str):
    """A library preset (tiny 0.8 M, small 6.3 M, medium 31.5 M), freshly initialised."""
    if size not in TINY_PRESETS:
        raise SystemExit(f"error: unknown model {size!r}: a preset ({', '.join(TINY_PRESETS)}) "
                         "or NAME=PATH")
    model, _ = build_tiny_model(size, seed=0, max_positions=512)
    return model.eval()


CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}
now = time.perf_counter


def run_engine(model, tokenizer, work, slots: int) -> tuple[float, float]:
    engine = ContinuousBatchingEngine(model, EngineSampling(1.0, 1.0, ignore_eos=True),
                                      slots=slots, eos_token_id=tokenizer.eos_token_id,
                                      pad_token_id=tokenizer.pad_token_id, seed=0)
    for i, (prompt, length) in enumerate(work):
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        engine.add_request(GenerationRequest(i, tuple(ids), length))
    t0 = now()
    done = engine.run()
    seconds = now() - t0
    assert sum(len(c) for c in done) == sum(n for _, n in work)
    return seconds, engine.stats.slot_utilisation


def static_batches(work, slots: int):
    for start in range(0, len(work), slots):
        yield work[start:start + slots]


def run_static_sampler(model, tokenizer, work, slots: int,
                       fast_decode: bool = True) -> tuple[float, float]:
    generator = torch.Generator().manual_seed(0)
    busy = steps = 0
    t0 = now()
    for batch in static_batches(work, slots):
        ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p, _ in batch]
        longest = max(n for _, n in batch)
        generate(model, ids, SamplingParams(longest, 1.0, 1.0), eos_token_id=-1,
                 pad_token_id=tokenizer.pad_token_id, generator=generator,
                 fast_decode=fast_decode)
        busy += sum(n for _, n in batch)
        steps += longest * slots
    return now() - t0, busy / steps


def run_static_model_forward(model, tokenizer, work, slots: int) -> tuple[float, float]:
    return run_static_sampler(model, tokenizer, work, slots, fast_decode=False)


def run_hf_generate(model, tokenizer, work, slots: int) -> tuple[float, float]:
    torch.manual_seed(0)
    t0 = now()
    busy = steps = 0
    for batch in static_batches(work, slots):
        enc = [tokenizer(p, add_special_tokens=False)["input_ids"] for p, _ in batch]
        width = max(len(e) for e in enc)
        ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(e)) + e for e in enc])
        mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in enc])
        longest = max(n for _, n in batch)
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, do_sample=True,
                           max_new_tokens=longest, min_new_tokens=longest, top_k=0,
                           pad_token_id=tokenizer.pad_token_id)
        busy += sum(n for _, n in batch)
        steps += longest * slots
    return now() - t0, busy / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--models", default="tiny,small")
    parser.add_argument("--clock", choices=list(CLOCK), default="wall")
    args = parser.parse_args()
    global now
    now = CLOCK[args.clock]
    torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    work = mixed_length_workload(args.requests)
    total = sum(n for _, n in work)
    lengths = [n for _, n in work]
    print(f"workload: {len(work)} requests, {total} tokens, lengths median "
          f"{statistics.median(lengths):.0f} mean {statistics.mean(lengths):.1f} max "
          f"{max(lengths)}; slots = batch = {args.slots}; {args.threads} thread(s); "
          f"median of {args.repeats} interleaved repeats; {args.clock} clock")
    runners = {"engine (continuous)": run_engine, "static sampler": run_static_sampler,
               "static sampler, model forward": run_static_model_forward,
               "HF generate": run_hf_generate}
    print("\n| model | runner | tokens/s | slot utilisation | vs HF generate |")
    print("| --- | --- | ---: | ---: | ---: |")
    for size in args.models.split(","):
        model, tokenizer = build_model(size)
        params = sum(p.numel() for p in model.parameters()) / 1e6
        times: dict[str, list[float]] = {k: [] for k in runners}
        util: dict[str, float] = {}
        for _ in range(args.repeats):
            for name, fn in runners.items():
                seconds, util[name] = fn(model, tokenizer, work, args.slots)
                times[name].append(seconds)
        hf = statistics.median(times["HF generate"])
        for name in runners:
            t = statistics.median(times[name])
            print(f"| {size.split('=')[0]} ({params:.1f} M) | {name} | {total / t:,.0f} | "
                  f"{util[name]:.0%} | {hf / t:.2f}x |")


if __name__ == "__main__":
    main()
