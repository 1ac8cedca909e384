"""The in-process sampler's token step, and its two parts, on a CPU or a GPU.

    .venv/bin/python benchmarks/sampler_step.py --model 0.5b --device cuda --rows 32 --tokens 128
    .venv/bin/python benchmarks/sampler_step.py --model small --device cpu

Times `sampler.generate` (bf16 autocast, temperature 1) for `--rows` prompts of 12-16 tokens
and `--tokens` new tokens, a warm-up call first, then the two parts of a token step apart,
each synchronised: one `decoder.decode_step` (against a 60-column cache) and one
`sampler.sample_next` on its logits. `--model` is a preset (tiny, small, medium), `0.5b` (the
Qwen2-0.5B shape of benchmarks/memory.py, built once under `--cache`) or a local model folder.
`--profile` adds a `torch.profiler` table of three token steps.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from rlscale.rlvr.model import build_tiny_model
from rlscale.rlvr.rollout.kv_cache import KVCache
from rlscale.rlvr.rollout.sampler import SamplingParams, generate, sample_next, step_function
from rlscale.runtime.device import machine_summary, resolve_device


def load(model: str, cache: Path, device: torch.device):
    if model in ("tiny", "small", "medium"):
        net, _ = build_tiny_model(model)
        return net.to(device)
    path = Path(model)
    if model == "0.5b":
        import memory  # benchmarks/memory.py, beside this file

        path = memory.build_model(cache / "qwen2_0.5b_shape")
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path).to(device)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed_ms(fn, device: torch.device, calls: int = 10) -> float:
    for _ in range(3):
        fn()
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    synchronize(device)
    return (time.perf_counter() - t0) / calls * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cache", type=Path, default=Path("runs/memory"))
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    model = load(args.model, args.cache, device)
    print(machine_summary() if device.type == "cpu" else torch.cuda.get_device_name(0))
    print(f"model {args.model}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M "
          f"parameters, vocabulary {model.config.vocab_size}; {args.rows} rows, "
          f"{args.threads} threads, bf16 autocast")

    prompts = [[5 + (i * 7 + j) % 60 for j in range(12 + i % 5)] for i in range(args.rows)]
    params = SamplingParams(max_new_tokens=args.tokens, temperature=1.0)
    generator = torch.Generator().manual_seed(0)
    pad, eos = 0, -1  # an EOS no token matches: every row runs the whole budget
    with torch.autocast(device.type, dtype=torch.bfloat16):
        generate(model, prompts, params, eos_token_id=eos, pad_token_id=pad, generator=generator)
        synchronize(device)
        t0 = time.perf_counter()
        rollout = generate(model, prompts, params, eos_token_id=eos, pad_token_id=pad,
                           generator=generator)
        synchronize(device)
        seconds = time.perf_counter() - t0
        cache_dtype, step = step_function(model)
    print(f"generate, {args.tokens} tokens: {seconds:.2f} s, "
          f"{seconds / args.tokens * 1e3:.1f} ms a token step "
          f"(mean length {rollout.lengths.float().mean():.1f})")

    cfg = model.config
    width = 60
    cache = KVCache(layers=cfg.num_hidden_layers, rows=args.rows,
                    kv_heads=cfg.num_key_value_heads,
                    head_dim=cfg.hidden_size // cfg.num_attention_heads,
                    capacity=width + 16, dtype=cache_dtype, device=device)
    cache.end = width
    cache.bias[..., :width] = 0
    tokens = torch.randint(0, 50, (args.rows,), device=device)
    positions = torch.full((args.rows,), width, device=device)

    def decode():
        logits = step(cache, tokens, positions)
        cache.end -= 1  # the same column again: a fixed window
        return logits

    logits = decode()
    print(f"decode_step: {timed_ms(decode, device):.1f} ms")
    print(f"sample_next: {timed_ms(lambda: sample_next(logits, 1.0, 1.0, generator), device):.1f} ms")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda"
                                               else [])
        with profile(activities=activities) as prof:
            for _ in range(3):
                sample_next(decode(), 1.0, 1.0, generator)
            synchronize(device)
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
