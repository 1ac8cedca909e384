"""Checks that pay (issue 54, item 4): does RL from outcome reward teach a model to check
its own arithmetic and redo what its check flags, when its steps slip often enough that a
check could catch something?

The reasoning quickstart's base checks a third of its steps, and its checks are noise: they
said `no` to 13% of its wrong steps and to 13% of its right ones; after GRPO, `ok` to 97% of
the wrong ones (docs/reasoning.md). Its demonstrations check with a demonstrator that slips
on 10% of the steps, so a check says `ok` nine times in ten and copying `ok` is almost as
good as comparing. Here the base's own SFT shows every other trace checked step by step,
with the demonstrator slipping on 30% of the steps it computes (each flagged by its check
and redone): a `no` three times in ten, decided by comparing the check's result with the
step's total. The terms have 1-3 digits, so the model's own steps slip at temperature 1
(measured: the share of wrong steps before RL is in the table).

GRPO from that base with outcome reward only (the reasoning recipe, no KL term); before and
after on the same held-out prompts: the true-alarm rate (the share of checked wrong steps
the check flags), the false-alarm rate, the share of all wrong steps a redo fixed, the
share of steps checked, and pass@1.

The control: the same GRPO from a base whose demonstrations never check (every trace worked
one operation a line, the same slips, none caught). If checking pays, GRPO from the checking
base ends with the higher pass@1.
"""

from __future__ import annotations

from pathlib import Path

from ..rlvr.emergence import checking
from .measure import held_out
from .plots import plt, save_figure, tidy
from .record import Analysis, Table
from .setup import Arm, BaseVariant, Context, TrainedArm
from .spec import Experiment, HeldOutBudget, Numbers
from .stats import cell, paired
from .verdict import Effect

NAME = "checking"
CLAIM = ("RL from outcome reward teaches a model to check its own steps when its steps slip "
         "and its demonstrations showed checks that catch slips: after GRPO its checks flag "
         "more of its wrong steps (the true-alarm rate rises by at least 20 points) and a "
         "redo fixes more of its slips.")
STEP_ERROR = 0.3   # the demonstrator's slips: a check says `no` to 30% of the steps shown
BASE = BaseVariant("checking", (("step_error", STEP_ERROR),
                                ("strategies", {"careful": 0.5, "plain": 0.5})))
CONTROL = BaseVariant("checking-never", (("step_error", STEP_ERROR),
                                         ("strategies", {"plain": 1.0})))
SETUP = ("An SFT base of its own (configs/rlvr/reasoning_sft.yaml with demonstrations "
         "half checked step by step, half worked without checks, the demonstrator slipping "
         f"on {STEP_ERROR:.0%} of its steps, each slip flagged by its check and redone); GRPO "
         "from it with outcome reward only (configs/rlvr/reasoning.yaml, no KL term). Before "
         "and after on the same held-out prompts: the true-alarm rate of the model's checks "
         "on its own wrong steps, the false-alarm rate, the share of wrong steps a redo "
         "fixed, pass@1. Control: the same GRPO from a base whose demonstrations never "
         "check (the same slips, none caught); pass@1 after GRPO against the checking arm's.")
SETTINGS = {"quick": HeldOutBudget(steps=4, prompts=32, samples=2),
            "full": HeldOutBudget(steps=200, prompts=300, samples=2)}
MIN_ALARM_GAIN = 0.20      # the target: true alarms up by >= 20 points
MIN_CORRECTED_GAIN = 0.05  # the share of slips fixed: a change a reader would notice
STAGES = ("before", "after", "control before", "control after")  # control: never checks
ARM_STAGES = {"grpo": ("before", "after"),  # each arm's base and final model
              "grpo_never_checks": ("control before", "control after")}
STAGE_LABELS = {"before": "before RL", "after": "after RL",
                "control before": "never checks, before RL",
                "control after": "never checks, after RL"}
FIGURES = ("alarm_rate", "false_alarm_rate", "corrected_share", "checked_share",
           "wrong_step_share", "pass@1")


def arms(scale: str) -> list[Arm]:
    steps = (f"train.steps={SETTINGS[scale].steps}",)
    return [Arm("grpo", steps, base=BASE), Arm("grpo_never_checks", steps, base=CONTROL)]


def model_figures(path: Path, cfg, seed: int, s: HeldOutBudget) -> dict[str, float]:
    result = held_out(path, cfg, seed=seed, budget=s)
    return {**checking(result).as_dict(), "pass@1": result.pass_at[1]}


def measure(ctx: Context, trained: dict[str, list[TrainedArm]]) -> Numbers:
    s = SETTINGS[ctx.scale.name]
    models: dict[str, list[dict[str, float]]] = {stage: [] for stage in STAGES}
    for label, (before, after) in ARM_STAGES.items():
        for run in trained[label]:
            cfg = run.config()
            models[before].append(model_figures(run.base, cfg, run.seed, s))
            models[after].append(model_figures(run.final, cfg, run.seed, s))
    return {"seeds": list(ctx.seeds), "steps": s.steps, "prompts": s.prompts,
            "samples": s.samples, "models": models}


def _figure(numbers: Numbers, stage: str, name: str) -> list[float]:
    return [row[name] for row in numbers["models"][stage]]


def analyse(numbers: Numbers) -> Analysis:
    def change(name: str):
        return paired(_figure(numbers, "before", name), _figure(numbers, "after", name))

    effects = [
        Effect("true-alarm rate of the model's checks on its own wrong steps: after - before",
               change("alarm_rate"), expected_sign=+1, min_effect=MIN_ALARM_GAIN),
        Effect("share of the model's wrong steps fixed by a redo: after - before",
               change("corrected_share"), expected_sign=+1, min_effect=MIN_CORRECTED_GAIN),
        Effect("pass@1: after - before", change("pass@1"), expected_sign=+1, primary=False,
               min_effect=0.02),
        # added after seed 0's run showed RL checking nearly every step (reported only)
        Effect("share of steps checked: after - before", change("checked_share"),
               expected_sign=+1, primary=False, min_effect=0.10),
    ]
    stages = [stage for stage in STAGES if numbers["models"].get(stage)]  # older: no control
    if "control after" in stages:  # does checking pay? (reported: added with the control)
        effects.append(Effect(
            "pass@1 after GRPO: checking base - never-checking base",
            paired(_figure(numbers, "control after", "pass@1"),
                   _figure(numbers, "after", "pass@1")),
            expected_sign=+1, primary=False, min_effect=0.02))
    names = ("true-alarm rate", "false-alarm rate", "wrong steps fixed", "steps checked",
             "wrong steps", "pass@1")
    rows = [[stage, *(cell(_figure(numbers, stage, f)) for f in FIGURES)] for stage in stages]
    counts = {stage: {key: sum(_figure(numbers, stage, key))
                      for key in ("true_alarms", "missed_slips", "false_alarms", "corrected",
                                  "wrong_steps", "checks")}
              for stage in stages}
    notes = [f"Held-out `test`, {numbers['prompts']} prompts x {numbers['samples']} samples "
             "per model and seed, temperature 1, every completion's lines read with the "
             "task's grammar. Summed over seeds: " + "; ".join(
                 f"{stage}: {c['true_alarms']} true alarms and {c['missed_slips']} missed "
                 f"slips among checked wrong steps, {c['false_alarms']} false alarms, "
                 f"{c['corrected']} of {c['wrong_steps']} wrong steps fixed, {c['checks']} "
                 "checks" for stage, c in counts.items()) + "."]
    return Analysis(effects, Table(["model", *names], rows), notes)


def plot(numbers: Numbers, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 4.2))
    names = ("alarm_rate", "false_alarm_rate", "corrected_share", "checked_share", "pass@1")
    labels = ("true alarms", "false alarms", "slips fixed", "steps checked", "pass@1")
    stages = [stage for stage in STAGES if numbers["models"].get(stage)]
    width = 0.8 / len(stages)
    for i, stage in enumerate(stages):
        means = [sum(_figure(numbers, stage, n)) / len(numbers["models"][stage])
                 for n in names]
        ax.bar([x + (i - (len(stages) - 1) / 2) * width for x in range(len(names))], means,
               width, label=STAGE_LABELS[stage])
    ax.set_xticks(range(len(names)), labels)
    ax.set_title("the model's checks on its own steps, and pass@1 (mean over seeds)")
    ax.set_ylabel("share")
    tidy(ax)
    return save_figure(fig, out)


# minutes: measured ~8 a seed with one arm (200 GRPO steps, ~5 min at one thread, and two
# evaluations of 600 completions); the control doubles it (an estimate before its run). The
# two bases (~7 min each) are built once, not per seed.
EXPERIMENT = Experiment(name=NAME, claim=CLAIM, setup=SETUP, settings=SETTINGS, arms=arms,
                        measure=measure, analyse=analyse, plot=plot, minutes_per_seed=16)
