"""Bring-your-own-task demonstrations: SFT base -> GRPO -> held-out pass@1, per task source.

    python benchmarks/task_demos.py                       # both, into runs/task_demos/
    python benchmarks/task_demos.py --only math_jsonl     # one of them

Each demo is a pair of configs in configs/rlvr/ (`<name>_sft.yaml`, `<name>.yaml`): a tiny
model is fine-tuned on the task's own demonstrations (the JSONL demo starts from the
reasoning-gym demo's base, so `--only math_jsonl` needs that one run first), measured, trained with GRPO against
the task's verifier, and measured again on the same held-out prompts (500 at most, all of a
data file's test split when it has fewer; 4 samples each, temperature 1). Prints a table and
writes `<out>/results.json`; docs/tasks.md quotes it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rlscale.config import load_config
from rlscale.rlvr.config import RLVRConfig, SFTConfig
from rlscale.rlvr.distill import sft
from rlscale.rlvr.evaluate import evaluate
from rlscale.rlvr.loop import train
from rlscale.rlvr.model import load_model
from rlscale.rlvr.tasks import make_task

CONFIGS = Path("configs/rlvr")
DEMOS = {"reasoning_gym": "reasoning_gym_arithmetic", "math_jsonl": "math_jsonl"}


def held_out(path: Path, cfg: RLVRConfig, task) -> dict[str, float]:
    model, tokenizer = load_model(path)
    result = evaluate(model, tokenizer, task, split="test", seed=0, prompts=500, samples=4,
                      ks=(1, 4), max_new_tokens=cfg.rollout.max_new_tokens, temperature=1.0,
                      chat_template=cfg.model.chat_template, system_prompt=cfg.model.system_prompt)
    return result.as_dict()


def run_demo(name: str, out: Path) -> dict:
    stem = DEMOS[name]
    overrides = [f"out={out / name / 'base'}", f"run_dir={out / name / 'sft'}", "progress=false"]
    if name == "math_jsonl":  # starts from the reasoning-gym demo's base (see its config)
        overrides.append(f"model.path={out / 'reasoning_gym' / 'base'}")
    sft_cfg = load_config(SFTConfig, CONFIGS / f"{stem}_sft.yaml", overrides)
    t0 = time.perf_counter()
    base = sft(sft_cfg)
    sft_s = time.perf_counter() - t0
    cfg = load_config(RLVRConfig, CONFIGS / f"{stem}.yaml",
                      [f"model.path={base}", f"run_dir={out / name / 'grpo'}", "progress=false"])
    task = make_task(cfg.task.name, **cfg.task.options)
    before = held_out(base, cfg, task)
    t0 = time.perf_counter()
    final = train(cfg)
    grpo_s = time.perf_counter() - t0
    after = held_out(final, cfg, task)
    return {"task": cfg.task.name, "sft_steps": sft_cfg.steps, "sft_s": sft_s,
            "grpo_steps": cfg.train.steps, "grpo_s": grpo_s, "before": before, "after": after}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/task_demos"))
    parser.add_argument("--only", choices=sorted(DEMOS), action="append")
    args = parser.parse_args()
    results = {}
    results_path = args.out / "results.json"
    if results_path.exists():
        results = json.loads(results_path.read_text())
    for name in args.only or list(DEMOS):
        results[name] = run_demo(name, args.out)
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"\n| task | held-out prompts x samples | SFT base pass@1 | GRPO pass@1 | gain "
          f"(points) | pass@4 base -> GRPO | SFT wall | GRPO wall |\n|{' --- |' * 8}")
    for r in results.values():
        b, a = r["before"], r["after"]
        print(f"| `{r['task']}` | {b['n']:.0f} x {b['samples']:.0f} | {b['pass@1']:.3f} | "
              f"{a['pass@1']:.3f} | {100 * (a['pass@1'] - b['pass@1']):+.1f} | "
              f"{b['pass@4']:.3f} -> {a['pass@4']:.3f} | {r['sft_s']:.0f} s "
              f"({r['sft_steps']} steps) | {r['grpo_s']:.0f} s ({r['grpo_steps']} steps) |")
    print(f"results: {args.out / 'results.json'}")


if __name__ == "__main__":
    main()
