"""Clip-higher keeps exploration alive (DAPO, Yu et al. 2025).

The symmetric clip bounds a token's ratio at 1 + eps whatever its probability, so a token
the policy finds unlikely (p = 0.01) can grow only to 0.012 per batch, while a likely one
moves freely: under batch reuse probability mass flows to what is already likely and the
entropy collapses. DAPO decouples the bounds and raises the upper one (eps_high = 0.28,
eps_low = 0.2). Here both arms reuse each batch for 4 epochs x 4 minibatches (as in the
`clipping` experiment, so the clip binds); the loop's own figures per step (`policy/entropy`,
`clip/high_frac`, `clip/low_frac`) and the final held-out pass@1.
"""

from __future__ import annotations

from functools import partial

from .clipping import (
    SETTINGS,
    measure_reuse_arms,
    plot_reuse_arms,
    reuse_arms,
    reuse_table,
    step_mean_effect,
)
from .record import Analysis
from .setup import Arm
from .spec import Experiment, Numbers
from .stats import paired
from .verdict import Effect

NAME = "clip_higher"
CLAIM = ("DAPO's clip-higher (upper clip 0.28, lower 0.2) keeps the policy's entropy higher "
         "than the symmetric clip 0.2 when each batch is reused for 4 epochs x 4 minibatches.")
ARMS = {"symmetric": ("loss.clip_low=0.2", "loss.clip_high=0.2"),
        "clip_higher": ("loss.clip_low=0.2", "loss.clip_high=0.28")}
CURVES = ("policy/entropy", "clip/high_frac", "clip/low_frac", "policy/kl_new_old")
SETUP = ("GRPO (configs/rlvr/reasoning.yaml, lr 1e-4) from the SFT base, each batch reused "
         "for train.epochs=4 x train.minibatches=4; loss.clip_low = 0.2 with "
         "loss.clip_high = 0.2 (symmetric) against 0.28 (clip-higher), the same seeds.")


def arms(scale: str) -> list[Arm]:
    return reuse_arms(scale, ARMS)


def analyse(numbers: Numbers) -> Analysis:
    sym, higher = numbers["arms"]["symmetric"], numbers["arms"]["clip_higher"]
    entropy, high = "policy/entropy", "clip/high_frac"
    effects = [
        step_mean_effect("entropy per token, mean over steps: clip-higher - symmetric",
                         entropy, sym, higher, +1, min_effect=0.01),
        Effect("pass@1: clip-higher - symmetric", paired(sym["pass@1"], higher["pass@1"]),
               expected_sign=+1, min_effect=0.01, primary=False),
        step_mean_effect("share of tokens clipped at the upper bound: clip-higher - symmetric",
                         high, sym, higher, -1, primary=False),
    ]
    table = reuse_table("clip (low / high)",
                        [("symmetric 0.2 / 0.2", sym), ("clip-higher 0.2 / 0.28", higher)],
                        [("entropy", entropy, 3), ("clipped above", high, 4),
                         ("clipped below", "clip/low_frac", 4),
                         ("KL(old, new) per step", "policy/kl_new_old", 4)])
    notes = [f"held-out `test` pass@1: {numbers['prompts']} prompts x {numbers['samples']} "
             "samples per model and seed; the other figures are means over the run's steps. "
             "`clip/high_frac` is the share of tokens with A > 0 whose ratio passed 1 + "
             "clip_high (their gradient is cut), `clip/low_frac` those with A < 0 below "
             "1 - clip_low."]
    if effects[0].verdict != "supports" and len(numbers["seeds"]) > 1:
        notes.append("The raised upper bound did not measurably keep the entropy up. One "
                     "possible reason: on this task the symmetric arm's entropy does not "
                     "collapse within the budget, so there is nothing for clip-higher to "
                     "prevent.")
    return Analysis(effects, table, notes)


# clipping's measurement and figure, of this experiment's curves
measure = partial(measure_reuse_arms, curves=CURVES)
plot = partial(plot_reuse_arms, curves=CURVES)

# minutes: as clipping's, 4 x 60 steps of 16 updates, ~7 s each (fp32) + measuring
EXPERIMENT = Experiment(name=NAME, claim=CLAIM, setup=SETUP, settings=SETTINGS, arms=arms,
                        measure=measure, analyse=analyse, plot=plot, minutes_per_seed=13.5)
