"""The KL anchor: a KL penalty to the reference (the SFT base) holds the policy near it.

GRPO with `loss.kl_coef` (beta) in {0, 0.04, 0.2}, k3 estimator, from the same base and
seeds. Each final model is measured on its own samples of held-out prompts: KL to the
reference and entropy per token (measure.drift, the same k3 figure a run logs as `kl/mean`,
measured alike for beta = 0), pass@1, and the share of trace text outside the task's
grammar (`behaviour/ungrammatical_lines`, lines per completion). The entropy over training
is the loop's own `policy/entropy`.
"""

from __future__ import annotations

from pathlib import Path

from .measure import drift, held_out, run_task
from .plots import band, plt, save_figure, tidy
from .record import Analysis, Table
from .setup import Arm, Context, TrainedArm, series
from .spec import Experiment, HeldOutBudget, Numbers, grpo_arms
from .stats import by_seed, cell, curve, mean, paired
from .verdict import Effect

NAME = "kl_anchor"
CLAIM = ("A KL penalty to the reference anchors the policy: a larger beta ends closer to the "
         "reference (lower KL) with more entropy left, at some cost in pass@1.")
BETAS = (0.0, 0.04, 0.2)
UNGRAMMATICAL = "behaviour/ungrammatical_lines"
SETUP = ("GRPO (configs/rlvr/reasoning.yaml) from the SFT base with loss.kl_coef = 0, 0.04 "
         "and 0.2 (k3, the base as the frozen reference), the same seeds; each final model "
         "measured on its own held-out samples: KL to the reference and entropy per token, "
         "pass@1, ungrammatical lines.")
# prompts: held-out prompts for pass@1 and for the drift
SETTINGS = {"quick": HeldOutBudget(steps=6, prompts=32, samples=4),
            "full": HeldOutBudget(steps=100, prompts=200, samples=4)}


def label(beta: float) -> str:
    return f"beta{beta:g}"


def arms(scale: str) -> list[Arm]:
    return grpo_arms(SETTINGS[scale].steps, {label(b): (f"loss.kl_coef={b:g}",) for b in BETAS})


def _final_figures(path: Path, reference: Path, cfg, seed: int,
                   s: HeldOutBudget) -> dict[str, float]:
    result = held_out(path, cfg, seed=seed, budget=s)
    d = drift(path, reference, run_task(cfg), split="test", seed=seed, prompts=s.prompts,
              samples=s.samples, max_new_tokens=cfg.rollout.max_new_tokens,
              temperature=cfg.rollout.temperature)
    return {"pass@1": result.pass_at[1], "ungrammatical": result.details.get(UNGRAMMATICAL, 0.0),
            "kl_to_reference": d.kl_to_reference, "entropy": d.entropy}


def measure(ctx: Context, trained: dict[str, list[TrainedArm]]) -> Numbers:
    s = SETTINGS[ctx.scale.name]
    first = next(iter(trained.values()))
    # the base measured like the arms, once per seed
    out: dict[str, dict] = {"base": by_seed([_final_figures(ctx.base, ctx.base, run.config(),
                                                           run.seed, s) for run in first])}
    for beta in BETAS:
        runs = trained[label(beta)]
        arm: dict = by_seed([_final_figures(run.final, ctx.base, run.config(), run.seed, s)
                             for run in runs])
        arm["entropy_curve"] = [series(run.metrics(), "policy/entropy")[1] for run in runs]
        arm["steps"] = series(runs[-1].metrics(), "policy/entropy")[0]
        out[label(beta)] = arm
    return {"betas": list(BETAS), "seeds": list(ctx.seeds), "prompts": s.prompts,
            "samples": s.samples, "arms": out}


def analyse(numbers: Numbers) -> Analysis:
    a = numbers["arms"]
    zero, mid, high = (a[label(b)] for b in BETAS)
    top = f"beta {BETAS[-1]:g} - beta 0"
    effects = [
        Effect(f"KL to reference: {top}", paired(zero["kl_to_reference"], high["kl_to_reference"]),
               expected_sign=-1, min_effect=0.005),
        Effect(f"entropy: {top}", paired(zero["entropy"], high["entropy"]), expected_sign=+1,
               min_effect=0.02),
        Effect(f"KL to reference: beta {BETAS[1]:g} - beta 0",
               paired(zero["kl_to_reference"], mid["kl_to_reference"]), expected_sign=-1,
               primary=False),
        Effect(f"pass@1: {top}", paired(zero["pass@1"], high["pass@1"]), expected_sign=-1,
               primary=False, min_effect=0.01),
        Effect(f"ungrammatical lines per completion: {top}",
               paired(zero["ungrammatical"], high["ungrammatical"]), expected_sign=-1,
               primary=False, min_effect=0.01),
    ]
    rows = [["base (SFT)", "0", cell(a["base"]["entropy"]), cell(a["base"]["pass@1"]),
             cell(a["base"]["ungrammatical"], 2)]]
    for beta in BETAS:
        arm = a[label(beta)]
        rows.append([f"GRPO beta={beta:g}", cell(arm["kl_to_reference"], 4), cell(arm["entropy"]),
                     cell(arm["pass@1"]), cell(arm["ungrammatical"], 2)])
    table = Table(["model", "KL to reference (per token)", "entropy (per token)", "pass@1",
                   "ungrammatical lines"], rows)
    notes = [f"held-out `test`: {numbers['prompts']} prompts x {numbers['samples']} samples per "
             "model and seed, the model's own samples at temperature 1."]
    if max(zero["kl_to_reference"]) < 0.005:
        notes.append("Without the anchor the policy moved less than 0.005 nats per token from "
                     "the reference: there was little drift for the anchor to hold back.")
    base_text = mean(a["base"]["ungrammatical"])
    if mean(zero["ungrammatical"]) < base_text + 0.05:
        notes.append("Without the anchor (beta = 0) the traces did not leave the task's grammar "
                     f"more than the base model's did ({mean(zero['ungrammatical']):.3f} against "
                     f"{base_text:.3f} ungrammatical lines per completion): this set-up cannot "
                     "show drift into gibberish.")
    return Analysis(effects, table, notes)


def plot(numbers: Numbers, out: Path) -> Path:
    a, betas = numbers["arms"], numbers["betas"]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7.5))
    panels = ((axes[0][0], "kl_to_reference", "KL to reference per token (k3)"),
              (axes[1][0], "pass@1", "held-out pass@1"),
              (axes[1][1], "ungrammatical", "ungrammatical lines per completion"))
    for ax, key, title in panels:
        by_beta, se = curve([[a[label(b)][key][i] for b in betas]
                             for i in range(len(numbers["seeds"]))])
        ax.errorbar(betas, by_beta, yerr=se, marker="o", capsize=4, label="GRPO")
        if key != "kl_to_reference":
            ax.axhline(mean(a["base"][key]), color="grey",
                       linestyle="--", label="base (SFT)")
        ax.set_xlabel("beta (loss.kl_coef)")
        ax.set_title(title)
        tidy(ax)
    ax = axes[0][1]
    for beta in betas:
        arm = a[label(beta)]
        band(ax, arm["steps"], arm["entropy_curve"], f"beta={beta:g}")
    ax.set_xlabel("step")
    ax.set_title("policy/entropy over training (mean ± SE over seeds)")
    tidy(ax)
    return save_figure(fig, out)


# minutes: 6 x 100 GRPO steps (~14 min, a reference forward for beta > 0) + measuring
EXPERIMENT = Experiment(name=NAME, claim=CLAIM, setup=SETUP, settings=SETTINGS, arms=arms,
                        measure=measure, analyse=analyse, plot=plot, minutes_per_seed=7.5)
