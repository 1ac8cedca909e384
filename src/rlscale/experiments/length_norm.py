"""Length normalisation: GRPO's per-sequence 1/|y| lets wrong completions grow long (Liu et
al. 2025, "Understanding R1-Zero-Like Training", Dr. GRPO).

Averaging each completion's token terms before averaging over completions gives every token
of a long completion a smaller weight: a long wrong answer is penalised less per token than
a short one, so length drifts up where the advantage is negative. The same GRPO run (no KL,
mean-centred advantages) with three aggregations (objectives.AGGREGATIONS):

    per_sequence  seq-mean-token-mean      GRPO: 1/|y_i| inside, mean over completions
    token_mean    token-mean               DAPO: every token of the minibatch alike
    constant      seq-mean-token-sum-norm  Dr. GRPO: token sums / one constant (max_new_tokens)

Measured: the mean length of right and of wrong completions over training (the loop's
`length/right_mean`, `length/wrong_mean`) and on held-out prompts with the final models
(`rlvr.evaluate`'s details), and pass@1.
"""

from __future__ import annotations

from pathlib import Path

from .measure import held_out, measure_curve_arms
from .plots import band, grouped_bars, plt, save_figure, tidy
from .record import Analysis, Table
from .setup import Arm, Context, TrainedArm
from .spec import CurveBudget, Experiment, Numbers, grpo_arms
from .stats import by_seed, cell, mean, paired
from .verdict import Effect

NAME = "length_norm"
CLAIM = ("GRPO's per-sequence 1/|y| normalisation lets wrong completions grow longer than right "
         "ones; Dr. GRPO's constant normaliser removes that length bias (a smaller wrong-minus-"
         "right length gap) at no cost in pass@1.")
AGGREGATIONS = {"per_sequence": "seq-mean-token-mean", "token_mean": "token-mean",
                "constant": "seq-mean-token-sum-norm"}
LABELS = {"per_sequence": "GRPO 1/|y|", "token_mean": "token mean (DAPO)",
          "constant": "constant (Dr. GRPO)"}
CURVES = ("length/right_mean", "length/wrong_mean", "length/mean", "reward/mean")
SETUP = ("GRPO (configs/rlvr/reasoning.yaml, no KL) from the SFT base with loss.aggregation = "
         "seq-mean-token-mean (GRPO's 1/|y|), token-mean (DAPO) and seq-mean-token-sum-norm "
         "(Dr. GRPO, divided by max_new_tokens), the same seeds; lengths of right and wrong "
         "completions over training and on held-out prompts, and pass@1.")
SETTINGS = {"quick": CurveBudget(steps=4, prompts=32, samples=4, window=2),
            "full": CurveBudget(steps=100, prompts=400, samples=4, window=10)}


def arms(scale: str) -> list[Arm]:
    return grpo_arms(SETTINGS[scale].steps,
                     {name: (f"loss.aggregation={agg}",) for name, agg in AGGREGATIONS.items()})


def final_figures(path: Path, cfg, seed: int, s: CurveBudget) -> dict[str, float]:
    """Held-out pass@1 and completion lengths; a side with no completion (none right, or none
    wrong) takes the overall mean length, so that its gap is 0 rather than undefined."""
    result = held_out(path, cfg, seed=seed, budget=s)
    d = result.details
    return {"pass@1": result.pass_at[1], "mean_length": result.mean_length,
            "right_length": d.get("length/right_mean", result.mean_length),
            "wrong_length": d.get("length/wrong_mean", result.mean_length)}


def measure(ctx: Context, trained: dict[str, list[TrainedArm]]) -> Numbers:
    s = SETTINGS[ctx.scale.name]
    base = by_seed([final_figures(ctx.base, run.config(), run.seed, s)  # on each seed's prompts
                    for run in trained["per_sequence"]])
    return measure_curve_arms(ctx, trained, s, AGGREGATIONS, CURVES, final_figures,
                              first={"base": base})


def gap(arm: dict) -> list[float]:
    """Per seed: mean length of wrong minus right completions (held-out, final model)."""
    return [w - r for w, r in zip(arm["wrong_length"], arm["right_length"], strict=True)]


def analyse(numbers: Numbers) -> Analysis:
    a = numbers["arms"]
    grpo, token, constant = a["per_sequence"], a["token_mean"], a["constant"]
    effects = [
        Effect("wrong - right length gap: GRPO 1/|y| - Dr. GRPO constant",
               paired(gap(constant), gap(grpo)), expected_sign=+1, min_effect=1.0),
        Effect("pass@1: Dr. GRPO constant - GRPO 1/|y|",
               paired(grpo["pass@1"], constant["pass@1"]), expected_sign=+1, primary=False,
               min_effect=0.01),
        Effect("wrong - right length gap: GRPO 1/|y| - token mean",
               paired(gap(token), gap(grpo)), expected_sign=+1, primary=False, min_effect=1.0),
        Effect("wrong completions' length: GRPO 1/|y| - Dr. GRPO constant",
               paired(constant["wrong_length"], grpo["wrong_length"]), expected_sign=+1,
               primary=False, min_effect=1.0),
        Effect("wrong completions' length: GRPO 1/|y| - base",
               paired(a["base"]["wrong_length"], grpo["wrong_length"]), expected_sign=+1,
               primary=False, min_effect=1.0),
    ]
    rows = [[label, cell(arm["pass@1"]), cell(arm["mean_length"], 1),
             cell(arm["right_length"], 1), cell(arm["wrong_length"], 1), cell(gap(arm), 1)]
            for label, arm in [("base (SFT)", a["base"]),
                               *((LABELS[n], a[n]) for n in AGGREGATIONS)]]
    table = Table(["model", "pass@1", "mean length", "right", "wrong", "wrong - right"], rows)
    notes = [f"held-out `test`: {numbers['prompts']} prompts x {numbers['samples']} samples per "
             "model and seed; lengths in tokens (EOS included)."]
    if effects[0].verdict != "supports" and mean(gap(grpo)) <= mean(gap(a["base"])) + 1.0:
        notes.append("Under GRPO's 1/|y| the wrong completions did not outgrow the right ones "
                     f"beyond the base model's gap ({mean(gap(grpo)):.1f} against "
                     f"{mean(gap(a['base'])):.1f} tokens): the bias had nothing to act on in "
                     "this budget, so the set-up could not show the normalisers removing it.")
    grew = mean(constant["right_length"]) - mean(a["base"]["right_length"])
    if effects[0].verdict == "contradicts" and grew > 1.0:
        notes.append("The token-sum normalisers lengthened right completions too (Dr. GRPO's "
                     f"constant: +{grew:.1f} tokens over the base): with every token weighted "
                     "alike, long completions carry more of the gradient whichever their sign. "
                     "Here that lengthened right and wrong completions alike, so the wider "
                     "wrong - right gap under them is not a bias that 1/|y| has and they lack; "
                     "1/|y| kept every length closer to the base's.")
    return Analysis(effects, table, notes)


def plot(numbers: Numbers, out: Path) -> Path:
    a = numbers["arms"]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    panels = ((axes[0][0], "length/wrong_mean", "wrong completions: mean length"),
              (axes[0][1], "length/right_mean", "right completions: mean length"))
    for ax, key, title in panels:
        for name in AGGREGATIONS:
            band(ax, a[name]["window_centres"], a[name]["curves"][key], LABELS[name])
        ax.set_title(f"{title} (training batches)")
    ax = axes[1][0]
    for name in AGGREGATIONS:
        c = a[name]["curves"]
        band(ax, a[name]["window_centres"],
             [[w - r for w, r in zip(ws, rs, strict=True)]
              for ws, rs in zip(c["length/wrong_mean"], c["length/right_mean"], strict=True)],
             LABELS[name])
    ax.set_title("wrong - right length (training batches)")
    for ax in (axes[0][0], axes[0][1], axes[1][0]):
        ax.set_xlabel("training step")
        ax.set_ylabel("tokens")
        tidy(ax)
    names = ["base", *AGGREGATIONS]
    grouped_bars(axes[1][1], ["base"] + [LABELS[n] for n in AGGREGATIONS],
                 [(label, [a[n][key] for n in names])
                  for key, label in (("right_length", "right"), ("wrong_length", "wrong"))])
    axes[1][1].set_title("held-out mean length, final models (mean ± SE)")
    tidy(axes[1][1], axis="y")
    return save_figure(fig, out)


# minutes: measured 23.7 (fp32, 2026-12-03): 6 x 100 GRPO steps + 8 evals
EXPERIMENT = Experiment(name=NAME, claim=CLAIM, setup=SETUP, settings=SETTINGS, arms=arms,
                        measure=measure, analyse=analyse, plot=plot, minutes_per_seed=12)
