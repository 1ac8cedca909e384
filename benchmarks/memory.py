"""A real-size model shape on this CPU: one GRPO step of a 0.5 B-parameter Qwen2-class model.

    python benchmarks/memory.py                          # full fine-tuning and LoRA, one step each
    python benchmarks/memory.py --variants lora --steps 2

The model is Qwen2-0.5B's configuration (24 layers, width 896, 14 heads / 2 KV heads, MLP
4864, vocabulary 151,936, tied embeddings: 494 M parameters), randomly initialised and saved
once as a local Hugging Face folder with rlscale's character tokenizer (its ids are the first
100 of the vocabulary; nothing is downloaded). Each variant runs the real loop
(`rlscale rlvr train` on configs/rlvr/quickstart.yaml) in its own process for `--steps`
steps of 8 prompts x 4 completions x 128 new tokens (a random model almost never samples
EOS among 151,936 tokens, so every completion is 128 tokens), no KL term (no reference
model), micro-batches of at most `--micro-batch-tokens` tokens, at the machine's default
compute dtype (train.compute_dtype auto). Reported from the run's metrics: peak resident
memory (`memory/peak_rss_gib`, the process's high-water mark), sampling and update time.
The rewards of a random model are all 0 (no gradient signal); the step still runs the whole
forward and backward, which is what is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "rlvr" / "quickstart.yaml"
QWEN2_0_5B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                  max_position_embeddings=32768, rope_theta=1_000_000.0,
                  tie_word_embeddings=True)
VARIANTS = {"full": [], "lora": ["model.lora.r=16", "model.lora.alpha=32"]}


def build_model(out: Path) -> Path:
    """The Qwen2-0.5B-shaped model, randomly initialised, saved once (reused if present)."""
    if (out / "config.json").is_file():
        return out
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlscale.rlvr.model import build_char_tokenizer, save_model

    torch.manual_seed(0)
    tokenizer = build_char_tokenizer()
    config = Qwen2Config(**QWEN2_0_5B, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    save_model(Qwen2ForCausalLM(config), tokenizer, out)
    return out


def run_variant(name: str, model: Path, out: Path, args: argparse.Namespace) -> dict:
    run_dir = out / name
    overrides = [f"model.path={model}", f"run_dir={run_dir}", f"train.steps={args.steps}",
                 "rollout.prompts_per_step=8", "rollout.group_size=4",
                 "rollout.max_new_tokens=128", "eval.every=0", "checkpoint.every=0",
                 f"train.micro_batch_tokens={args.micro_batch_tokens}",
                 f"train.threads={args.threads}", "progress=false", "tensorboard=false",
                 f"device={args.device}",
                 *VARIANTS[name]]
    cmd = [sys.executable, "-m", "rlscale.cli", "rlvr", "train", str(CONFIG), *overrides,
           "--overwrite"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
    wall = time.perf_counter() - t0
    if proc.returncode:
        sys.exit(f"error: variant {name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    config = (run_dir / "config.yaml").read_text()
    dtype = next((line.split(":")[1].strip() for line in config.splitlines()
                  if line.strip().startswith("compute_dtype:")), "?")
    cuda_peaks = [r["memory/cuda_peak_gib"] for r in rows if "memory/cuda_peak_gib" in r]
    return {"variant": name, "peak_rss_gib": max(r["memory/peak_rss_gib"] for r in rows),
            "cuda_peak_gib": max(cuda_peaks) if cuda_peaks else None,
            "collect_s": [r["time/collect_s"] for r in rows],
            "train_s": [r["time/train_s"] for r in rows],
            "tokens": [r["length/mean"] * 32 for r in rows], "compute_dtype": dtype,
            "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/memory"))
    parser.add_argument("--variants", default="full,lora")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--micro-batch-tokens", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda (the run's device)")
    args = parser.parse_args()
    out = args.out.resolve()
    t0 = time.perf_counter()
    model = build_model(out / "qwen2_0.5b_shape")
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model)
    print(f"model: {model.relative_to(REPO) if model.is_relative_to(REPO) else model} "
          f"({config.model_type}, built in {time.perf_counter() - t0:.0f} s or reused)")
    results = [run_variant(name, model, out, args) for name in args.variants.split(",")]
    print("\n| variant | compute | peak RSS (GiB) | peak GPU (GiB) | sampling s (128 tokens x 32) "
          "| update s | run wall s (load, step, save) |\n"
          "| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        gpu = f"{r['cuda_peak_gib']:.2f}" if r["cuda_peak_gib"] is not None else "-"
        print(f"| {r['variant']} | {r['compute_dtype']} | {r['peak_rss_gib']:.2f} | {gpu} | "
              f"{min(r['collect_s']):.1f} | {min(r['train_s']):.1f} | {r['wall_s']:.0f} |")
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"wrote {out / 'results.json'}")


if __name__ == "__main__":
    main()
