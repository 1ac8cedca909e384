"""`rlscale quickstart`: tiny model -> SFT base -> measure -> GRPO -> measure -> table."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..config import load_config
from .config import RLVRConfig, SFTConfig
from .distill import sft
from .evaluate import evaluate
from .loop import train
from .model import load_model
from .plots import plot_pass_at_k, plot_training
from .tasks import make_task

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "rlvr"


def run_quickstart(out: str | Path = "runs/quickstart") -> dict[str, dict[str, float]]:
    out = Path(out)
    console = Console()
    if (out / "grpo" / "checkpoints").exists():
        raise FileExistsError(f"{out} already holds a quickstart run; pass another --out or delete it")
    t_start = time.perf_counter()

    sft_cfg = load_config(SFTConfig, CONFIGS / "quickstart_sft.yaml",
                          [f"out={out / 'base'}", f"run_dir={out / 'sft'}"])
    console.rule("[bold]1/4  base model: tiny Llama, supervised fine-tuning on demonstrations")
    t0 = time.perf_counter()
    base_path = sft(sft_cfg)
    sft_seconds = time.perf_counter() - t0

    rl_cfg = load_config(RLVRConfig, CONFIGS / "quickstart.yaml",
                         [f"model.path={base_path}", f"run_dir={out / 'grpo'}"])
    task = make_task(rl_cfg.task.name, **rl_cfg.task.options)
    eval_kwargs = dict(split="test", seed=rl_cfg.eval.seed, prompts=500, samples=4, ks=(1, 4),
                       max_new_tokens=rl_cfg.rollout.max_new_tokens,
                       temperature=rl_cfg.eval.temperature)

    console.rule("[bold]2/4  measure the base model on held-out prompts")
    model, tokenizer = load_model(base_path)
    before = evaluate(model, tokenizer, task, **eval_kwargs)
    console.print(f"base pass@1 {before.pass_at[1]:.3f}")

    console.rule(f"[bold]3/4  GRPO ({rl_cfg.objective}) against the {task.name} verifier")
    t0 = time.perf_counter()
    final_path = train(rl_cfg)
    grpo_seconds = time.perf_counter() - t0

    console.rule("[bold]4/4  measure the trained model")
    model, tokenizer = load_model(final_path)
    after = evaluate(model, tokenizer, task, **eval_kwargs)

    plots = out / "plots"
    plot_pass_at_k({"base (SFT)": before.pass_at, "GRPO": after.pass_at}, plots / "pass_at_k.png",
                   title=f"{task.name}: held-out pass@k")
    plot_training({"grpo": out / "grpo"}, ["reward/mean", "policy/entropy", "length/mean"],
                  plots / "training.png")

    table = Table(title=f"rlscale quickstart: {task.name}, {before.n} held-out prompts x "
                        f"{before.samples} samples (temperature {rl_cfg.eval.temperature})")
    for col in ("model", "pass@1", "pass@4", "mean length", "train wall time"):
        table.add_column(col, justify="right" if col != "model" else "left")
    table.add_row("base (SFT)", f"{before.pass_at[1]:.3f}", f"{before.pass_at[4]:.3f}",
                  f"{before.mean_length:.2f}", f"{sft_seconds:.0f}s")
    table.add_row(f"GRPO ({rl_cfg.train.steps} steps)", f"{after.pass_at[1]:.3f}",
                  f"{after.pass_at[4]:.3f}", f"{after.mean_length:.2f}", f"{grpo_seconds:.0f}s")
    console.print(table)
    console.print(f"pass@1 change: {100 * (after.pass_at[1] - before.pass_at[1]):+.1f} points; "
                  f"total {time.perf_counter() - t_start:.0f}s")
    console.print(f"base model:     {base_path}\nGRPO run:       {out / 'grpo'} "
                  f"(metrics.jsonl, tb/, checkpoints/)\nfinal model:    {final_path}\n"
                  f"plots:          {plots}\n"
                  f"re-measure:     rlscale rlvr eval --model {final_path} --task {task.name} "
                  f"--samples 4 --k 1,4")
    return {"before": before.as_dict(), "after": after.as_dict()}
