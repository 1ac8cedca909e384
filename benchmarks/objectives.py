"""Every objective preset on the same task, seed and budget, from the quickstart's base model.

    .venv/bin/python benchmarks/objectives.py [--base runs/quickstart/base] [--out runs/objectives]

Writes `OUT/objectives.md` (the table), `OUT/pass1_vs_step.png`, `OUT/pass_at_k.png`, and
one run directory per preset. Two extra runs exercise the refinements: `dapo` reports the
share of groups dropped by dynamic sampling; `grpo+adaptive_len` reports completion length
per difficulty bucket under the difficulty-adaptive length penalty, next to plain `grpo`.
If the base model is missing it is built with the quickstart's SFT config.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

from rlscale.config import load_config
from rlscale.rlvr.config import RLVRConfig, SFTConfig
from rlscale.rlvr.distill import sft
from rlscale.rlvr.evaluate import evaluate
from rlscale.rlvr.loop import train
from rlscale.rlvr.model import load_model
from rlscale.rlvr.objectives import PRESETS
from rlscale.rlvr.plots import plot_pass_at_k, plot_training
from rlscale.rlvr.tasks import make_task
from rlscale.runtime.metrics import read_metrics

CONFIGS = Path(__file__).resolve().parents[1] / "src" / "rlscale" / "configs" / "rlvr"
KS = (1, 2, 4, 8)


def mean_of(rows: list[dict], key: str, last: int = 20) -> float | None:
    vals = [r[key] for r in rows[-last:] if isinstance(r.get(key), int | float)]
    return sum(vals) / len(vals) if vals else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, default=Path("runs/quickstart/base"))
    ap.add_argument("--out", type=Path, default=Path("runs/objectives"))
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--extras", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)

    if not (args.base / "config.json").exists():
        print(f"building the base model at {args.base}")
        sft(load_config(SFTConfig, CONFIGS / "quickstart_sft.yaml",
                        [f"out={args.base}", f"run_dir={args.base.parent / 'sft'}", "progress=false"]))

    runs: dict[str, list[str]] = {p: [f"objective={p}"] for p in args.presets.split(",")}
    if args.extras:
        runs["grpo+adaptive_len"] = ["objective=grpo", "loss.adaptive_length_penalty=0.5"]
        runs["grpo+top20_entropy"] = ["objective=grpo", "loss.entropy_top_rho=0.2"]
    common = [f"model.path={args.base}", f"train.steps={args.steps}", "train.minibatches=2",
              "eval.every=25", "eval.prompts=200", "checkpoint.every=0", "progress=false",
              "tensorboard=false"]
    task_cfg = load_config(RLVRConfig, CONFIGS / "quickstart.yaml", [f"model.path={args.base}"])
    task = make_task(task_cfg.task.name, **task_cfg.task.options)
    eval_kwargs = dict(split="test", seed=0, prompts=500, samples=8, ks=KS,
                       max_new_tokens=task_cfg.rollout.max_new_tokens)

    model, tokenizer = load_model(args.base)
    base = evaluate(model, tokenizer, task, **eval_kwargs)
    results = {"base (SFT)": {"pass_at": base.pass_at, "mean_length": base.mean_length}}
    curves = {"base (SFT)": base.pass_at}
    for name, overrides in runs.items():
        run_dir = args.out / name
        if (run_dir / "final" / "config.json").exists():
            print(f"{name}: reusing {run_dir}")
            seconds = json.loads((run_dir / "bench.json").read_text())["seconds"]
        else:
            cfg = load_config(RLVRConfig, CONFIGS / "quickstart.yaml",
                              [*common, *overrides, f"run_dir={run_dir}"])
            t0 = time.perf_counter()
            train(cfg)
            seconds = time.perf_counter() - t0
            (run_dir / "bench.json").write_text(json.dumps({"seconds": seconds}))
        model, tokenizer = load_model(run_dir / "final")
        result = evaluate(model, tokenizer, task, **eval_kwargs)
        rows = read_metrics(run_dir)
        results[name] = {
            "pass_at": result.pass_at, "mean_length": result.mean_length, "seconds": seconds,
            "entropy_end": mean_of(rows, "policy/entropy"),
            "dropped_group_share": mean_of(rows, "sampling/dropped_group_share", last=10 ** 6),
            "length_easy": mean_of(rows, "length/easy_mean"),
            "length_hard": mean_of(rows, "length/hard_mean"),
            "update_share_top20_entropy": mean_of(rows, "policy/update_share_top20_entropy", 10 ** 6),
        }
        curves[name] = result.pass_at
        print(name, json.dumps(results[name]))

    args.out.mkdir(parents=True, exist_ok=True)
    plot_training({n: args.out / n for n in runs}, ["eval/pass@1", "reward/mean"],
                  args.out / "pass1_vs_step.png")
    plot_pass_at_k(curves, args.out / "pass_at_k.png", title="held-out pass@k by objective")

    def fmt(v, spec=".3f"):
        return "-" if v is None else format(v, spec)

    lines = [
        f"Held-out `{task.name}` ({base.n} prompts x {base.samples} samples, temperature 1.0); "
        f"every run: {args.steps} steps x 32 prompts x 8 completions, 2 minibatches, seed 0, "
        f"from `{args.base}`.", "",
        "| objective | pass@1 | pass@8 | mean length | entropy (end) | dropped groups | "
        "length easy / hard | update share on top-20% entropy tokens | wall time |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['pass_at'][1]:.3f} | {r['pass_at'][8]:.3f} | {r['mean_length']:.2f} | "
            f"{fmt(r.get('entropy_end'))} | {fmt(r.get('dropped_group_share'))} | "
            f"{fmt(r.get('length_easy'), '.2f')} / {fmt(r.get('length_hard'), '.2f')} | "
            f"{fmt(r.get('update_share_top20_entropy'))} | "
            f"{fmt(r.get('seconds'), '.0f')}{'s' if r.get('seconds') else ''} |")
    table = "\n".join(lines)
    (args.out / "objectives.md").write_text(table + "\n")
    (args.out / "objectives.json").write_text(json.dumps(results, indent=1, default=str))
    print(table)


if __name__ == "__main__":
    main()
