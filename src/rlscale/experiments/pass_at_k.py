"""RL raises pass@1 but not pass@k at large k (Yue et al. 2025, "Does reinforcement
learning really incentivize reasoning capacity beyond the base model?").

The base model and GRPO from it, measured with many samples per prompt on the held-out
`test` split and on the rule-change `ood` split: pass@k for k = 1 .. K. The claim predicts
that GRPO wins at k = 1 and that at the largest k the base model is as good or better: the
curves cross. Every seed trains its own GRPO model and measures both models on its own
prompts (the eval seed is the training seed), so the differences are paired per seed.
"""

from __future__ import annotations

from pathlib import Path

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
         "model each sampled n times per prompt on `test` and `ood` (temperature 1), "
         "unbiased pass@k for k = 1, 2, 4, .. n.")
# prompts: per split; samples: per prompt, the largest k
SETTINGS = {"quick": HeldOutBudget(steps=6, prompts=16, samples=32),
            "full": HeldOutBudget(steps=100, prompts=50, samples=256)}


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
        cfg = run.config()
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
        effects.append(Effect(f"{split}: pass@{k_max} gain (GRPO - base)",
                              paired([c[-1] for c in base], [c[-1] for c in grpo]),
                              expected_sign=-1, min_effect=0.01))
        k_cross = crossing(ks, curve(base)[0], curve(grpo)[0])
        notes.append(f"{split}: " + (f"the mean curves cross at k = {k_cross} (the base model "
                                     f"at least as good from there on)" if k_cross else
                                     f"the mean curves do not cross up to k = {k_max}"))
        for i, k in enumerate(ks):
            b, g = [c[i] for c in base], [c[i] for c in grpo]
            rows.append([split, str(k), cell(b), cell(g), cell(paired(b, g))])
    notes.append(f"{numbers['prompts']} prompts x {numbers['samples']} samples per split, "
                 "model and seed.")
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


# minutes: 2 x 100 GRPO steps (~4 min) + 8 evals of 12,800 samples (~7 min)
EXPERIMENT = Experiment(name=NAME, claim=CLAIM, setup=SETUP, settings=SETTINGS, arms=arms,
                        measure=measure, analyse=analyse, plot=plot, minutes_per_seed=5.5)
