"""The report of `rlscale quickstart emergence` (docs/emergence.md): what RL from outcome
reward changed in how a base that never saw a multi-step solution works chains, by chain
length; the behaviour counters before and after; the R1-Zero figures over the RL steps
(completion length, the share of completions with intermediate results, the counters); and
completions of the same prompts at the start, the middle and the end of RL.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from ..config import load_config
from ..runtime import checkpoint as ckpt
from ..runtime.figures import save_figure
from .config import RLVRConfig
from .emergence import FIGURES, by_terms, line_use
from .model import load_model
from .plots import plot_training, plt
from .quickstart_run import QuickstartRun
from .rollout.sampler import SamplingParams, generate

# The counters the report shows before and after (behaviour/<name>, means per completion).
COUNTERS = ("intermediate_lines", "chained_lines", "steps", "combined_steps", "checks",
            "true_alarms", "false_alarms", "redos", "guess", "wrong_steps")
# The figures over RL steps: one panel each (a tuple shares a panel).
CURVES = ["length/mean", "behaviour/intermediate", ("behaviour/chained_lines",
          "behaviour/intermediate_lines", "behaviour/checks", "behaviour/true_alarms",
          "behaviour/redos"), "reward/mean"]
SHOWN_TERMS = (4, 5, 6)      # completions.md: one prompt of each length
LINE_USE_PROMPTS = 100


def emergence_report(run: QuickstartRun, console: Console) -> dict:
    """Print the tables, write the plots, summary.json and completions.md; the summary."""
    out, task = run.out, run.task
    before, after = (by_terms(task, r["test"]) for r in (run.before, run.after))
    console.print(_by_terms_table(run, before, after))
    console.print(_counters_table(run))
    plots = out / "plots"
    plot_training({"grpo": out / "grpo"}, CURVES, plots / "training.png")
    _plot_by_terms(before, after, plots / "pass_by_terms.png")
    probe = [ex for ex in run.before["test"].examples if ex.meta["terms"] >= 3]
    use = {label: line_use(*load_model(path), task, probe[:LINE_USE_PROMPTS]).as_dict()
           for label, path in (("base", run.base_path), ("grpo", run.final_path))}
    summary = {"total_seconds": run.total_seconds, "base_seconds": run.sft_seconds,
               "grpo_seconds": run.grpo_seconds, "rl_steps": run.rl_steps,
               "by_terms": {"base": before, "grpo": after}, "line_use": use,
               **{f"{label}/test": results["test"].as_dict()
                  for label, results in (("base", run.before), ("grpo", run.after))}}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    write_completions(run, out / "completions.md")
    console.print(f"base model:     {run.base_path}\nGRPO run:       {out / 'grpo'} "
                  f"(metrics.jsonl, tb/, checkpoints/)\nfinal model:    {run.final_path}\n"
                  f"plots:          {plots}\nfigures:        {out / 'summary.json'}; "
                  f"completions at the start, middle and end: {out / 'completions.md'}")
    return summary


def _by_terms_table(run: QuickstartRun, before: dict, after: dict) -> Table:
    table = Table(title=f"rlscale quickstart emergence: {run.recipe.prompts} held-out prompts x "
                        f"{run.recipe.samples} samples (temperature {run.temperature}), by "
                        "chain length, base -> GRPO")
    for col in ("terms", *FIGURES):
        table.add_column(col.replace("_", " "), justify="right")
    for terms in sorted(before):
        table.add_row(str(terms), *(f"{before[terms][name]:.2f} -> {after[terms][name]:.2f}"
                                    for name in FIGURES))
    return table


def _counters_table(run: QuickstartRun) -> Table:
    table = Table(title="behaviour counters, means per completion (test split)")
    for col in ("model", *COUNTERS):
        table.add_column(col.replace("_", " "), justify="left" if col == "model" else "right")
    for label, results in (("base", run.before), ("GRPO", run.after)):
        details = results["test"].details
        table.add_row(label, *(f"{details.get(f'behaviour/{name}', 0.0):.2f}"
                               for name in COUNTERS))
    return table


def _plot_by_terms(before: dict, after: dict, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    terms = sorted(before)
    width = 0.4
    for offset, (label, table) in enumerate((("base", before), ("GRPO", after))):
        ax.bar([t + (offset - 0.5) * width for t in terms], [table[t]["pass@1"] for t in terms],
               width, label=label)
    ax.set_xlabel("terms in the chain")
    ax.set_ylabel("held-out pass@1")
    ax.set_title("pass@1 by chain length")
    ax.legend()
    ax.grid(alpha=0.3)
    return save_figure(fig, out, dpi=110)


def stage_models(run: QuickstartRun) -> list[tuple[str, Path]]:
    """The models at the start, the middle and the end of RL: the base, the checkpoint
    nearest the middle step (when one was kept), and the final model."""
    stages = [("step 0 (base)", run.base_path)]
    kept = ckpt.list_checkpoints(run.out / "grpo")
    if kept:
        middle = min(kept, key=lambda p: abs(ckpt.checkpoint_step(p) - run.rl_steps / 2))
        stages.append((f"step {ckpt.checkpoint_step(middle)}", middle))
    stages.append((f"step {run.rl_steps} (final)", run.final_path))
    return stages


@torch.no_grad()
def write_completions(run: QuickstartRun, path: Path) -> None:
    """One completion (the run's token budget, temperature as measured, a fixed seed) of the
    same held-out prompts of 4, 5 and 6 terms by the model at each stage of RL."""
    items = run.before["test"].examples
    chosen = [next(ex for ex in items if ex.meta["terms"] == terms)
              for terms in SHOWN_TERMS if any(ex.meta["terms"] == terms for ex in items)]
    lines = ["# emergence: completions of the same held-out prompts during RL\n",
             f"One sample per model (temperature {run.temperature}, seed 0); `reward` is the "
             "verifier's.\n"]
    budget = load_config(RLVRConfig, run.out / "grpo" / "config.yaml", []).rollout
    texts: dict[str, list[str]] = {}
    for label, folder in stage_models(run):
        model, tokenizer = load_model(folder)
        prompts = [tokenizer(ex.prompt, add_special_tokens=False)["input_ids"] for ex in chosen]
        rollout = generate(model, prompts, SamplingParams(budget.max_new_tokens,
                                                          run.temperature, budget.top_p),
                           eos_token_id=tokenizer.eos_token_id,
                           pad_token_id=tokenizer.pad_token_id,
                           generator=torch.Generator().manual_seed(0))
        texts[label] = [tokenizer.decode(row[:n], skip_special_tokens=True)
                        for row, n in zip(rollout.completion_ids.tolist(),
                                          rollout.lengths.tolist(), strict=True)]
    for index, ex in enumerate(chosen):
        lines.append(f"## `{ex.prompt}` (answer {ex.answer})\n")
        for label, written in texts.items():
            text = written[index]
            lines.append(f"{label}, reward {run.task.verify(text, ex):.0f}:\n\n```\n{text}\n```\n")
    path.write_text("\n".join(lines))
