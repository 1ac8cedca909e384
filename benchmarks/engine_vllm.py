"""vLLM behind rlscale's engine interface on the mixed-length workload of `engine.py`.

    ${VLLM_VENV:-.venv-vllm}/bin/python benchmarks/engine_vllm.py [--requests 256] [--slots 32]
        [--repeats 3] [--models tiny,30m] [--modes eager,compiled] [--dtype float32]
        [--engine-arg KEY=VALUE ...] [--json rows.json]

Needs the venv with vLLM that `make install-vllm` builds (`$VLLM_VENV`, default `.venv-vllm`). The workload is
`benchmarks/engine.py`'s `mixed_length_workload` (seed 0, log-normal median 24, sigma 1,
clipped to [4, 256], EOS ignored so every request generates exactly its length), so the
figures compare with that benchmark's engine / static sampler / HF generate rows. All
requests are queued at once; `--slots` is vLLM's max_num_seqs. tokens/s is generated tokens
over the wall time of `engine.run()`; start-up (model load, KV allocation, torch.compile
in `compiled` mode) is reported separately. Median of `--repeats` runs on one engine after
a short warm-up run. `0.5b` (Qwen2-0.5B's shape, random) is for GPUs
(benchmarks/gpu_check.sh), where the table also shows torch's peak GPU memory.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def load_workload_function():
    """`mixed_length_workload` from benchmarks/engine.py (not a package: load by path)."""
    spec = importlib.util.spec_from_file_location("rlscale_engine_benchmark", HERE / "engine.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.mixed_length_workload


def llama_30m(out: Path) -> Path:
    """A ~30 M-parameter Llama-shaped random model with the character tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlscale.rlvr.model import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=512, intermediate_size=1408,
                         num_hidden_layers=10, num_attention_heads=8, num_key_value_heads=4,
                         max_position_embeddings=512, tie_word_embeddings=True,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def qwen2_05b(out: Path) -> Path:
    """Random weights in Qwen2-0.5B's shape (494 M parameters, tied embeddings), built from
    a config: no hub download. The character tokenizer's ids are a subset of the vocab."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlscale.rlvr.model import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    config = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                         num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         max_position_embeddings=4096, tie_word_embeddings=True,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, dtype="bfloat16")
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).to(torch.bfloat16).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


MODELS = {"30m": llama_30m, "0.5b": qwen2_05b}


def build_model_dir(name: str, root: Path) -> Path:
    from rlscale.rlvr.model import init_model

    if name == "tiny":
        return init_model("tiny", root / "tiny", seed=0)
    if name not in MODELS:
        raise SystemExit(f"unknown model '{name}' (known: tiny, {', '.join(MODELS)})")
    return MODELS[name](root / name)


def engine_arg(text: str) -> tuple[str, object]:
    """KEY=VALUE for vllm.EngineArgs; VALUE parsed as JSON when it can be (numbers, bools)."""
    key, _, value = text.partition("=")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def count_parameters(path: Path) -> float:
    from safetensors.torch import load_file

    return sum(t.numel() for t in load_file(path / "model.safetensors").values()) / 1e6


def run_workload(engine, prompts: list[tuple[int, ...]], lengths: list[int], first_id: int
                 ) -> float:
    from rlscale.rlvr.rollout.types import GenerationRequest

    for i, (prompt, length) in enumerate(zip(prompts, lengths, strict=True)):
        engine.add_request(GenerationRequest(first_id + i, prompt, length))
    t0 = time.perf_counter()
    done = engine.run()
    seconds = time.perf_counter() - t0
    assert len(done) == len(prompts)
    assert sum(len(c) for c in done) == sum(lengths), "EOS was not ignored"
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--models", default="tiny,30m")
    parser.add_argument("--modes", default="eager,compiled")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--engine-arg", action="append", default=[], type=engine_arg,
                        help="KEY=VALUE passed to vllm.EngineArgs, e.g. gpu_memory_utilization=0.3")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--model-dir", type=Path, action="append", default=[],
                        help="time this saved model folder too (instead of --models when given)")
    parser.add_argument("--length", type=int, default=0,
                        help="every request generates exactly this many tokens (0: the mix)")
    args = parser.parse_args()
    # vLLM's CPU worker fixes its thread count at start-up from OMP_NUM_THREADS.
    os.environ["OMP_NUM_THREADS"] = str(args.threads)

    import torch

    from rlscale.rlvr.model import build_char_tokenizer
    from rlscale.rlvr.rollout.types import EngineSampling
    from rlscale.rlvr.rollout.vllm_engine import VLLMEngine

    tokenizer = build_char_tokenizer()
    work = load_workload_function()(args.requests)
    prompts = [tuple(tokenizer(p, add_special_tokens=False)["input_ids"]) for p, _ in work]
    lengths = [args.length or n for _, n in work]
    total = sum(lengths)
    print(f"workload (benchmarks/engine.py mixed_length_workload, "
          f"{f'every length {args.length}' if args.length else 'its lengths'}): {len(work)} requests, "
          f"{total} tokens, lengths median {statistics.median(lengths):.0f} mean "
          f"{statistics.mean(lengths):.1f} max {max(lengths)}; slots = {args.slots}; "
          f"{args.threads} thread(s); {args.dtype}; median of {args.repeats} runs")
    cuda = torch.cuda.is_available()
    rows = []
    with tempfile.TemporaryDirectory(prefix="rlscale-vllm-bench-") as tmp:
        named = [(d.name, d) for d in args.model_dir] or [
            (name, build_model_dir(name, Path(tmp))) for name in args.models.split(",")]
        for name, path in named:
            params = count_parameters(path)
            for mode in args.modes.split(","):
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                t0 = time.perf_counter()
                engine = VLLMEngine(path, EngineSampling(1.0, 1.0, ignore_eos=True),
                                    max_slots=args.slots, seed=0, dtype=args.dtype,
                                    engine_kwargs={"enforce_eager": mode == "eager",
                                                   **dict(args.engine_arg)})
                start = time.perf_counter() - t0
                try:
                    warm = prompts[:16]
                    run_workload(engine, warm, [8] * len(warm), first_id=10**6)  # warm-up
                    times = [run_workload(engine, prompts, lengths, first_id=r * len(prompts))
                             for r in range(args.repeats)]
                finally:
                    engine.close()
                wall = statistics.median(times)
                # In-process engine: torch's peak counts weights, activations and the KV
                # cache vLLM preallocates (gpu_memory_utilization), not what the run needed.
                peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
                rows.append(dict(model=f"{name} ({params:.1f} M)", runner=f"vLLM {mode}",
                                 tokens_per_s=total / wall, wall_s=wall, startup_s=start,
                                 runs_s=times, peak_gpu_gib=peak, tokens=total,
                                 dtype=args.dtype, slots=args.slots, length=args.length))
    print("\n| model | runner | tokens/s | wall s | start-up s | peak GPU GiB | runs (s) |")
    print("| --- | --- | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        runs = ", ".join(f"{t:.2f}" for t in r["runs_s"])
        peak = "-" if r["peak_gpu_gib"] is None else f"{r['peak_gpu_gib']:.1f}"
        print(f"| {r['model']} | {r['runner']} | {r['tokens_per_s']:,.0f} | {r['wall_s']:.2f} | "
              f"{r['startup_s']:.1f} | {peak} | {runs} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
