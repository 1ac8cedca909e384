"""Length penalties: a constant price per token against a difficulty-adaptive one.

A constant per-token penalty (shaping.constant_length_penalty) shortens every completion,
including the long careful traces the hard prompts need, so it should cost accuracy where the
prompts are hardest. The difficulty-adaptive penalty (shaping.adaptive_length_penalty, after
Xiang et al. 2025 and Kimi k1.5's group-relative length reward) charges only correct
completions, by their length within the group and by the group's success rate, so it should
shorten the easy prompts' completions and leave the hard prompts alone.

The same GRPO run from the SFT base (configs/rlvr/reasoning.yaml) three ways: no penalty,
`loss.length_penalty_per_token`, `loss.adaptive_length_penalty`, both from the first step;
and a sweep of strength x start step around them (`loss.length_penalty_start`): the
constant penalty at half and twice the price, and both penalties switched on half-way, so
that a verdict does not hang on one price and one schedule.
Measured on held-out prompts with the final models, by difficulty (the task's number of
terms, `rlvr.evaluate`'s `difficulty/<terms>/...` details): accuracy and mean length; over
training, the batches' mean length.
"""

from __future__ import annotations

from pathlib import Path

from .measure import by_level, held_out, measure_curve_arms
from .plots import band, plt, save_figure, tidy
from .record import Analysis, Table
from .setup import Arm, Context, TrainedArm
from .spec import CurveBudget, Experiment, Numbers, grpo_arms
from .stats import cell, curve, mean, paired
from .verdict import Effect

NAME = "length_penalty"
CLAIM = ("A constant per-token length penalty shortens completions at every difficulty and "
         "costs accuracy on the hardest prompts; the difficulty-adaptive penalty shortens the "
         "easy prompts' completions and keeps more of the hardest prompts' accuracy.")
PER_TOKEN = 0.002      # ~0.1 of the reward at the runs' mean length (~55 tokens)
ADAPTIVE = 0.5         # the longest correct completion of an easy group costs up to 0.5
PENALTIES = {"none": (), "constant": (f"loss.length_penalty_per_token={PER_TOKEN}",),
             "adaptive": (f"loss.adaptive_length_penalty={ADAPTIVE}",)}
LABELS = {"none": "no penalty", "constant": f"constant ({PER_TOKEN}/token)",
          "adaptive": f"adaptive (strength {ADAPTIVE})",
          "constant_half": f"constant ({PER_TOKEN / 2}/token)",
          "constant_double": f"constant ({PER_TOKEN * 2}/token)",
          "constant_late": f"constant ({PER_TOKEN}/token) from half-way",
          "adaptive_late": f"adaptive ({ADAPTIVE}) from half-way"}


def penalties(steps: int) -> dict[str, tuple[str, ...]]:
    """The compared arms (PENALTIES) and the sweep around them, for a run of `steps`."""
    late = f"loss.length_penalty_start={steps // 2}"
    return {**PENALTIES,
            "constant_half": (f"loss.length_penalty_per_token={PER_TOKEN / 2}",),
            "constant_double": (f"loss.length_penalty_per_token={PER_TOKEN * 2}",),
            "constant_late": (*PENALTIES["constant"], late),
            "adaptive_late": (*PENALTIES["adaptive"], late)}
CURVES = ("length/mean", "reward/mean", "length/easy_mean", "length/hard_mean")
SETUP = ("GRPO (configs/rlvr/reasoning.yaml) from the SFT base with no length penalty, a "
         f"constant {PER_TOKEN} per token (loss.length_penalty_per_token) and the "
         f"difficulty-adaptive penalty at strength {ADAPTIVE} (loss.adaptive_length_penalty), "
         "the same seeds; a sweep around them: the constant price halved and doubled, and "
         "both penalties from half-way (loss.length_penalty_start); held-out accuracy and "
         "mean length by the number of terms, and the batches' length over training.")
SETTINGS = {"quick": CurveBudget(steps=4, prompts=32, samples=2, window=2),
            "full": CurveBudget(steps=100, prompts=400, samples=4, window=10)}


def arms(scale: str) -> list[Arm]:
    return grpo_arms(SETTINGS[scale].steps, penalties(SETTINGS[scale].steps))


def final_figures(path: Path, cfg, seed: int, s: CurveBudget) -> dict:
    result = held_out(path, cfg, seed=seed, budget=s)
    return {"pass@1": result.pass_at[1], "mean_length": result.mean_length,
            "accuracy": by_level(result.details, "accuracy"),
            "length": by_level(result.details, "mean_length")}


def measure(ctx: Context, trained: dict[str, list[TrainedArm]]) -> Numbers:
    return measure_curve_arms(ctx, trained, SETTINGS[ctx.scale.name], list(trained), CURVES,
                              final_figures)


def levels(numbers: Numbers) -> list[str]:
    """The difficulty levels every arm and seed measured, easiest first."""
    common = None
    for arm in numbers["arms"].values():
        for per_level in arm["accuracy"]:
            common = set(per_level) if common is None else common & set(per_level)
    return sorted(common or (), key=int)


def at(arm: dict, key: str, level: str) -> list[float]:
    """Per seed: `key` (accuracy or length) at one difficulty level."""
    return [per_level[level] for per_level in arm[key]]


def analyse(numbers: Numbers) -> Analysis:
    a = numbers["arms"]
    none, constant, adaptive = a["none"], a["constant"], a["adaptive"]
    ladder = levels(numbers)
    if not ladder:
        raise ValueError("no difficulty level was measured by every arm and seed")
    easy, hard = ladder[0], ladder[-1]
    effects = [
        Effect(f"accuracy at {hard} terms: adaptive - constant",
               paired(at(constant, "accuracy", hard), at(adaptive, "accuracy", hard)),
               expected_sign=+1, min_effect=0.02),
        Effect(f"length at {easy} terms: no penalty - adaptive",
               paired(at(adaptive, "length", easy), at(none, "length", easy)),
               expected_sign=+1, min_effect=1.0, primary=False),
        Effect(f"length at {hard} terms: no penalty - constant",
               paired(at(constant, "length", hard), at(none, "length", hard)),
               expected_sign=+1, min_effect=1.0, primary=False),
        Effect(f"accuracy at {hard} terms: no penalty - constant",
               paired(at(constant, "accuracy", hard), at(none, "accuracy", hard)),
               expected_sign=+1, min_effect=0.02, primary=False),
        Effect("pass@1: adaptive - constant", paired(constant["pass@1"], adaptive["pass@1"]),
               expected_sign=+1, min_effect=0.01, primary=False),
    ]
    columns = ["model", "pass@1", "mean length",
               *(f"{lv} terms: accuracy / length" for lv in ladder)]
    rows = [[LABELS[name], cell(arm["pass@1"]), cell(arm["mean_length"], 1),
             *(f"{cell(at(arm, 'accuracy', lv), 2)} / {cell(at(arm, 'length', lv), 0)}"
               for lv in ladder)]
            for name, arm in a.items()]
    notes = [f"held-out `test`: {numbers['prompts']} prompts x {numbers['samples']} samples per "
             "model and seed; lengths in tokens (EOS included); difficulty = the number of "
             "terms in the chain."]
    shortened = mean(at(none, "length", hard)) - mean(at(constant, "length", hard))
    if effects[0].verdict != "supports" and shortened < 1.0:
        notes.append(f"The constant penalty did not shorten the hardest prompts' completions "
                     f"({shortened:+.1f} tokens against no penalty): at this price and budget it "
                     "had nothing to take from them, so the set-up could not show its cost.")
    cost = mean(at(none, "accuracy", hard)) - mean(at(constant, "accuracy", hard))
    if effects[3].verdict != "supports" and shortened >= 1.0:
        notes.append(f"The constant penalty shortened the {hard}-term completions by "
                     f"{shortened:.0f} tokens and moved their accuracy by {-cost:+.3f}, "
                     "within the noise: at this price the cost the claim predicts did not show, so "
                     "there was no accuracy for the adaptive penalty to keep.")
    spared = mean(at(none, "length", hard)) - mean(at(adaptive, "length", hard))
    if spared >= shortened:
        notes.append(f"The adaptive penalty did not spare the hardest prompts: it shortened "
                     f"their completions by {spared:.0f} tokens, the constant one by "
                     f"{shortened:.0f}. A hard group with any correct completion still pays "
                     "for its correct ones' length, in proportion to its (low) success share.")
    return Analysis(effects, Table(columns, rows), notes)


def plot(numbers: Numbers, out: Path) -> Path:
    a = numbers["arms"]
    ladder = levels(numbers)
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, key, title in ((axes[0][0], "length/mean", "mean length (training batches)"),
                           (axes[0][1], "reward/mean", "mean reward (training batches)")):
        for name in a:
            band(ax, a[name]["window_centres"], a[name]["curves"][key], LABELS[name])
        ax.set_xlabel("training step")
        ax.set_title(title)
    for ax, key, title in ((axes[1][0], "accuracy", "held-out accuracy by difficulty"),
                           (axes[1][1], "length", "held-out mean length by difficulty")):
        x = [int(lv) for lv in ladder]
        for name in a:
            means, ses = curve([[per_level[lv] for lv in ladder] for per_level in a[name][key]])
            ax.errorbar(x, means, yerr=ses, capsize=4, marker="o", label=LABELS[name])
        ax.set_xlabel("terms in the chain")
        ax.set_title(f"{title} (final models, mean ± SE)")
    tidy(*axes.flat)
    return save_figure(fig, out)


# minutes: measured 16.1 for 2 seeds x 3 arms (fp32, 2026-12-03): ~2.7 min an arm with its
# eval; 7 arms a seed with the sweep -- 76 min at 4 seeds, over the 60-minute budget
EXPERIMENT = Experiment(name=NAME, claim=CLAIM, setup=SETUP, settings=SETTINGS, arms=arms,
                        measure=measure, analyse=analyse, plot=plot, minutes_per_seed=19)
