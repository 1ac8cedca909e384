"""Clipping makes batch reuse safe (PPO's trust region, kept by GRPO).

With one update per batch every ratio is exactly 1 and the clip never binds; here each
step's batch is reused for 4 epochs x 4 minibatches (16 optimiser updates), so the later
updates are off-policy. The clipped surrogate (clip 0.2 on both sides) against the same
objective with the clip opened so wide it never binds: the loop's own figures per step
(`clip/frac`, `ratio/max`, and `policy/kl_new_old`, the post-update KL between the policy
before and after the step on its own samples, measured every step here) and the final
held-out pass@1.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from .measure import held_out
from .plots import band, bars, plt, save_figure, tidy
from .record import Analysis, Table
from .setup import Arm, Context, TrainedArm, mean_of, series
from .spec import Experiment, HeldOutBudget, Numbers, grpo_arms
from .stats import cell, paired
from .verdict import Effect

NAME = "clipping"
CLAIM = ("Clipping makes batch reuse safe: with 4 epochs x 4 minibatches per batch, the clipped "
         "objective moves the policy less per step than the unclipped one and ends at equal or "
         "better pass@1.")
REUSE = ("train.epochs=4", "train.minibatches=4", "train.post_update_stats_every=1")
NO_CLIP = 1e6   # 1 - 1e6 < 0 < ratio < 1 + 1e6: the clip never binds
ARMS = {"clip": ("loss.clip_low=0.2", "loss.clip_high=0.2"),
        "no_clip": (f"loss.clip_low={NO_CLIP:g}", f"loss.clip_high={NO_CLIP:g}")}
CURVES = ("policy/kl_new_old", "clip/frac", "ratio/max", "policy/entropy")
SETUP = ("GRPO (configs/rlvr/reasoning.yaml, lr 1e-4) from the SFT base, each batch reused "
         "for train.epochs=4 x train.minibatches=4; loss.clip_low = loss.clip_high = 0.2 against "
         f"{NO_CLIP:g} (never binds), the same seeds.")
SETTINGS = {"quick": HeldOutBudget(steps=4, prompts=32, samples=4),
            "full": HeldOutBudget(steps=60, prompts=200, samples=4)}
# The reasoning config's learning rate at both budgets (the quick scale raises it to learn in
# a few steps; 16 updates per batch at that rate wreck the policy with or without a clip).
LR = "train.lr=1e-4"


def reuse_arms(scale: str, clips: dict[str, tuple[str, ...]]) -> list[Arm]:
    """One arm per entry of `clips` (its clip overrides), each reusing every batch 4 x 4."""
    return grpo_arms(SETTINGS[scale].steps, clips, LR, *REUSE)


def arms(scale: str) -> list[Arm]:
    return reuse_arms(scale, ARMS)


def measure_reuse_arms(ctx: Context, trained: dict[str, list[TrainedArm]], *,
                       curves: tuple[str, ...]) -> Numbers:
    """Each arm's held-out pass@1 per seed, and the loop's `curves` per step and their means."""
    s = SETTINGS[ctx.scale.name]
    out: dict[str, dict] = {}
    for name in trained:
        arm: dict = {"pass@1": [], "means": {k: [] for k in curves},
                     "curves": {k: [] for k in curves}, "steps": {}}
        for run in trained[name]:
            rows = run.metrics()
            result = held_out(run.final, run.config(), seed=run.seed, budget=s)
            arm["pass@1"].append(result.pass_at[1])
            for key in curves:
                steps, values = series(rows, key)
                arm["curves"][key].append(values)
                arm["steps"][key] = steps
                arm["means"][key].append(mean_of(rows, key))
        out[name] = arm
    return {"seeds": list(ctx.seeds), "prompts": s.prompts, "samples": s.samples, "arms": out}


measure = partial(measure_reuse_arms, curves=CURVES)


def step_mean_effect(name: str, key: str, a: dict, b: dict, expected_sign: int,
                     **judged) -> Effect:
    """Arm `b` - arm `a` in a per-step figure's mean over the run (paired by seed)."""
    return Effect(name, paired(a["means"][key], b["means"][key]), expected_sign, **judged)


def reuse_table(first: str, arms: list[tuple[str, dict]],
                columns: list[tuple[str, str, int]]) -> Table:
    """One row per (label, arm): the means over steps of `columns` (heading, metric, digits),
    then the held-out pass@1; `first` heads the labels."""
    rows = [[label, *(cell(arm["means"][key], digits) for _, key, digits in columns),
             cell(arm["pass@1"])] for label, arm in arms]
    return Table([first, *(heading for heading, _, _ in columns), "pass@1"], rows)


def analyse(numbers: Numbers) -> Analysis:
    clip, free = numbers["arms"]["clip"], numbers["arms"]["no_clip"]
    kl, ratio = "policy/kl_new_old", "ratio/max"
    effects = [
        step_mean_effect("KL(old, new) per step, mean over steps: clip - no clip", kl, free,
                         clip, -1, min_effect=0.01),
        Effect("pass@1: clip - no clip", paired(free["pass@1"], clip["pass@1"]),
               expected_sign=+1, min_effect=0.01),
        step_mean_effect("largest ratio pi/pi_old, mean over steps: clip - no clip", ratio,
                         free, clip, -1, primary=False),
    ]
    table = reuse_table("objective", [("clip 0.2", clip), ("no clip", free)],
                        [("KL(old, new) per step", kl, 4), ("clip fraction", "clip/frac", 4),
                         ("largest ratio", ratio, 2), ("entropy", "policy/entropy", 3)])
    notes = [f"held-out `test` pass@1: {numbers['prompts']} prompts x {numbers['samples']} "
             "samples per model and seed; the per-step figures are means over the run's "
             "steps. KL(old, new) is `policy/kl_new_old`: KL(pi_old || pi_new) per token "
             "between the policy before and after the step's 16 updates, on the step's own "
             "samples."]
    moved, accuracy = effects[0].verdict, effects[1].verdict
    if moved == "supports" and accuracy != "supports":
        notes.append("The clip held each step closer to the policy that sampled the batch, "
                     "but pass@1 did not separate the arms: at this learning rate and length "
                     "the unclipped reuse did not cost accuracy the seeds could see, so the "
                     "set-up could not show the clip preventing damage.")
    elif moved != "supports" and len(numbers["seeds"]) > 1:
        notes.append("The clip did not measurably reduce how far a step moved the policy. "
                     "One possible reason: Adam normalises each update, so the tokens the "
                     "clip leaves in still take full-size steps.")
    return Analysis(effects, table, notes)


def plot_reuse_arms(numbers: Numbers, out: Path, *, curves: tuple[str, ...],
                    log_first: bool = False) -> Path:
    """Three of the loop's curves per step (mean ± SE over seeds) and the final pass@1 bars."""
    arms_ = numbers["arms"]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7.5))
    for ax, key in zip((axes[0][0], axes[0][1], axes[1][0]), curves[:3], strict=True):
        for name, arm in arms_.items():
            band(ax, arm["steps"][key], arm["curves"][key], name.replace("_", " "))
        ax.set_xlabel("step")
        ax.set_title(f"{key} (mean ± SE over seeds)")
        tidy(ax)
    if log_first:
        axes[0][0].set_yscale("log")
    bars(axes[1][1], list(arms_), [arm["pass@1"] for arm in arms_.values()], "held-out pass@1")
    return save_figure(fig, out)


plot = partial(plot_reuse_arms, curves=CURVES, log_first=True)

# minutes: measured 26.9 (fp32, 2026-12-03): 4 x 60 steps of 16 updates, ~7 s each
EXPERIMENT = Experiment(name=NAME, claim=CLAIM, setup=SETUP, settings=SETTINGS, arms=arms,
                        measure=measure, analyse=analyse, plot=plot, minutes_per_seed=13.5)
