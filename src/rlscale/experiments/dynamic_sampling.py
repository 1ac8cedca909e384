"""Dynamic sampling (DAPO, Yu et al. 2025): drop the groups whose G rewards are all equal
(zero advantage, no gradient) and draw again until the step has P informative groups.

GRPO from the same base and seeds with `loss.dynamic_sampling` off and on (the sync loop's
source draws up to `rollout.max_extra_draws` more batches of prompts per step). Held-out
pass@1 is the loop's own evaluation every few steps (`eval/pass@1`, the same prompts for
every arm), plotted against training steps and against the tokens generated so far
(`sampling/generated_tokens`: every sampled token, dropped groups' included), and measured
once more on the final models with more samples. DAPO's claim is about steps: every update
sees a full batch of informative groups; the price is the extra generation, which the
tokens axis shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .measure import curve_start, held_out
from .plots import band, pass1_curves, plt, save_figure, tidy
from .record import Analysis, Table
from .setup import Arm, Context, TrainedArm, mean_of, series
from .spec import Experiment, Numbers, grpo_arms
from .stats import cell, paired
from .verdict import Effect

NAME = "dynamic_sampling"
CLAIM = ("DAPO's dynamic sampling (drop groups whose rewards are all equal, draw again) raises "
         "pass@1 at an equal number of training steps, and pays for it in generated tokens.")
ARMS = {"off": (), "on": ("loss.dynamic_sampling=true",)}
EVAL = "eval/pass@1"
TOKENS = "sampling/generated_tokens"


@dataclass(frozen=True)
class Settings:
    steps: int
    eval_every: int      # the loop's held-out eval (eval.every); divides steps
    eval_prompts: int
    eval_samples: int
    prompts: int         # the final models' held-out pass@1
    samples: int


SETUP = ("GRPO (configs/rlvr/reasoning.yaml) from the SFT base with loss.dynamic_sampling "
         "false and true (up to rollout.max_extra_draws = 4 extra draws of prompts per "
         "step), the same seeds; the loop's held-out eval every few steps against steps and "
         "against generated tokens, and the final models' pass@1.")
SETTINGS = {"quick": Settings(steps=4, eval_every=2, eval_prompts=16, eval_samples=2,
                              prompts=32, samples=4),
            "full": Settings(steps=80, eval_every=10, eval_prompts=200, eval_samples=2,
                             prompts=400, samples=4)}


def arms(scale: str) -> list[Arm]:
    s = SETTINGS[scale]
    return grpo_arms(s.steps, ARMS, f"eval.every={s.eval_every}",
                     f"eval.prompts={s.eval_prompts}", f"eval.samples={s.eval_samples}")


def cumulative(values: list[float]) -> list[float]:
    out, total = [], 0.0
    for v in values:
        total += v
        out.append(total)
    return out


def eval_curve(rows: list[dict], base_pass1: float) -> dict[str, list[float]]:
    """The held-out pass@1 at step 0 (the base) and at every eval, with the step and the
    tokens generated up to and including that step."""
    steps, tokens = series(rows, TOKENS)
    total = dict(zip(steps, cumulative(tokens), strict=True))
    eval_steps, pass1 = series(rows, EVAL)
    return {"steps": [0, *eval_steps], "tokens": [0.0, *(total[s] for s in eval_steps)],
            "pass@1": [base_pass1, *pass1]}


def interpolate(x: float, xs: list[float], ys: list[float]) -> float:
    """ys at x by linear interpolation over increasing xs; the end values outside them."""
    if x <= xs[0]:
        return ys[0]
    for i in range(1, len(xs)):
        if x <= xs[i]:
            x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y1
    return ys[-1]


def measure(ctx: Context, trained: dict[str, list[TrainedArm]]) -> Numbers:
    s = SETTINGS[ctx.scale.name]
    first = trained["off"][0].config()
    base_pass1 = curve_start(ctx.base, first)
    out: dict[str, dict] = {}
    for name in ARMS:
        arm: dict = {"pass@1": [], "curves": [], "tokens_per_step": [], "dropped_share": [],
                     "zero_advantage_share": [], "batch_prompts": [], "seconds_per_step": [],
                     "dropped_curve": [], "steps": []}
        for run in trained[name]:
            rows = run.metrics()
            result = held_out(run.final, run.config(), seed=run.seed, budget=s)
            arm["pass@1"].append(result.pass_at[1])
            arm["curves"].append(eval_curve(rows, base_pass1))
            arm["tokens_per_step"].append(mean_of(rows, TOKENS))
            arm["dropped_share"].append(mean_of(rows, "sampling/dropped_group_share"))
            arm["zero_advantage_share"].append(mean_of(rows, "reward/zero_advantage_group_share"))
            arm["batch_prompts"].append(mean_of(rows, "sampling/batch_prompts"))
            arm["seconds_per_step"].append(mean_of(rows, "time/step_s"))
            steps, dropped = series(rows, "sampling/dropped_group_share")
            arm["dropped_curve"].append(dropped)
            arm["steps"] = steps
        out[name] = arm
    return {"seeds": list(ctx.seeds), "steps": s.steps, "prompts": s.prompts,
            "samples": s.samples, "eval_prompts": s.eval_prompts,
            "eval_samples": s.eval_samples, "base_pass@1": base_pass1, "arms": out}


def at_equal_tokens(numbers: Numbers) -> tuple[list[float], list[float]]:
    """Per seed: (off's last eval pass@1, on's eval pass@1 interpolated at the tokens off
    had generated by then)."""
    off, on = numbers["arms"]["off"]["curves"], numbers["arms"]["on"]["curves"]
    return ([c["pass@1"][-1] for c in off],
            [interpolate(a["tokens"][-1], b["tokens"], b["pass@1"])
             for a, b in zip(off, on, strict=True)])


def analyse(numbers: Numbers) -> Analysis:
    off, on = numbers["arms"]["off"], numbers["arms"]["on"]
    ratio = [b / a - 1.0 for a, b in zip(off["tokens_per_step"], on["tokens_per_step"],
                                         strict=True)]
    off_tokens, on_tokens = at_equal_tokens(numbers)
    effects = [
        Effect(f"pass@1 after {numbers['steps']} steps: on - off",
               paired(off["pass@1"], on["pass@1"]), expected_sign=+1, min_effect=0.01),
        Effect("generated tokens per step: on / off - 1", tuple(ratio), expected_sign=+1,
               primary=False, min_effect=0.05),
        Effect("eval pass@1 at equal generated tokens: on - off",
               paired(off_tokens, on_tokens), expected_sign=+1, primary=False,
               min_effect=0.01),
    ]
    rows = [[name, cell(arm["pass@1"]), cell([c["pass@1"][-1] for c in arm["curves"]]),
             cell(arm["tokens_per_step"], 0), cell(arm["zero_advantage_share"], 2),
             cell(arm["dropped_share"], 2), cell(arm["batch_prompts"], 1),
             cell(arm["seconds_per_step"], 2)]
            for name, arm in (("off", off), ("on", on))]
    table = Table(["dynamic sampling", "pass@1 (final)", "eval pass@1 (last)",
                   "generated tokens per step", "zero-advantage groups trained",
                   "groups dropped", "prompts per batch", "seconds per step"], rows)
    notes = [f"final pass@1: held-out `test`, {numbers['prompts']} prompts x "
             f"{numbers['samples']} samples per model and seed; the curves: the loop's eval "
             f"({numbers['eval_prompts']} prompts x {numbers['eval_samples']} samples, the same "
             f"prompts for every arm), from the base ({numbers['base_pass@1']:.3f}) at step 0. "
             "Per-step figures are means over the run's steps."]
    if max(off["zero_advantage_share"]) < 0.1:
        notes.append("Fewer than a tenth of the groups had equal rewards without dynamic "
                     "sampling: there was little for it to drop, so this set-up could hardly "
                     "show an effect.")
    return Analysis(effects, table, notes)


def plot(numbers: Numbers, out: Path) -> Path:
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    arms_ = numbers["arms"]
    pass1_curves(axes[0], axes[1], {f"dynamic sampling {name}": arm["curves"]
                                    for name, arm in arms_.items()}, "tokens", "tokens generated")
    band(axes[2], arms_["on"]["steps"], arms_["on"]["dropped_curve"], "groups dropped (on)")
    axes[2].set_xlabel("training step")
    axes[2].set_title("share of drawn groups dropped (all rewards equal)")
    tidy(*axes)
    return save_figure(fig, out)


# minutes: measured 17.4 min (fp32, 2026-12-03): 2 seeds x 80 steps off and on (2.1x the tokens)
EXPERIMENT = Experiment(name=NAME, claim=CLAIM, setup=SETUP, settings=SETTINGS, arms=arms,
                        measure=measure, analyse=analyse, plot=plot, minutes_per_seed=8.5)
