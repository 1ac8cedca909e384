"""RL raises pass@1 but not pass@k at large k (Yue et al. 2025, "Does reinforcement
learning really incentivize reasoning capacity beyond the base model?").

The base model and GRPO from it, measured with many samples per prompt on the held-out
`test` split and on the rule-change `ood` split: pass@k for k = 1 .. K. The claim predicts
that GRPO wins at k = 1 and that at the largest k the base model is as good or better: the
curves cross. Every seed trains its own GRPO model and measures both models on its own
prompts (the eval seed is the training seed), so the differences are paired per seed.

Measured on hard prompts only (chains of 5-6 terms), where the base model does not already
solve nearly everything at large k (on all of `test` its pass@256 was 0.97, leaving no room
to show a difference). "Not higher at large k" is a non-superiority test: supported when
the one-sided 95% upper bound of GRPO - base at the largest k is below a 0.02 margin. k stops
at 256: 1,024 samples of 500 prompts for two models and two splits would take ~2.5 hours a
seed on 2 cores.
"""

from __future__ import annotations

from pathlib import Path

from ..rlvr.tasks.long_arithmetic import LongArithmeticTask
from .measure import pass_at
from .plots import band, plt, save_figure, tidy
from .record import Analysis, Table
from .setup import Arm, Context, TrainedArm
from .spec import Experiment, HeldOutBudget, Numbers, grpo_arms
from .stats import cell, curve, paired
from .verdict import Effect

NAME = "pass_at_k"
CLAIM = ("RL raises pass@1 but not pass@k at large k: with enough samples the base model "
         "solves as many prompts as the RL model, and the pass@k curves cross.")
SPLITS = ("test", "ood")
MODELS = ("base", "grpo")
SETUP = ("GRPO (configs/rlvr/reasoning.yaml, no KL term) from the SFT base; base and GRPO "
         "model each sampled n times per prompt on the hard prompts (5-6 terms) of `test` "
         "and `ood` (temperature 1), unbiased pass@k for k = 1, 2, 4, .. n; at the largest k "
         "a non-superiority test with a 0.02 margin.")
# prompts: per split; samples: per prompt, the largest k
SETTINGS = {"quick": HeldOutBudget(steps=6, prompts=16, samples=32),
            "full": HeldOutBudget(steps=100, prompts=200, samples=256)}
HARD_LEVELS = 2   # the measured prompts: the task's two longest chain lengths
MARGIN = 0.02     # "not higher": GRPO - base at the largest k below this


def hard_prompts(cfg):
    """`cfg` with its task narrowed to the hard prompts, its HARD_LEVELS longest chain
    lengths (the same task and splits: 5-6 terms at full budget)."""
    options = cfg.task.options
    longest = options.get("max_terms", LongArithmeticTask.max_terms)
    shortest = max(longest - HARD_LEVELS + 1, options.get("min_terms", 2))
    task = cfg.task.model_copy(update={"options": {**options, "min_terms": shortest}})
    return cfg.model_copy(update={"task": task})


def ks_up_to(samples: int) -> tuple[int, ...]:
    return tuple(2 ** i for i in range(samples.bit_length()) if 2 ** i <= samples)


def arms(scale: str) -> list[Arm]:
    return grpo_arms(SETTINGS[scale].steps, {"grpo": ()})


def measure(ctx: Context, trained: dict[str, list[TrainedArm]]) -> Numbers:
    s = SETTINGS[ctx.scale.name]
    ks = ks_up_to(s.samples)
    curves: dict[str, dict[str, list[list[float]]]] = {m: {sp: [] for sp in SPLITS}
                                                       for m in MODELS}
    for run in trained["grpo"]:
        cfg = hard_prompts(run.config())
        for model, path in (("base", ctx.base), ("grpo", run.final)):
            for split in SPLITS:
                result = pass_at(path, cfg, split=split, seed=run.seed, prompts=s.prompts,
                                 samples=s.samples, ks=ks)
                curves[model][split].append([result.pass_at[k] for k in ks])
    return {"ks": list(ks), "seeds": list(ctx.seeds), "prompts": s.prompts,
            "samples": s.samples, "pass_at_k": curves}


def crossing(ks: list[int], base: list[float], trained: list[float]) -> int | None:
    """The first k from which the base model's mean pass@k is at least the trained one's,
    after the trained model led at k = 1; None if it never is (or never led)."""
    if trained[0] <= base[0]:
        return None
    return next((k for k, b, t in zip(ks, base, trained, strict=True) if b >= t), None)


def analyse(numbers: Numbers) -> Analysis:
    ks, curves = numbers["ks"], numbers["pass_at_k"]
    k_max = ks[-1]
    effects, notes, rows = [], [], []
    for split in SPLITS:
        base, grpo = curves["base"][split], curves["grpo"][split]
        effects.append(Effect(f"{split}: pass@1 gain (GRPO - base)",
                              paired([c[0] for c in base], [c[0] for c in grpo]),
                              expected_sign=+1, primary=split == "test", min_effect=0.01))
        effects.append(Effect(f"{split}: pass@{k_max} gain (GRPO - base), at most "
                              f"{MARGIN:g}", paired([c[-1] for c in base], [c[-1] for c in grpo]),
                              expected_sign=-1, min_effect=MARGIN, test="at_most"))
        k_cross = crossing(ks, curve(base)[0], curve(grpo)[0])
        notes.append(f"{split}: " + (f"the mean curves cross at k = {k_cross} (the base model "
                                     f"at least as good from there on)" if k_cross else
                                     f"the mean curves do not cross up to k = {k_max}"))
        for i, k in enumerate(ks):
            b, g = [c[i] for c in base], [c[i] for c in grpo]
            rows.append([split, str(k), cell(b), cell(g), cell(paired(b, g))])
    notes.append(f"{numbers['prompts']} hard prompts (the task's {HARD_LEVELS} longest chain "
                 f"lengths) x {numbers['samples']} samples per split, model and seed. pass@"
                 f"{k_max}: a non-superiority test, supported when GRPO - base is below "
                 f"{MARGIN:g} with 95% confidence (one-sided).")
    if effects[0].verdict != "supports" and len(numbers["seeds"]) > 1:
        notes.append("GRPO did not clearly raise test pass@1 here: the premise of the claim "
                     "failed, and the comparison at large k says little about it.")
    table = Table(["split", "k", "base pass@k", "GRPO pass@k", "GRPO - base"], rows)
    return Analysis(effects, table, notes)


def plot(numbers: Numbers, out: Path) -> Path:
    ks, curves = numbers["ks"], numbers["pass_at_k"]
    fig, axes = plt.subplots(1, len(SPLITS), figsize=(5.5 * len(SPLITS), 4), squeeze=False)
    for ax, split in zip(axes[0], SPLITS, strict=True):
        for model, label in (("base", "base (SFT)"), ("grpo", "GRPO")):
            band(ax, ks, curves[model][split], label, marker="o")
        k_cross = crossing(ks, curve(curves["base"][split])[0], curve(curves["grpo"][split])[0])
        if k_cross:
            ax.axvline(k_cross, color="grey", linestyle="--", label=f"cross at k={k_cross}")
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1)
        ax.set_xlabel("k")
        ax.set_ylabel("pass@k")
        ax.set_title(f"{split}: pass@k, mean ± SE over {len(numbers['seeds'])} seed(s)")
        tidy(ax)
    return save_figure(fig, out)


# minutes: a seed's 100 GRPO steps (~2 min) and 4 evals of 51,200 samples of hard prompts
# (~3 min each at the 12,800-sample evals' ~50 s, with longer traces): ~14 min a seed
EXPERIMENT = Experiment(name=NAME, claim=CLAIM, setup=SETUP, settings=SETTINGS, arms=arms,
                        measure=measure, analyse=analyse, plot=plot, minutes_per_seed=14)
