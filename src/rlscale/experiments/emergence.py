"""Emergence (docs/emergence.md): does RL from outcome reward alone make a model that never
saw a multi-step solution write one?

Three bases, each pretrained once on the reasoning task's chains (terms of 1-2 digits at
full scale) and never shown a solution with an intermediate result (tests/test_chain_
documents.py checks every document with a parser):

- `control`: answer-only solutions of chains, `<a>1046</a>` (the answer format) alone;
- `primed`: the same, plus stand-alone one-operation facts in the trace's line format and
  check primers (a fact, its check by the inverse operation, redone when it says no);
- `oneline`: the primed corpus with each chain solved on one line, the whole chain at once,
  then its answer (`47+385-96=336`, `<a>336</a>`): a base that writes a line and answers from
  it, but never an intermediate result.

GRPO from each, the same steps and seeds (configs/rlvr/emergence.yaml's settings: outcome
reward only, a learnability curriculum over chain length). Measured before and after on the
same held-out prompts, by chain length: pass@1, the share of completions with an
intermediate result, the lines that work the prompt's chain, the completion's length; over
the RL steps: the share of completions with intermediate results and their length.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..rlvr.emergence import by_terms, line_use, over_terms
from ..rlvr.model import load_model
from ..rlvr.tasks import examples
from .measure import held_out, run_task
from .plots import band, plt, save_figure, tidy
from .record import Analysis, Table
from .setup import Arm, BaseVariant, Context, TrainedArm, series
from .spec import Experiment, HeldOutBudget, Numbers
from .stats import cell, paired
from .verdict import Effect

NAME = "emergence"
CLAIM = ("RL from outcome reward alone makes a small model that never saw a multi-step "
         "solution write intermediate results on long chains, and raises its pass@1 there; a "
         "control base without the facts and primers gains at most half as much.")
BASES = ("control", "primed", "oneline")
DOCUMENTS = 'data.documents={"facts": 0.4, "primers": 0.2}'
SFT = {"control": ("data.answer_only=true", "data.documents={}"),
       "primed": ("data.answer_only=true", DOCUMENTS),
       "oneline": (DOCUMENTS,)}
RL = ("rollout.max_new_tokens=160", "rollout.curriculum=learnability", "eval.every=0",
      "loss.kl_coef=0.0")
MIN_LINES = 0.10    # the share of completions with intermediate results the claim needs
MIN_GAIN = 0.05     # pass@1 on the long chains


SETUP = ("Three bases pretrained once each (configs/rlvr/reasoning_sft.yaml's model and "
         "optimiser, the task's terms of 1-2 digits, 2,500 steps at full scale): answer-only "
         "chains alone (control); the same with stand-alone facts and check primers "
         "(primed, configs/rlvr/emergence_sft.yaml); the primed corpus with each chain solved "
         "on one line (oneline). GRPO from each with outcome reward only, a learnability "
         "curriculum over chain length, the same steps and seeds; pass@1, intermediate "
         "results and length by chain length before and after, on the same held-out prompts.")
SETTINGS = {"quick": HeldOutBudget(steps=4, prompts=32, samples=2),
            "full": HeldOutBudget(steps=400, prompts=300, samples=2)}
# The chains the claim is about: the longest the scale's task has.
LONG = {"quick": (3, 3), "full": (4, 6)}
FULL_OPTIONS = (("max_digits", 2),)


def task_options(scale: str, base: str) -> tuple[tuple[str, object], ...]:
    options = FULL_OPTIONS if scale == "full" else ()
    if base == "oneline":
        options = (*options, ("strategies", {"whole": 1.0}))
    return options


def arms(scale: str) -> list[Arm]:
    steps = f"train.steps={SETTINGS[scale].steps}"
    sft_steps = ("steps=2500",) if scale == "full" else ()
    out = []
    for base in BASES:
        options = dict(task_options(scale, base))
        options.pop("strategies", None)  # the RL task: the same chains, no demonstrations
        task = (f"task.options={json.dumps(options)}",) if options else ()
        variant = BaseVariant(f"emergence-{base}", task_options(scale, base),
                              (*SFT[base], *sft_steps))
        out.append(Arm(base, (steps, *RL, *task), base=variant))
    return out


def measure(ctx: Context, trained: dict[str, list[TrainedArm]]) -> Numbers:
    s = SETTINGS[ctx.scale.name]
    lo, hi = LONG[ctx.scale.name]
    out: dict[str, dict] = {}
    for base in BASES:
        arm: dict = {"before": [], "after": [], "lines_curve": [], "length_curve": [],
                     "line_use": []}
        for run in trained[base]:
            cfg = run.config()
            task = run_task(cfg)
            for stage, path in (("before", run.base), ("after", run.final)):
                result = held_out(path, cfg, seed=run.seed, budget=s)
                arm[stage].append({str(k): v for k, v in by_terms(task, result).items()})
            rows = run.metrics()
            arm["lines_curve"].append(series(rows, "behaviour/intermediate")[1])
            arm["length_curve"].append(series(rows, "length/mean")[1])
            probe = [ex for ex in examples(task, "test", run.seed, 4 * s.prompts)
                     if lo <= ex.meta["terms"] <= hi][:s.prompts]
            arm["line_use"].append(line_use(*load_model(run.base), task, probe).as_dict())
        out[base] = arm
    return {"seeds": list(ctx.seeds), "steps": s.steps, "prompts": s.prompts,
            "samples": s.samples, "long": [lo, hi], "arms": out}


def long_figure(tables: list[dict], lo: int, hi: int, name: str) -> list[float]:
    """Per seed: `name` over the chains of lo..hi terms."""
    return [over_terms({int(k): v for k, v in table.items()}, lo, hi)[name] for table in tables]


def analyse(numbers: Numbers) -> Analysis:
    lo, hi = numbers["long"]
    span = f"{lo}-{hi}" if lo != hi else f"{lo}"
    arms_ = numbers["arms"]

    def change(base: str, name: str) -> tuple[list[float], list[float]]:
        return (long_figure(arms_[base]["before"], lo, hi, name),
                long_figure(arms_[base]["after"], lo, hi, name))

    primed_gain = [a - b for b, a in zip(*change("primed", "pass@1"), strict=True)]
    control_gain = [a - b for b, a in zip(*change("control", "pass@1"), strict=True)]
    effects = [
        Effect(f"completions with intermediate results on {span}-term chains, primed: after "
               "- before", paired(*change("primed", "intermediate")), expected_sign=+1,
               min_effect=MIN_LINES),
        Effect(f"pass@1 on {span}-term chains, primed: after - before",
               paired(*change("primed", "pass@1")), expected_sign=+1, min_effect=MIN_GAIN),
        Effect(f"completions with intermediate results on {span}-term chains, oneline: after "
               "- before", paired(*change("oneline", "intermediate")), expected_sign=+1,
               primary=False, min_effect=MIN_LINES),
        Effect(f"pass@1 gain on {span}-term chains: primed - control",
               paired(control_gain, primed_gain), expected_sign=+1, primary=False,
               min_effect=MIN_GAIN),
    ]
    rows = []
    for base in BASES:
        for stage in ("before", "after"):
            tables = arms_[base][stage]
            rows.append([base, stage, *(cell(long_figure(tables, lo, hi, name))
                                        for name in ("pass@1", "intermediate", "chained_lines",
                                                     "characters"))])
    table = Table(["base", "RL", f"pass@1, {span} terms", "with intermediate results",
                   "chained lines", "characters"], rows)
    use = {base: arms_[base]["line_use"] for base in BASES}
    notes = [f"Held-out `test`, {numbers['prompts']} prompts x {numbers['samples']} samples "
             f"per model and seed, temperature 1; figures over the {span}-term chains (each "
             "length weighted equally). Can the base use lines it is handed (greedy answer "
             "after the chain's right lines, vs after the prompt alone): " + "; ".join(
                 f"{base} {_mean(u, 'after_lines'):.2f} vs {_mean(u, 'alone'):.2f}"
                 for base, u in use.items()) + "."]
    return Analysis(effects, table, notes)


def _mean(rows: list[dict], key: str) -> float:
    return sum(row[key] for row in rows) / max(len(rows), 1)


def plot(numbers: Numbers, out: Path) -> Path:
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    arms_ = numbers["arms"]
    for base, arm in arms_.items():
        steps = list(range(1, len(arm["lines_curve"][0]) + 1))
        band(axes[0], steps, arm["lines_curve"], base)
        band(axes[1], steps, arm["length_curve"], base)
    width = 0.25
    terms = sorted({int(k) for table in arms_["primed"]["before"] for k in table})
    for i, (base, arm) in enumerate(arms_.items()):
        gains = [sum(a[str(t)]["pass@1"] - b[str(t)]["pass@1"]
                     for b, a in zip(arm["before"], arm["after"], strict=True))
                 / len(arm["after"]) for t in terms]
        axes[2].bar([t + (i - 1) * width for t in terms], gains, width, label=base)
    axes[0].set_title("completions with intermediate results (mean ± SE)")
    axes[1].set_title("mean completion length, tokens (the R1-Zero curve)")
    for ax in axes[:2]:
        ax.set_xlabel("RL step")
    axes[2].set_title("pass@1 gain by chain length (mean over seeds)")
    axes[2].set_xlabel("terms in the chain")
    tidy(*axes)
    return save_figure(fig, out)


# minutes: three arms of 400 short-completion GRPO steps (~4-5 min each at one thread) and
# their evaluations; the three bases (~8 min each) are built once, not per seed (2026-12-05,
# from the prototype runs of docs/emergence.md)
EXPERIMENT = Experiment(name=NAME, claim=CLAIM, setup=SETUP, settings=SETTINGS, arms=arms,
                        measure=measure, analyse=analyse, plot=plot, minutes_per_seed=18)
