"""A curriculum by learnability (rollout.curriculum, rlvr/curriculum.py): prompts drawn by
difficulty level, each level weighted by p(1-p) of its running group success rate, against
the task's uniform draw, at an equal number of steps.

GRPO from the same base and seeds on the reasoning task (chains of 2-6 terms); the final
models' held-out pass@1 overall and per chain length; the share of groups whose rewards were
all equal (zero advantage: the batch's wasted completions) over the run; the curriculum's
level weights over steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .measure import by_level, held_out
from .plots import band, plt, save_figure, tidy
from .record import Analysis, Table
from .setup import Arm, Context, TrainedArm, mean_of, series
from .spec import Experiment, Numbers, grpo_arms
from .stats import cell, paired
from .verdict import Effect

NAME = "curriculum"
CLAIM = ("A curriculum that draws prompts by learnability (difficulty levels weighted by "
         "p(1-p) of their running group success rate) raises held-out pass@1 over uniform "
         "sampling at an equal number of GRPO steps, by wasting fewer groups on prompts the "
         "policy always or never solves.")
ARMS = {"uniform": (), "learnability": ("rollout.curriculum=learnability",)}
ZERO = "reward/zero_advantage_group_share"


@dataclass(frozen=True)
class Settings:
    steps: int
    prompts: int     # the final models' held-out pass@1
    samples: int


SETUP = ("GRPO (configs/rlvr/reasoning.yaml, chains of 2-6 terms) from the SFT base with "
         "rollout.curriculum uniform and learnability (curriculum_ema 0.3), the same seeds "
         "and steps; the final models' held-out pass@1 overall and per chain length, and "
         "the share of zero-advantage groups trained on.")
SETTINGS = {"quick": Settings(steps=4, prompts=32, samples=4),
            "full": Settings(steps=80, prompts=400, samples=4)}


def arms(scale: str) -> list[Arm]:
    return grpo_arms(SETTINGS[scale].steps, ARMS, "eval.every=0")


def level_weights(rows: list[dict]) -> dict[str, list[float]]:
    """The curriculum's weight of each level at every step (empty for the uniform arm)."""
    keys = sorted({k for row in rows for k in row if k.startswith("curriculum/weight_")})
    return {key.rsplit("_", 1)[1]: series(rows, key)[1] for key in keys}


def measure(ctx: Context, trained: dict[str, list[TrainedArm]]) -> Numbers:
    s = SETTINGS[ctx.scale.name]
    out: dict[str, dict] = {}
    for name in ARMS:
        arm: dict = {"pass@1": [], "by_level": [], "zero_advantage_share": [],
                     "zero_curve": [], "weights": [], "seconds_per_step": []}
        for run in trained[name]:
            rows = run.metrics()
            result = held_out(run.final, run.config(), seed=run.seed, budget=s)
            arm["pass@1"].append(result.pass_at[1])
            arm["by_level"].append(by_level(result.details, "accuracy"))
            arm["zero_advantage_share"].append(mean_of(rows, ZERO))
            arm["zero_curve"].append(series(rows, ZERO)[1])
            arm["weights"].append(level_weights(rows))
            arm["seconds_per_step"].append(mean_of(rows, "time/step_s"))
        out[name] = arm
    return {"seeds": list(ctx.seeds), "steps": s.steps, "prompts": s.prompts,
            "samples": s.samples, "arms": out}


def hardest(arm: dict) -> tuple[str, list[float]]:
    """The longest chain level every seed measured, and its accuracy per seed."""
    levels = set.intersection(*(set(levels) for levels in arm["by_level"]))
    top = max(levels, key=float)
    return top, [levels_[top] for levels_ in arm["by_level"]]


def analyse(numbers: Numbers) -> Analysis:
    uniform, learn = numbers["arms"]["uniform"], numbers["arms"]["learnability"]
    level, uniform_hard = hardest(uniform)
    learn_hard = [levels[level] for levels in learn["by_level"]]
    effects = [
        Effect(f"pass@1 after {numbers['steps']} steps: learnability - uniform",
               paired(uniform["pass@1"], learn["pass@1"]), expected_sign=+1, min_effect=0.02),
        Effect(f"pass@1 on {level}-term chains: learnability - uniform",
               paired(uniform_hard, learn_hard), expected_sign=+1, primary=False,
               min_effect=0.02),
        Effect("zero-advantage groups trained on: uniform - learnability",
               paired(learn["zero_advantage_share"], uniform["zero_advantage_share"]),
               expected_sign=+1, primary=False, min_effect=0.02),
    ]
    levels = sorted({lvl for arm in (uniform, learn) for lv in arm["by_level"] for lvl in lv},
                    key=float)
    rows = [[name, cell(arm["pass@1"]),
             *(cell([lv.get(lvl, 0.0) for lv in arm["by_level"]]) for lvl in levels),
             cell(arm["zero_advantage_share"], 2), cell(arm["seconds_per_step"], 2)]
            for name, arm in (("uniform", uniform), ("learnability", learn))]
    table = Table(["prompts drawn", "pass@1", *(f"pass@1, {lvl} terms" for lvl in levels),
                   "zero-advantage groups", "seconds per step"], rows)
    notes = [f"Held-out `test`, {numbers['prompts']} prompts x {numbers['samples']} samples "
             "per model and seed (drawn uniformly: the curriculum shapes training only); "
             "zero-advantage groups: the mean over steps of the share of groups whose "
             "rewards were all equal."]
    return Analysis(effects, table, notes)


def plot(numbers: Numbers, out: Path) -> Path:
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    arms_ = numbers["arms"]
    levels = sorted({lvl for lv in arms_["uniform"]["by_level"] for lvl in lv}, key=float)
    width = 0.4
    for i, (name, arm) in enumerate(arms_.items()):
        means = [sum(lv.get(lvl, 0.0) for lv in arm["by_level"]) / len(arm["by_level"])
                 for lvl in levels]
        axes[0].bar([k + i * width for k in range(len(levels))], means, width, label=name)
        steps = list(range(1, len(arm["zero_curve"][0]) + 1))
        band(axes[1], steps, arm["zero_curve"], name)
    axes[0].set_xticks([k + width / 2 for k in range(len(levels))], levels)
    axes[0].set_xlabel("terms in the chain")
    axes[0].set_ylabel("held-out pass@1 (mean over seeds)")
    axes[0].set_title("pass@1 by difficulty")
    axes[1].set_xlabel("training step")
    axes[1].set_title("share of zero-advantage groups (mean ± SE)")
    weights = arms_["learnability"]["weights"]
    for level in sorted(weights[0], key=float):
        curve = weights[0][level]
        axes[2].plot(range(1, len(curve) + 1), curve, label=f"{level} terms")
    axes[2].set_xlabel("training step")
    axes[2].set_title("curriculum weights per level (seed 0)")
    tidy(*axes)
    return save_figure(fig, out)


# minutes: estimated per seed from dynamic_sampling's uniform arm (80 steps ~4 min) twice,
# plus the final evals (~1 min); not yet measured at full budget (2026-12-05)
EXPERIMENT = Experiment(name=NAME, claim=CLAIM, setup=SETUP, settings=SETTINGS, arms=arms,
                        measure=measure, analyse=analyse, plot=plot, minutes_per_seed=9)
