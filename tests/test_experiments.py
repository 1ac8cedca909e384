"""`rlscale experiments`: the verdict can say all three things, every experiment's analysis
can too (on synthetic numbers), every experiment runs in quick mode through the library's
loop and leaves a figure and a verdict, and `report` writes the markdown."""

import dataclasses
import json
import math
import os
import socket
import subprocess
import time

import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

from cores import every_core
from rlscale.cli import app
from rlscale.experiments import (
    baseline_variance,
    checking,
    clip_higher,
    clipping,
    continuum,
    curriculum,
    dynamic_sampling,
    emergence,
    forking_tokens,
    grpo_vs_zero,
    gspo_ratio_variance,
    kl_anchor,
    length_norm,
    length_penalty,
    pass_at_k,
    ppo_critic,
    staleness,
    tool_use,
    zero_prior,
    zero_value_target,
)
from rlscale.experiments.record import FIGURE_NAME, load_result
from rlscale.experiments.registry import EXPERIMENTS
from rlscale.experiments.report import section, write_report
from rlscale.experiments.runner import command, run_experiment
from rlscale.experiments.setup import (
    QUICK,
    Context,
    SFTArm,
    base_model,
    train_arm,
    train_sft_arm,
    windowed,
)
from rlscale.experiments.verdict import (
    VERDICTS,
    Effect,
    Estimate,
    estimate,
    experiment_verdict,
    judge,
    judge_at_most,
    overall,
    power_statement,
)
from rlscale.rlvr import objectives
from rlscale.runtime.rundir import RunDirError

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


# -- the verdict, on synthetic numbers -----------------------------------------------------

def test_estimate_is_the_mean_and_its_standard_error():
    est = estimate([1.0, 2.0, 3.0])
    assert est.mean == 2.0 and est.n == 3
    assert est.se == pytest.approx(1.0 / 3 ** 0.5)  # sd 1, n 3
    assert estimate([0.5]).se is None
    with pytest.raises(ValueError):
        estimate([])
    with pytest.raises(ValueError):
        estimate([float("nan"), 1.0])


def test_judge_gives_all_three_outcomes():
    clear_rise = estimate([0.10, 0.12, 0.11, 0.13])
    assert judge(clear_rise, +1) == "supports"
    assert judge(clear_rise, -1) == "contradicts"
    noisy = estimate([0.10, -0.08, 0.05, -0.04])    # the interval straddles 0
    assert judge(noisy, +1) == "inconclusive"
    assert judge(noisy, -1) == "inconclusive"
    assert judge(estimate([0.5]), +1) == "inconclusive"        # one seed: no spread
    assert judge(estimate([0.0, 0.0]), +1) == "inconclusive"   # no effect at all
    # an effect clear of zero but below the stated minimum is not evidence either way
    tiny = estimate([0.001, 0.0011, 0.0012])
    assert judge(tiny, +1) == "supports"
    assert judge(tiny, +1, min_effect=0.01) == "inconclusive"
    # the boundary is Student's t at n - 1 df: t_3 = 3.182 at 5% two-sided for 4 seeds, and
    # 12.71 for 2 seeds (where 2 SE, the old rule, called ~30% of nulls)
    assert judge(dataclasses.replace(clear_rise, mean=0.319, se=0.1), +1) == "supports"
    assert judge(dataclasses.replace(clear_rise, mean=0.317, se=0.1), +1) == "inconclusive"
    two = estimate([0.9, 1.1])  # mean 1, SE 0.1: 10 SE, still inside t_1's interval
    assert judge(two, +1) == "inconclusive" and two.half_width() == pytest.approx(1.2706, 1e-3)
    with pytest.raises(ValueError):
        judge(clear_rise, 0)


@pytest.mark.parametrize("seeds", [2, 3, 4, 8])
def test_the_rule_calls_at_most_five_percent_of_null_effects(seeds):
    """Under no effect (normal per-seed values, any spread) the rule calls an effect, either
    way, in <= 5% of experiments; with an effect of 4 SE it calls it most of the time at
    4+ seeds. 20,000 simulated experiments each: the rate's SE is 0.15 points."""
    rng = np.random.default_rng(seeds)
    trials = 20_000
    spread = rng.uniform(0.01, 2.0, size=(trials, 1))  # every experiment its own
    null = rng.normal(0.0, 1.0, size=(trials, seeds)) * spread
    calls = sum(judge(estimate(row.tolist()), +1) != "inconclusive" for row in null)
    assert calls / trials <= 0.05 + 3 * (0.05 * 0.95 / trials) ** 0.5
    assert calls / trials >= 0.05 - 3 * (0.05 * 0.95 / trials) ** 0.5  # exact, not over-strict
    sd = 1.0
    shifted = rng.normal(4 * sd / seeds ** 0.5, sd, size=(2000, seeds))
    found = sum(judge(estimate(row.tolist()), +1) == "supports" for row in shifted) / 2000
    if seeds >= 4:
        assert found >= 0.6
    assert sum(judge(estimate(row.tolist()), +1) == "contradicts" for row in shifted) <= 2


def test_detectable_is_the_effect_found_four_times_in_five():
    """`detectable` at the true spread: an effect of that size is called ~80% of the time."""
    rng = np.random.default_rng(0)
    seeds, sd = 4, 1.0
    se = sd / seeds ** 0.5
    effect = Estimate(0.0, se, seeds).detectable()
    assert effect == pytest.approx((3.1824 + 0.9785) * se, rel=1e-3)
    rows = rng.normal(effect, sd, size=(20_000, seeds))
    found = sum(judge(estimate(r.tolist()), +1) == "supports" for r in rows) / len(rows)
    assert 0.6 <= found <= 0.85  # ~0.8 at the true SE; the estimated SE spreads it
    assert Effect("e", (0.10, 0.12, 0.11, 0.13), +1, min_effect=0.05).could_show
    assert not Effect("e", (0.10, -0.08, 0.05, -0.04), +1, min_effect=0.05).could_show
    assert not Effect("e", (0.1,), +1, min_effect=0.05).could_show  # one seed shows nothing
    # every seed the same (e.g. a behaviour that never appears): no spread to size power by
    flat = Effect("e", (0.0, 0.0, 0.0, 0.0), +1, min_effect=0.1)
    assert not flat.could_show and power_statement(flat).startswith("every seed gave the same")


def test_the_at_most_test_supports_five_percent_of_effects_at_the_margin():
    """Non-superiority: with the true effect exactly at the margin, `supports` in <= 5% of
    20,000 simulated experiments; with no effect and a small spread, nearly always; an
    effect clearly above the margin contradicts."""
    rng = np.random.default_rng(7)
    margin, seeds, trials = 0.02, 4, 20_000
    at_margin = rng.normal(margin, 0.03, size=(trials, seeds))
    supported = sum(judge_at_most(estimate(r.tolist()), margin) == "supports"
                    for r in at_margin) / trials
    assert supported <= 0.05 + 3 * (0.05 * 0.95 / trials) ** 0.5
    none = rng.normal(0.0, 0.005, size=(2000, seeds))
    assert sum(judge_at_most(estimate(r.tolist()), margin) == "supports"
               for r in none) / 2000 > 0.95
    above = Effect("e", (0.10, 0.12, 0.11, 0.13), -1, min_effect=margin, test="at_most")
    assert above.verdict == "contradicts"
    tie = Effect("e", (0.0, 0.001, -0.001, 0.0005), -1, min_effect=margin, test="at_most")
    assert tie.verdict == "supports" and tie.could_show
    assert Effect.from_dict(json.loads(json.dumps(tie.as_dict()))) == tie
    with pytest.raises(ValueError, match="positive margin"):
        judge_at_most(estimate([0.0, 0.1]), 0.0)


def test_overall_is_contradicted_by_any_and_supported_by_all():
    assert overall(["supports", "supports"]) == "supports"
    assert overall(["supports", "inconclusive"]) == "inconclusive"
    assert overall(["supports", "contradicts"]) == "contradicts"
    assert overall(["inconclusive", "contradicts"]) == "contradicts"
    with pytest.raises(ValueError):
        overall([])
    effects = [Effect("a", (0.1, 0.11, 0.12), +1),
               Effect("b", (-0.1, -0.11, -0.12), +1, primary=False)]  # reported, not counted
    assert experiment_verdict(effects) == "supports"
    round_trip = Effect.from_dict(json.loads(json.dumps(effects[1].as_dict())))
    assert round_trip == effects[1] and round_trip.verdict == "contradicts"


# -- each experiment's analysis, on synthetic numbers --------------------------------------

SEEDS = [0, 1, 2]
JITTER = (-0.004, 0.0, 0.004)  # per seed: a spread small against the effects below


def per_seed(values, jitter=JITTER):
    """The same curve for each seed, shifted by that seed's jitter."""
    if isinstance(values, int | float):
        return [values + j for j in jitter]
    return [[v + j for v in values] for j in jitter]


def pass_at_k_numbers(base, grpo, jitter=JITTER):
    curves = {"base": {s: per_seed(base, (0,) * 3) for s in pass_at_k.SPLITS},
              "grpo": {s: per_seed(grpo, jitter) for s in pass_at_k.SPLITS}}
    return {"ks": [1, 2, 4, 8], "seeds": SEEDS, "prompts": 10, "samples": 8,
            "pass_at_k": curves}


def kl_anchor_numbers(kl, entropy, jitter=JITTER):
    """kl, entropy: the figures at beta 0, 0.04, 0.2; `jitter` on the last arm's."""
    arms = {"base": {"pass@1": per_seed(0.3), "ungrammatical": per_seed(0.0),
                     "kl_to_reference": per_seed(0.0), "entropy": per_seed(0.5)}}
    for beta, k, e in zip(kl_anchor.BETAS, kl, entropy, strict=True):
        shift = jitter if beta == kl_anchor.BETAS[-1] else (0.0,) * 3
        arms[kl_anchor.label(beta)] = {
            "pass@1": per_seed(0.5), "ungrammatical": per_seed(0.02),
            "kl_to_reference": per_seed(k, shift), "entropy": per_seed(e, shift),
            "entropy_curve": per_seed([0.5, 0.4, e], shift), "steps": [1, 2, 3]}
    return {"betas": list(kl_anchor.BETAS), "seeds": SEEDS, "prompts": 10, "samples": 4,
            "arms": arms}


def clipping_numbers(kl, pass1, jitter=JITTER):
    """kl, pass1: (clip, no clip); `jitter` on the clipped arm's."""
    arms = {}
    for name, k, p in zip(clipping.ARMS, kl, pass1, strict=True):
        shift = jitter if name == "clip" else (0.0,) * 3
        means = {"policy/kl_new_old": per_seed(k, shift), "clip/frac": per_seed(0.01),
                 "ratio/max": per_seed(1.5 + 10 * k), "policy/entropy": per_seed(0.3)}
        arms[name] = {"pass@1": per_seed(p, shift), "means": means,
                      "curves": {key: [[v, v] for v in values] for key, values in means.items()},
                      "steps": {key: [1, 2] for key in means}}
    return {"seeds": SEEDS, "prompts": 10, "samples": 4, "arms": arms}


def clip_higher_numbers(entropy, jitter=JITTER):
    """entropy: (symmetric, clip-higher) means over steps; `jitter` on clip-higher's."""
    arms = {}
    for name, e, high in zip(clip_higher.ARMS, entropy, (0.02, 0.005), strict=True):
        shift = jitter if name == "clip_higher" else (0.0,) * 3
        means = {"policy/entropy": per_seed(e, shift), "clip/high_frac": per_seed(high),
                 "clip/low_frac": per_seed(0.01), "policy/kl_new_old": per_seed(0.01)}
        arms[name] = {"pass@1": per_seed(0.5), "means": means,
                      "curves": {key: [[v, v] for v in values] for key, values in means.items()},
                      "steps": {key: [1, 2] for key in means}}
    return {"seeds": SEEDS, "prompts": 10, "samples": 4, "arms": arms}


NOISE = (-0.4, 0.3, 0.1)  # per seed: a spread that swamps the effects (SE 0.21)


def staleness_numbers(drift, jitter=JITTER):
    """`drift` > 0: k = 4 trains on tokens further from pi_old than k = 0, runs faster, and
    MIS recovers 0.1 of pass@1; < 0: the opposite on every count."""
    def arm(k, kl, step_s, pass1, shift=(0.0,) * 3):
        figures = [{"behaviour_kl": kl + j, "engine_kl": 0.001, "stale_kl": kl + j,
                    "stale_share": 0.5 if k else 0.0, "lag_mean": k / 2 + j,
                    "dropped_share": 0.0, "step_s": step_s + j, "train_s": 1.0,
                    "tokens_per_s": 500.0, "busy_share": 0.5, "length_mean": 40.0, "length_max": 120.0,
                    "weight_truncated": 0.0, "weight_masked": 0.0} for j in shift]
        curves = {key: per_seed([k / 2, k / 2], shift) for key in staleness.CURVES}
        return {"pass@1": per_seed(pass1, shift), "figures": figures, "curves": curves,
                "steps": {key: [1, 2] for key in staleness.CURVES}}

    faster = 10 * drift  # seconds a step: k = 4 saves 1 s of 3 (more than the 0.5 s minimum)
    arms = {}
    for name, spec in staleness.ARMS.items():
        k, fixed = spec.k, spec.correction != "none"
        kl = 0.01 + drift * k / 4
        arms[name] = arm(k, kl, 3.0 - faster * min(k, 4) / 4,
                         0.5 if fixed or k == 0 else 0.5 - drift,
                         jitter if name == "k4" else (0.0,) * 3)
    sim = {str(k): {"lag_mean": k / 2, "dropped_share": 0.0, "step_s": 2.0} for k in (0, 4, 8)}
    return {"seeds": SEEDS, "prompts": 10, "samples": 2, "engine_dtype": "bfloat16",
            "arms": arms, "simulated": sim}


def zero_value_target_numbers(mse, noise=(0.0,) * 3):
    """mse: the value error of (z, mix 0.5, q alone); `noise` on the mix's."""
    arms = {}
    for label, m in zip(zero_value_target.MIXES, mse, strict=True):
        shift = noise if label == "mix_0.5" else (0.0,) * 3
        arms[label] = {"value_mse": per_seed(m, shift), "value_sign": per_seed(0.8),
                       "optimal_moves": per_seed(0.9 - m), "raw_lost": per_seed(m),
                       "search_lost": per_seed(m / 2), "curve": per_seed([0.1, 0.5, 0.9]),
                       "iterations": [1, 2, 3]}
    return {"seeds": SEEDS, "simulations": 8, "positions": 4520, "arms": arms}


def zero_prior_numbers(network_gain, noise=(0.0,) * 3):
    """network_gain: the network prior's optimal-move share over the uniform one's at every
    budget; `noise` on the network prior's."""
    sims = [4, 16, 64]
    uniform = [0.5, 0.7, 0.9]
    return {"seeds": SEEDS, "simulations": sims, "primary": 16, "positions": 4520, "shares": {
        "raw": per_seed([0.6]), "uniform": per_seed(uniform),
        "network": [[u + network_gain + n for u in uniform] for n in noise]}}


def grpo_vs_zero_numbers(search_gain, noise=(0.0,) * 3):
    """search_gain: AlphaZero's optimal-move share over GRPO's; `noise` on GRPO's."""
    grpo_final = [0.7 + n for n in noise]
    alphazero = {"optimal_moves": [0.7 + search_gain] * 3, "raw_lost": per_seed(0.3),
                 "evaluations": per_seed(250000.0), "games": per_seed(1024.0),
                 "trained_positions": per_seed(50000.0)}
    grpo = {"optimal_moves": grpo_final, "raw_lost": [0.3 - search_gain] * 3,
            "evaluations": per_seed(250500.0), "games": per_seed(36000.0),
            "trained_positions": per_seed(250500.0), "steps": per_seed(90.0),
            "curve": [[0.55, (0.55 + f) / 2, f] for f in grpo_final]}
    return {"seeds": SEEDS, "positions": 64, "group": 8, "score_points": 2,
            "arms": {"alphazero": alphazero, "grpo": grpo}}


def continuum_numbers(effect, noise=(0.0,) * 3):
    """effect > 0: GRPO gains `effect` more ood pass@1 than SFT and OPD ends `effect` above
    GRPO on test; < 0: the opposite; `noise` on GRPO's final figures."""
    start = {"test": 0.2, "ood": 0.06, "hard": 0.05}

    def arm(test, ood, shift, per_step):
        runs = []
        for n in shift:
            points = [{"step": 0, "generated": 0.0, "trained": 0.0, "flops": 0.0, **start}]
            for i, step in enumerate((8, 16), 1):
                points.append({"step": step, "generated": 0.0 if per_step < 2e9 else 1e4 * step,
                               "trained": 1e4 * step, "flops": per_step * step,
                               "test": 0.2 + i / 2 * (test + n - 0.2),
                               "ood": 0.06 + i / 2 * (ood + n - 0.06),
                               "hard": 0.05 + i / 2 * (test + n - 0.25)})
            runs.append(points)
        return runs

    quiet = (0.0,) * 3
    arms = {"sft": arm(0.5, 0.15, quiet, 1e9), "dft": arm(0.45, 0.15, quiet, 1e9),
            "grpo": arm(0.4, 0.15 + effect, noise, 4e9),
            "opd": arm(0.4 + effect, 0.15 + effect, quiet, 5e9)}
    return {"seeds": SEEDS, "steps": 16, "every": 8, "prompts": 10, "samples": 2,
            "sequences": 64, "parameters": {"student": 1000, "teacher": 1000},
            "prompt_tokens": 12.0, "teacher_steps": 40, "student": [start] * 3,
            "teacher": [{"test": 0.6, "ood": 0.3, "hard": 0.4}] * 3, "arms": arms}


def dynamic_sampling_numbers(pass1, jitter=JITTER):
    """pass1: the final (off, on); the eval curves end there, `on` with twice the tokens."""
    arms = {}
    for name, p, per_step in zip(dynamic_sampling.ARMS, pass1, (1000.0, 2000.0), strict=True):
        shift = jitter if name == "on" else (0.0,) * 3
        curves = [{"steps": [0, 5, 10], "tokens": [0.0, 5 * per_step, 10 * per_step],
                   "pass@1": [0.3, (0.3 + p + j) / 2, p + j]} for j in shift]
        arms[name] = {"pass@1": per_seed(p, shift), "curves": curves,
                      "tokens_per_step": per_seed(per_step), "dropped_share": per_seed(0.0),
                      "zero_advantage_share": per_seed(0.4), "batch_prompts": per_seed(16.0),
                      "seconds_per_step": per_seed(1.0),
                      "dropped_curve": per_seed([0.4, 0.3]), "steps": [1, 2]}
    return {"seeds": SEEDS, "steps": 10, "prompts": 10, "samples": 4, "eval_prompts": 10,
            "eval_samples": 2, "base_pass@1": 0.3, "arms": arms}


def ppo_critic_numbers(gap, jitter=JITTER):
    """gap > 0: GRPO ends `gap` above PPO, PPO takes 1.5x as long a step and its critic errs
    more at the start of a trace; < 0: PPO ahead, faster, and its critic worse at the end."""
    def arm(p, seconds, state, errors, shift=(0.0,) * 3):
        curves = [{"steps": [0, 5, 10], "seconds": [0.0, 5 * seconds, 10 * seconds],
                   "pass@1": [0.3, (0.3 + p + j) / 2, p + j]} for j in shift]
        return {"pass@1": per_seed(p, shift), "curves": curves,
                "seconds_per_step": per_seed(seconds, shift), "state_gib": per_seed(state),
                **{f"value_error_{t}": per_seed(e, shift)
                   for t, e in zip(ppo_critic.THIRDS, errors, strict=True)},
                "explained_variance": per_seed(0.2)}

    ppo_errors = (0.5, 0.4, 0.3) if gap > 0 else (0.3, 0.4, 0.5)
    arms = {"grpo": arm(0.5, 2.0, 0.01, (0.0, 0.0, 0.0)),
            "ppo": arm(0.5 - gap, 2.0 + 10 * gap, 0.02, ppo_errors, jitter)}
    return {"seeds": SEEDS, "steps": 10, "prompts": 10, "samples": 4, "completions": 32,
            "base_pass@1": 0.3, "arms": arms}


def curriculum_numbers(gain, jitter=JITTER):
    """gain > 0: the learnability arm ends `gain` above uniform, most on 6-term chains, and
    trains on fewer zero-advantage groups; < 0: the opposite."""
    def arm(p, zero, shift=(0.0,) * 3):
        levels = [{"2": 0.9 + j, "4": p + j, "6": p - 0.2 + j} for j in shift]
        weights = {"2": [0.2, 0.1], "4": [0.4, 0.5], "6": [0.4, 0.4]}
        return {"pass@1": per_seed(p, shift), "by_level": levels,
                "zero_advantage_share": per_seed(zero, shift), "zero_curve": per_seed([zero] * 2),
                "weights": [weights] * 3, "seconds_per_step": per_seed(2.0)}

    arms = {"uniform": arm(0.5, 0.4),
            "learnability": arm(0.5 + gain, 0.4 - gain, jitter)}
    return {"seeds": SEEDS, "steps": 10, "prompts": 10, "samples": 4, "arms": arms}


def emergence_numbers(gain, jitter=JITTER):
    """gain > 0: the primed base's completions write intermediate results on the long
    (4-6-term) chains after RL and its pass@1 there rises by `gain`, the control's by less;
    < 0: both fall."""
    def table(p, lines, shift):
        return {str(t): {"pass@1": p + shift, "intermediate": lines + shift,
                         "chained_lines": 3 * lines, "characters": 20 + 40 * lines}
                for t in (2, 3, 4, 5, 6)}

    def arm(p_after, lines_after, shift=(0.0,) * 3):
        return {"before": [table(0.05, 0.01, 0.0)] * 3,
                "after": [table(p_after, lines_after, j) for j in shift],
                "lines_curve": per_seed([0.01, lines_after]),
                "length_curve": per_seed([20.0, 20 + 40 * lines_after]),
                "line_use": [{"prompts": 10, "alone": 0.05, "after_lines": 0.9,
                              "copies_last": 0.9}] * 3}

    arms = {"control": arm(0.05 + gain / 4, 0.01),
            "primed": arm(0.05 + gain, 0.01 + 2 * gain, jitter),
            "oneline": arm(0.05 + gain, 0.01 + 2 * gain, jitter)}
    return {"seeds": SEEDS, "steps": 10, "prompts": 10, "samples": 2, "long": [4, 6],
            "arms": arms}


def checking_numbers(gain, jitter=JITTER):
    """gain > 0: after RL the checks flag `gain` more of the wrong steps and a redo fixes
    half as much more of them; < 0: both fall."""
    def model(alarm, corrected, shift):
        return {"alarm_rate": alarm + shift, "false_alarm_rate": 0.1, "checked_share": 0.5,
                "corrected_share": corrected + shift, "wrong_step_share": 0.3,
                "pass@1": 0.3 + gain / 4 + shift, "true_alarms": 10, "missed_slips": 40,
                "false_alarms": 5, "corrected": 8, "wrong_steps": 90, "checks": 200}

    never = {**model(0.0, 0.0, 0.0), "alarm_rate": 0.0, "checked_share": 0.0, "checks": 0}
    return {"seeds": SEEDS, "steps": 10, "prompts": 10, "samples": 2,
            "models": {"before": [model(0.2, 0.1, 0.0)] * 3,
                       "after": [model(0.2 + gain, 0.1 + gain / 2, j) for j in jitter],
                       "control before": [{**never, "pass@1": 0.3}] * 3,
                       "control after": [{**never, "pass@1": 0.3 + j} for j in jitter]}}


def test_checking_reports_its_never_checking_control_when_measured():
    effect = "pass@1 after GRPO: checking base - never-checking base"
    analysis = checking.analyse(checking_numbers(0.3))
    control = next(e for e in analysis.effects if e.name == effect)
    assert not control.primary and control.estimate.mean == pytest.approx(0.3 / 4)
    assert [r[0] for r in analysis.table.rows] == list(checking.STAGES)
    older = checking_numbers(0.3)  # a result saved before the control existed
    older["models"] = {k: v for k, v in older["models"].items() if not k.startswith("control")}
    analysis = checking.analyse(older)
    assert effect not in [e.name for e in analysis.effects]
    assert [r[0] for r in analysis.table.rows] == ["before", "after"]


def length_norm_numbers(wrong, jitter=JITTER):
    """wrong: the wrong completions' length per aggregation (right ones are 40 tokens);
    `jitter` (in tokens) on GRPO's 1/|y| arm."""
    figures = {"pass@1": 0.5, "mean_length": 45.0, "right_length": 40.0}
    arms = {"base": {**{k: per_seed(v) for k, v in figures.items()},
                     "wrong_length": per_seed(45.0)}}
    for name, w in zip(length_norm.AGGREGATIONS, wrong, strict=True):
        shift = jitter if name == "per_sequence" else (0.0,) * 3
        arms[name] = {**{k: per_seed(v) for k, v in figures.items()},
                      "wrong_length": per_seed(w, shift),
                      "curves": {k: per_seed([w, w] if "wrong" in k else [40.0, 40.0])
                                 for k in length_norm.CURVES},
                      "window_centres": [1.5, 3.5]}
    return {"seeds": SEEDS, "steps": 4, "prompts": 10, "samples": 4, "arms": arms}


def length_penalty_numbers(hard_gain, noise=(0.0,) * 3):
    """hard_gain: the adaptive penalty's accuracy at 4 terms over the constant one's;
    `noise` on the adaptive arm's."""
    accuracy = {"none": {"2": 0.9, "4": 0.5}, "constant": {"2": 0.9, "4": 0.4},
                "adaptive": {"2": 0.9, "4": 0.4 + hard_gain}}
    length = {"none": {"2": 30.0, "4": 80.0}, "constant": {"2": 20.0, "4": 50.0},
              "adaptive": {"2": 20.0, "4": 80.0}}
    arms = {}
    for name in length_penalty.PENALTIES:
        shift = noise if name == "adaptive" else (0.0,) * 3
        arms[name] = {"pass@1": per_seed(0.6), "mean_length": per_seed(50.0),
                      "accuracy": [{lv: v + (n if lv == "4" else 0.0)
                                    for lv, v in accuracy[name].items()} for n in shift],
                      "length": [dict(length[name]) for _ in shift],
                      "curves": {k: per_seed([50.0, 45.0]) for k in length_penalty.CURVES},
                      "window_centres": [1.5, 3.5]}
    return {"seeds": SEEDS, "steps": 4, "prompts": 10, "samples": 2, "arms": arms}


def forking_numbers(concentration, noise=(0.0,) * 3):
    """concentration: the full update's share of the change on the top 20% over random's
    (the controls: SFT and a random direction, a third of it); `noise` on the top share."""
    arms = {}
    for name in forking_tokens.LABELS:
        excess = concentration if name in forking_tokens.ARMS else abs(concentration) / 3
        arms[name] = {"pass@1": per_seed(0.5), "top_share": [0.25 + excess + n
                                                             for n in noise],
                      "random_share": per_seed(0.25), "top_entropy": per_seed(1.5),
                      "entropy": per_seed(0.4), "tokens": per_seed(5000.0),
                      "forks": [["+", 40, 90], ["=", 30, 200]],
                      "examples": ["2[+]3 = 5 | x"]}
    return {"seeds": SEEDS, "steps": 4, "prompts": 10, "samples": 2, "fork_prompts": 8,
            "fork_samples": 2, "rho": 0.2, "arms": arms}


def gspo_numbers(sequence_power, gspo_power, noise=(0.0,) * 3):
    """Variances that go as length ** power per seed (`noise` added to the powers, the
    opposite way for GSPO's)."""
    lengths = [10.0, 20.0, 40.0, 80.0]
    per_seed_ = [{"mean_length": lengths, "sequences": [8] * 4,
                  "sequence": [0.01 * n ** (sequence_power + e) for n in lengths],
                  "gspo": [0.01 * n ** (gspo_power - e) for n in lengths],
                  "token": [0.01] * 4, "kl_new_old": 0.01, "completions": 64}
                 for e in noise]
    return {"seeds": SEEDS, "steps": 2, "per_seed": per_seed_}


def baseline_variance_numbers(rloo_scale, noise=(0.0,) * 3):
    """tr Cov without a baseline 1.0, with RLOO `rloo_scale` times exp(the seed's noise)."""
    per_seed_ = []
    for e in noise:
        row = {"reward_mean": 0.3, "uniform_group_share": 0.4}
        for est, scale in (("none", 1.0), ("mean", 0.5 * rloo_scale), ("rloo", rloo_scale),
                           ("std", 2.0)):
            row[f"{est}/trace_cov"] = scale * (math.exp(e) if est == "rloo" else 1.0)
            row[f"{est}/mean_sq_norm"] = 1.1 * row[f"{est}/trace_cov"]
        per_seed_.append({str(g): dict(row) for g in baseline_variance.GROUP_SIZES})
    return {"seeds": SEEDS, "group_sizes": list(baseline_variance.GROUP_SIZES),
            "completions": 16, "batches": 4, "per_seed": per_seed_}


def tool_use_numbers(hard_gain, noise=(0.0,) * 3):
    """Five levels (2-6 terms); GRPO with tools `hard_gain` above GRPO without on 5-6 terms
    (plus the seed's noise); the calls it adds go to the hard prompts."""
    levels = ["2", "3", "4", "5", "6"]

    def figures(accuracy, calls):
        return {"pass@1": sum(accuracy) / 5, "accuracy": dict(zip(levels, accuracy, strict=True)),
                "share": {level: 0.2 for level in levels}, "calls": dict(zip(levels, calls, strict=True)),
                "calls_per_rollout": sum(calls) / 5}

    plain = [0.8, 0.6, 0.4, 0.3, 0.2]
    models = {
        "base": [figures([0.6, 0.4, 0.2, 0.1, 0.05], [0] * 5)] * 3,
        "base_tools": [figures([0.6, 0.4, 0.2, 0.1, 0.05], [0.3, 0.6, 0.9, 1.2, 1.5])] * 3,
        "grpo": [figures(plain, [0] * 5)] * 3,
        "grpo_tools": [figures([*plain[:3], *(a + hard_gain + e for a in plain[3:])],
                               [0.3, 0.8, 1.5, 2.4, 3.5]) for e in noise],
        "grpo_tools_removed": [figures([0.5, 0.3, 0.1, 0.05, 0.0], [0] * 5)] * 3}
    return {"seeds": SEEDS, "steps": 4, "prompts": 10, "samples": 2, "models": models,
            "curves": {"steps": [1, 2], "calls": [[1.0, 1.5]] * 3}}


SYNTHETIC = {
    "pass_at_k": (pass_at_k, {
        # GRPO wins at k = 1, the base catches up and passes it: the curves cross
        "supports": pass_at_k_numbers([0.2, 0.35, 0.55, 0.8], [0.5, 0.6, 0.65, 0.7]),
        # GRPO above the base at every k
        "contradicts": pass_at_k_numbers([0.2, 0.35, 0.55, 0.7], [0.5, 0.7, 0.85, 0.95]),
        "inconclusive": pass_at_k_numbers([0.2, 0.35, 0.55, 0.8], [0.5, 0.6, 0.65, 0.7],
                                          NOISE)}),
    "kl_anchor": (kl_anchor, {
        "supports": kl_anchor_numbers([0.10, 0.05, 0.02], [0.20, 0.25, 0.30]),
        "contradicts": kl_anchor_numbers([0.02, 0.05, 0.10], [0.30, 0.25, 0.20]),
        "inconclusive": kl_anchor_numbers([0.10, 0.05, 0.02], [0.20, 0.25, 0.30], NOISE)}),
    "clipping": (clipping, {
        "supports": clipping_numbers([0.01, 0.2], [0.5, 0.3]),
        "contradicts": clipping_numbers([0.2, 0.01], [0.3, 0.5]),
        "inconclusive": clipping_numbers([0.01, 0.2], [0.5, 0.3], NOISE)}),
    "clip_higher": (clip_higher, {
        "supports": clip_higher_numbers([0.10, 0.20]),
        "contradicts": clip_higher_numbers([0.20, 0.10]),
        "inconclusive": clip_higher_numbers([0.10, 0.20], NOISE)}),
    "dynamic_sampling": (dynamic_sampling, {
        "supports": dynamic_sampling_numbers([0.4, 0.5]),
        "contradicts": dynamic_sampling_numbers([0.5, 0.4]),
        "inconclusive": dynamic_sampling_numbers([0.4, 0.5], NOISE)}),
    "length_norm": (length_norm, {
        # 1/|y| lets wrong completions grow (60 tokens against 45 under the constant)
        "supports": length_norm_numbers([60.0, 46.0, 45.0]),
        "contradicts": length_norm_numbers([45.0, 46.0, 60.0]),
        "inconclusive": length_norm_numbers([60.0, 46.0, 45.0], tuple(50 * n for n in NOISE))}),
    "gspo_ratio_variance": (gspo_ratio_variance, {
        "supports": gspo_numbers(1.0, -1.0),
        "contradicts": gspo_numbers(-1.0, 1.0),
        "inconclusive": gspo_numbers(1.0, -1.0, tuple(5 * n for n in NOISE))}),
    "baseline_variance": (baseline_variance, {
        "supports": baseline_variance_numbers(0.5),
        "contradicts": baseline_variance_numbers(2.0),
        "inconclusive": baseline_variance_numbers(0.9, tuple(5 * n for n in NOISE))}),
    "tool_use": (tool_use, {
        "supports": tool_use_numbers(0.3),
        "contradicts": tool_use_numbers(-0.3),
        # 5 points on the hard part: on the right side, short of the 10-point target
        "inconclusive": tool_use_numbers(0.05)}),
    "zero_value_target": (zero_value_target, {
        "supports": zero_value_target_numbers([0.30, 0.20, 0.25]),
        "contradicts": zero_value_target_numbers([0.20, 0.30, 0.25]),
        "inconclusive": zero_value_target_numbers([0.30, 0.20, 0.25], NOISE)}),
    "zero_prior": (zero_prior, {
        "supports": zero_prior_numbers(0.1),
        "contradicts": zero_prior_numbers(-0.1),
        "inconclusive": zero_prior_numbers(0.1, NOISE)}),
    "length_penalty": (length_penalty, {
        "supports": length_penalty_numbers(0.1),
        "contradicts": length_penalty_numbers(-0.1),
        "inconclusive": length_penalty_numbers(0.1, NOISE)}),
    "forking_tokens": (forking_tokens, {
        "supports": forking_numbers(0.3),
        "contradicts": forking_numbers(-0.2),
        "inconclusive": forking_numbers(0.3, NOISE)}),
    "staleness": (staleness, {
        "supports": staleness_numbers(0.1),
        "contradicts": staleness_numbers(-0.1),
        "inconclusive": staleness_numbers(0.1, NOISE)}),
    "continuum": (continuum, {
        "supports": continuum_numbers(0.1),
        "contradicts": continuum_numbers(-0.1),
        "inconclusive": continuum_numbers(0.1, NOISE)}),
    "ppo_critic": (ppo_critic, {
        "supports": ppo_critic_numbers(0.1),
        "contradicts": ppo_critic_numbers(-0.1),
        "inconclusive": ppo_critic_numbers(0.1, NOISE)}),
    "curriculum": (curriculum, {
        "supports": curriculum_numbers(0.1),
        "contradicts": curriculum_numbers(-0.1),
        "inconclusive": curriculum_numbers(0.1, NOISE)}),
    "emergence": (emergence, {
        "supports": emergence_numbers(0.25),
        "contradicts": emergence_numbers(-0.1),
        "inconclusive": emergence_numbers(0.25, NOISE)}),
    "checking": (checking, {
        "supports": checking_numbers(0.3),
        "contradicts": checking_numbers(-0.15),
        "inconclusive": checking_numbers(0.3, NOISE)}),
    "grpo_vs_zero": (grpo_vs_zero, {
        "supports": grpo_vs_zero_numbers(0.1),
        "contradicts": grpo_vs_zero_numbers(-0.1),
        "inconclusive": grpo_vs_zero_numbers(0.1, NOISE)}),
}


@pytest.mark.parametrize("name", list(SYNTHETIC))
def test_each_analysis_gives_all_three_verdicts(name, tmp_path):
    module, cases = SYNTHETIC[name]
    for expected, numbers in cases.items():
        analysis = module.analyse(numbers)
        assert experiment_verdict(analysis.effects) == expected, (name, expected, [
            (e.name, e.per_seed, e.verdict) for e in analysis.effects])
        assert analysis.table.rows and all(len(r) == len(analysis.table.columns)
                                           for r in analysis.table.rows)
    module.plot(cases["supports"], tmp_path / "figure.png")  # three seeds: bands and error bars
    assert (tmp_path / "figure.png").read_bytes().startswith(PNG)


def test_a_uniform_prior_keeps_the_values():
    def evaluate(planes):
        return np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]]), np.array([0.5, -0.25])

    priors, values = zero_prior.uniform_prior(evaluate)(np.zeros((2, 1)))
    np.testing.assert_allclose(priors, 1 / 3)
    np.testing.assert_allclose(values, [0.5, -0.25])


def test_forking_measures_share_the_change_and_mark_the_forks():
    from rlscale.experiments.measure import forking_tokens as forks_of
    from rlscale.experiments.measure import random_mask_shares

    change = torch.tensor([[4.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True, True], [True, True, False, False]])
    shares = random_mask_shares(change, mask, size=3, draws=400, seed=0)
    assert all(s in (0.0, 1.0) for s in shares)
    assert np.mean(shares) == pytest.approx(3 / 6, abs=0.06)  # 3 of the 6 active tokens

    class Chars:  # a tokenizer whose ids are character codes
        def decode(self, ids):
            return "".join(chr(i) for i in ids)

    ids = torch.tensor([[ord(c) for c in "2+3="], [ord(c) for c in "4+xx"]])
    top = torch.tensor([[False, True, False, False], [False, True, False, False]])
    forks, marked = forks_of(Chars(), ids, mask, top, most=5)
    assert forks == [("+", 2, 2)]
    assert marked == ["2[+]3=", "4[+]"]


def test_pass_at_k_crossing():
    ks = [1, 2, 4, 8]
    assert pass_at_k.crossing(ks, [0.2, 0.4, 0.6, 0.9], [0.5, 0.6, 0.65, 0.8]) == 8
    assert pass_at_k.crossing(ks, [0.2, 0.4, 0.6, 0.7], [0.5, 0.6, 0.65, 0.8]) is None
    assert pass_at_k.crossing(ks, [0.5, 0.6, 0.7, 0.9], [0.4, 0.6, 0.7, 0.9]) is None  # never led
    assert pass_at_k.ks_up_to(256) == (1, 2, 4, 8, 16, 32, 64, 128, 256)
    assert pass_at_k.ks_up_to(48) == (1, 2, 4, 8, 16, 32)


def test_dynamic_sampling_curves_against_tokens():
    rows = [{"step": 1, "sampling/generated_tokens": 100}, {"step": 2, "sampling/generated_tokens": 50,
             "eval/pass@1": 0.4}, {"step": 3, "sampling/generated_tokens": 70},
            {"step": 4, "sampling/generated_tokens": 80, "eval/pass@1": 0.5}]
    assert dynamic_sampling.eval_curve(rows, 0.3) == {
        "steps": [0, 2, 4], "tokens": [0.0, 150.0, 300.0], "pass@1": [0.3, 0.4, 0.5]}
    xs, ys = [0.0, 100.0, 300.0], [0.2, 0.4, 0.8]
    assert dynamic_sampling.interpolate(50.0, xs, ys) == pytest.approx(0.3)
    assert dynamic_sampling.interpolate(200.0, xs, ys) == pytest.approx(0.6)
    assert dynamic_sampling.interpolate(500.0, xs, ys) == 0.8  # past the end: the last value
    numbers = dynamic_sampling_numbers([0.4, 0.5])
    off, on = dynamic_sampling.at_equal_tokens(numbers)
    # off ends at 10,000 tokens; on (2,000 a step) passed them at step 5, halfway up
    assert off == pytest.approx([0.4] * 3)
    assert on == pytest.approx([(0.3 + 0.5 + j) / 2 for j in JITTER])


def test_continuum_counts_compute_per_method():
    rows = [{"step": 1, "sft/prompt_tokens": 100, "sft/target_tokens": 300},
            {"step": 2, "sft/prompt_tokens": 100, "sft/target_tokens": 100}]
    sft = continuum.compute_curve(rows, supervised=True, teacher_scores=False, params=10,
                                  teacher_params=99, prompt_tokens=5, sequences=4)
    assert sft[2] == continuum.Compute(generated=0.0, trained=600.0, flops=6 * 10 * 600)
    rl = [{"step": 1, "length/mean": 20.0}, {"step": 2, "length/mean": 10.0}]
    grpo = continuum.compute_curve(rl, supervised=False, teacher_scores=False, params=10,
                                   teacher_params=99, prompt_tokens=5, sequences=4)
    positions = 4 * 5 * 2 + 4 * 30  # prompts of both steps, then 120 completion tokens
    assert grpo[0] == continuum.Compute(0.0, 0.0, 0.0)
    assert grpo[2] == continuum.Compute(generated=120.0, trained=positions, flops=8 * 10 * positions)
    opd = continuum.compute_curve(rl, supervised=False, teacher_scores=True, params=10,
                                  teacher_params=99, prompt_tokens=5, sequences=4)
    assert opd[2].flops == grpo[2].flops + 2 * 99 * positions


def test_continuum_arms_share_batch_and_learning_rate():
    sft, dft, opd, grpo = continuum.arms("full")
    assert isinstance(sft, SFTArm) and "batch_size=128" in sft.overrides
    assert "lr=0.0001" in sft.overrides and "loss=dft" in dft.overrides
    assert opd.teacher is not None and "objective=opd" in opd.overrides
    assert grpo.teacher is None and "train.steps=48" in grpo.overrides


def test_tables_escape_pipes_in_cells():
    from rlscale.experiments.record import Table

    assert Table(["effect"], [["GRPO 1/|y|"]]).markdown().splitlines()[-1] == "| GRPO 1/\\|y\\| |"


def test_windowed_means_fill_windows_without_a_value():
    rows = [{"step": 1, "x": 1.0}, {"step": 2, "x": 3.0}, {"step": 5, "x": 7.0}, {"step": 6}]
    assert windowed(rows, "x", 6, 2) == ([1.5, 3.5, 5.5], [2.0, 2.0, 7.0])
    assert windowed(rows, "x", 5, 2) == ([1.5, 3.5, 5.0], [2.0, 2.0, 7.0])
    assert windowed([{"step": 3, "x": 4.0}], "x", 4, 2) == ([1.5, 3.5], [4.0, 4.0])


def test_shared_arm_builders_and_per_seed_figures():
    from rlscale.experiments.setup import Arm, ZeroArm
    from rlscale.experiments.spec import ZeroBudget, grpo_arms, zero_arms
    from rlscale.experiments.stats import by_seed

    assert grpo_arms(5, {"a": ("x=1",), "b": ()}, "lr=2") == [
        Arm("a", ("train.steps=5", "lr=2", "x=1")), Arm("b", ("train.steps=5", "lr=2"))]
    budget = ZeroBudget(iterations=3, overrides=("y=1",))
    assert zero_arms("c.yaml", budget) == [ZeroArm("alphazero", "c.yaml",
                                                   ("train.iterations=3", "y=1"))]
    assert zero_arms("c.yaml", budget, {"m": ("z=0",)})[0].overrides == (
        "train.iterations=3", "y=1", "z=0")
    assert by_seed([{"p": 0.1, "n": 3}, {"p": 0.2, "n": 4}]) == {"p": [0.1, 0.2], "n": [3, 4]}


def test_gspo_buckets_and_slopes():
    assert gspo_ratio_variance.bucket_edges(list(range(1, 9))) == [2, 4, 6, 8]
    assert gspo_ratio_variance.bucket_edges([5] * 8) == [5]  # one length: one bucket
    assert gspo_ratio_variance.slope([10.0, 20.0, 40.0], [1.0, 2.0, 4.0]) == pytest.approx(1.0)
    assert gspo_ratio_variance.slope([10.0, 100.0], [1.0, 0.01]) == pytest.approx(-2.0)
    import torch

    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    delta = torch.tensor([[0.1, 0.3, 5.0], [0.2, 0.2, -0.1]])  # padding ignored
    ratios = gspo_ratio_variance.step_log_ratios(delta, torch.zeros(2, 3), mask)
    assert ratios["lengths"] == [2.0, 3.0]
    assert ratios["sequence"] == pytest.approx([0.4, 0.3], abs=1e-6)
    assert ratios["gspo"] == pytest.approx([0.2, 0.1], abs=1e-6)
    assert ratios["token"] == pytest.approx([0.1, 0.3, 0.2, 0.2, -0.1], abs=1e-6)
    assert ratios["token_lengths"] == [2.0, 2.0, 3.0, 3.0, 3.0]


def test_baseline_variance_moments_are_the_trace_of_the_covariance():
    import torch

    grads = torch.randn(6, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    moments = baseline_variance.Moments()
    for g in grads:
        moments.add(g)
    assert moments.trace_covariance() == pytest.approx(float(grads.var(dim=0).sum()))
    assert moments.mean_squared_norm() == pytest.approx(float((grads ** 2).sum(1).mean()))
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    advantages = {e: fn(rewards, 2) for e, fn in baseline_variance.ESTIMATORS.items()}
    assert advantages["none"].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert advantages["mean"].tolist() == [0.5, -0.5, 0.0, 0.0]
    assert advantages["rloo"].tolist() == [1.0, -1.0, 0.0, 0.0]


# -- the loop's figure the clipping experiment reads ----------------------------------------

def test_post_update_kl_is_kl_of_old_to_new_on_old_samples(tiny_model_dir):
    """`policy/kl_new_old`: with samples from pi_old, k3 with the ratio new/old estimates
    KL(old || new). One token whose old probability was twice the new one gives
    1/2 - 1 - log(1/2) = 0.193 nats, not 2 - 1 - log 2 = 0.307 (the ratio the wrong way)."""
    import math

    import torch

    from rlscale.rlvr.batch import build_policy_batch
    from rlscale.rlvr.config import TrainConfig
    from rlscale.rlvr.model import load_model
    from rlscale.rlvr.step_loss import StepLoss
    from rlscale.rlvr.trainer import PolicyTrainer, StepResult

    model, _ = load_model(tiny_model_dir)
    trainer = PolicyTrainer(model, None, StepLoss(objectives.PRESETS["grpo"]),
                            TrainConfig(lr=1e-3, grad_clip=1.0), temperature=1.0)
    mask = torch.zeros(2, 3)
    mask[0, 0] = 1.0
    batch = build_policy_batch([[5, 6], [7, 8]], torch.tensor([[9, 10, 11], [12, 13, 14]]), mask,
                               torch.zeros(2), torch.zeros(2, 3), pad_token_id=0, policy_version=0)
    now = trainer.score_logprobs(model, batch)
    before = StepResult({}, now + math.log(2.0), torch.zeros_like(mask))
    stats = trainer.update_stats(batch, before)
    assert stats["policy/kl_new_old"] == pytest.approx(0.5 - 1 - math.log(0.5), rel=1e-4)
    assert "kl/reference" not in stats  # no reference, no LoRA: nothing to compare with
    # `kl/reference`: KL(pi_old || reference) on pi_old's samples, here the model itself
    reference, _ = load_model(tiny_model_dir)
    trainer.reference = reference
    stats = trainer.update_stats(batch, before)
    assert stats["kl/reference"] == pytest.approx(0.5 - 1 + math.log(2.0), rel=1e-4)


def test_every_run_logs_the_ratio_spread_and_kl_to_the_reference(tiny_model_dir, tmp_path):
    """The figures the experiments read, logged by the loop itself: at kl_coef 0 the KL to
    the reference (the starting model) still appears on the post-update steps, 0 at the
    first (pi_old is the start) and above 0 after; with 2 epochs the ratios leave 1. (A
    fresh model earns no reward: on-policy distillation from another fresh model gives
    every token an advantage, so the policy moves.)"""
    from rlscale.config import load_config
    from rlscale.experiments.setup import CONFIGS
    from rlscale.rlvr.config import RLVRConfig
    from rlscale.rlvr.loop import train
    from rlscale.rlvr.model import init_model
    from rlscale.runtime.metrics import read_metrics

    teacher = init_model("tiny", tmp_path / "teacher", seed=1)
    cfg = load_config(RLVRConfig, CONFIGS / "quickstart.yaml", [
        f"model.path={tiny_model_dir}", f"run_dir={tmp_path / 'run'}", "train.steps=3",
        "objective=opd", f"teacher.path={teacher}",
        "rollout.prompts_per_step=4", "rollout.group_size=4", "train.epochs=2",
        "train.minibatches=2", "train.lr=1e-3", "train.post_update_stats_every=1",
        "eval.every=0", "checkpoint.every=0", "progress=false", "tensorboard=false"])
    assert cfg.loss.kl_coef == 0.0
    train(cfg)
    rows = [r for r in read_metrics(tmp_path / "run") if "step" in r]
    assert [r["kl/reference"] == 0.0 for r in rows] == [True, False, False]
    assert all(r["kl/reference"] >= 0.0 for r in rows)
    assert all(r["ratio/token_log_var"] > 0.0 and r["ratio/sequence_log_var"] > 0.0
               for r in rows)


# -- the command line ------------------------------------------------------------------------

def test_list_shows_every_experiment_with_its_claim():
    result = CliRunner().invoke(app, ["experiments", "list"])
    assert result.exit_code == 0, result.output
    for name, experiment in EXPERIMENTS.items():
        assert name in result.stdout
        assert experiment.claim in result.stdout
    assert {"pass_at_k", "kl_anchor", "clipping"} <= set(EXPERIMENTS)


def test_run_refuses_an_unknown_experiment_in_one_line():
    result = CliRunner().invoke(app, ["experiments", "run", "no_such_claim", "--quick"])
    assert result.exit_code == 2
    assert result.stderr.strip().startswith("error: unknown experiment 'no_such_claim'")


def test_command_names_relative_paths_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert command("clipping", quick=True, seeds=1, out=tmp_path / "runs/experiments-quick",
                   base=None) == "rlscale experiments run clipping --quick"
    assert command("kl_anchor", quick=False, seeds=3, out=tmp_path / "elsewhere",
                   base=tmp_path / "runs/reasoning/base") == (
        "rlscale experiments run kl_anchor --seeds 3 --out elsewhere --base runs/reasoning/base")
    outside = command("kl_anchor", quick=False, seeds=4, out=tmp_path.parent / "x", base=None)
    assert outside == "rlscale experiments run kl_anchor"


# -- every experiment in quick mode, through the library's loop ----------------------------

@pytest.fixture(scope="module")
def experiments_root(tmp_path_factory):
    """One experiments folder with its quick base model, shared by the quick runs."""
    root = tmp_path_factory.mktemp("experiments")
    t0 = time.perf_counter()
    with every_core():
        base_model(root, QUICK, progress=False)
    print(f"quick base model: {time.perf_counter() - t0:.0f}s")
    return root


def test_a_base_built_with_another_config_is_refused(experiments_root):
    other = dataclasses.replace(QUICK, sft=(*QUICK.sft, "lr=1e-3"))
    with pytest.raises(RunDirError, match="another config"):
        base_model(experiments_root, other, progress=False)
    assert base_model(experiments_root, QUICK, progress=False) == experiments_root / "base" / "model"


def test_a_base_recorded_before_a_field_was_added_is_reused(experiments_root):
    """A config field added since the base was built compares as its default: the base is
    reused, not refused (data.documents joined SFTConfig after bases were built)."""
    recorded = experiments_root / "base" / "config.yaml"
    text = recorded.read_text()
    config = yaml.safe_load(text)
    del config["data"]["documents"]
    try:
        recorded.write_text(yaml.safe_dump(config))
        assert base_model(experiments_root, QUICK, progress=False) == \
            experiments_root / "base" / "model"
    finally:
        recorded.write_text(text)


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_each_experiment_runs_quick_with_a_figure_and_a_verdict(name, experiments_root,
                                                                 all_cores):
    t0 = time.perf_counter()
    result = run_experiment(name, quick=True, out=experiments_root, progress=False)
    seconds = time.perf_counter() - t0
    print(f"{name} quick: {seconds:.0f}s, verdict {result.verdict}")
    folder = experiments_root / name
    assert (folder / FIGURE_NAME).read_bytes().startswith(PNG)
    saved = load_result(folder)
    assert saved == result
    assert saved.verdict in VERDICTS and saved.budget == "quick" and saved.seeds == [0]
    assert "torch" in saved.machine  # where it ran, beside its figures
    assert set(saved.compute_dtype.split(", ")) <= {"", "float32", "bfloat16"}
    assert any(e.primary for e in saved.analysis.effects)
    assert all(len(e.per_seed) == 1 for e in saved.analysis.effects)
    assert saved.verdict == "inconclusive"  # one seed never decides
    assert saved.command.startswith(f"rlscale experiments run {name} --quick")
    for arm in saved.arms:  # trained by the library's loop: its run directory and metrics
        final = folder / arm.run_dir / "final"  # a HF model (RLVR) or a Zero model
        assert (final / "config.json").is_file() or (final / "model.json").is_file()
        assert (folder / arm.run_dir / "metrics.jsonl").is_file()
    assert json.loads((folder / "measurements.json").read_text())["seeds"] == [0]


def test_a_rerun_reuses_finished_arms(experiments_root):
    if load_result(experiments_root / "clipping") is None:
        run_experiment("clipping", quick=True, out=experiments_root, progress=False)
    metrics = experiments_root / "clipping" / "arms" / "clip_s0" / "metrics.jsonl"
    before = metrics.stat().st_mtime_ns
    result = run_experiment("clipping", quick=True, out=experiments_root, progress=False)
    assert metrics.stat().st_mtime_ns == before
    assert load_result(experiments_root / "clipping") == result
    assert result.reused_runs == len(result.arms) > 0  # its minutes are not the experiment's
    assert f"which reused {len(result.arms)} of {len(result.arms)} arm runs" in \
        section("clipping", result, None)
    # an arm changed since it was trained is refused, with the experiments' own flags
    ctx = Context(out=experiments_root / "clipping", scale=QUICK, seeds=(0,),
                  base=experiments_root / "base" / "model", progress=False)
    changed = clipping.arms("quick")[0]
    changed = dataclasses.replace(changed, overrides=(*changed.overrides, "train.lr=2e-4"))
    with pytest.raises(RunDirError, match="cannot be reused.*train.lr.*--overwrite"):
        train_arm(ctx, changed, 0)
    assert metrics.stat().st_mtime_ns == before


def test_an_sft_arm_is_reused_or_refused_like_an_rl_arm(experiments_root):
    ctx = Context(out=experiments_root / "sft_arm", scale=QUICK, seeds=(0,),
                  base=experiments_root / "base" / "model", progress=False)
    arm = SFTArm("sft", ("steps=2", "batch_size=8", "data.examples=16", "save_every=1"))
    first = train_sft_arm(ctx, arm, 0)
    assert (first.final / "config.json").is_file()
    assert [p.name for p in first.run_dir.joinpath("checkpoints").iterdir()] == ["step_000001"]
    weights = first.final / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert train_sft_arm(ctx, arm, 0) == first and weights.stat().st_mtime_ns == before
    changed = dataclasses.replace(arm, overrides=(*arm.overrides, "lr=1e-5"))
    with pytest.raises(RunDirError, match="cannot be reused.*lr.*--overwrite"):
        train_sft_arm(ctx, changed, 0)
    assert weights.stat().st_mtime_ns == before


def test_report_writes_every_experiment(experiments_root, tmp_path):
    for name in EXPERIMENTS:
        if load_result(experiments_root / name) is None:
            run_experiment(name, quick=True, out=experiments_root, progress=False)
    out = tmp_path / "docs" / "experiments.md"
    result = CliRunner().invoke(app, ["experiments", "report", "--runs", str(experiments_root),
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    for name, experiment in EXPERIMENTS.items():
        saved = load_result(experiments_root / name)
        assert f"## {name}" in text and experiment.claim in text
        assert f"**Verdict: {saved.verdict}**" in text
        assert f"![{name}](experiments/{name}.png)" in text
        assert (out.parent / "experiments" / f"{name}.png").read_bytes().startswith(PNG)
        assert saved.command in text
        assert saved.analysis.table.columns[0] in text
    assert "Quick budget" in text
    assert str(tmp_path) not in text and str(experiments_root) not in text  # relative paths only


def test_report_lists_unmeasured_experiments_with_their_command(tmp_path):
    out = write_report(tmp_path / "nothing", tmp_path / "experiments.md")
    text = out.read_text()
    for name in EXPERIMENTS:
        assert f"rlscale experiments run {name}\n" in text
    assert text.count("No saved result, so no verdict") == len(EXPERIMENTS)
    assert "**Verdict:" not in text


def test_staleness_simulator_is_fitted_to_the_fresh_arm():
    k0 = {"length_mean": 40.0, "length_max": 160.0, "tokens_per_s": 400.0, "busy_share": 0.5,
          "train_s": 2.56}
    cfg = staleness.simulator_config(k0, steps=6, prompts_per_step=8, group_size=4,
                                     max_new_tokens=256, slots=64)
    assert cfg.trainer.step_per_token_s == pytest.approx(2.56 / (8 * 4 * 40))
    assert cfg.inference.decode_per_slot_s == pytest.approx(1 / 800)
    assert cfg.workload.response.sigma == pytest.approx(math.log(4) / 2)
    predicted = staleness.predictions(cfg)
    assert set(predicted) == {"0", "4", "8"}
    assert predicted["0"]["lag_mean"] == 0.0  # k = 0: every trained token is fresh
    assert predicted["8"]["lag_mean"] >= predicted["4"]["lag_mean"] > 0.0
    assert predicted["4"]["step_s"] <= predicted["0"]["step_s"]


def test_staleness_behaviour_kl_weighs_fresh_and_lagged_tokens():
    row = {"behaviour/stale_token_share": 0.25, "behaviour/engine_kl": 0.01,
           "behaviour/stale_kl": 0.05}
    assert staleness.behaviour_kl(row) == pytest.approx(0.75 * 0.01 + 0.25 * 0.05)
    assert staleness.behaviour_kl({"behaviour/stale_token_share": 0.0,
                                   "behaviour/engine_kl": 0.02}) == pytest.approx(0.02)
    assert staleness.behaviour_kl({"loss/policy": 1.0}) is None


def test_report_reads_saved_results_and_refuses_sections_without_one(tmp_path):
    """A fresh clone has no runs: a result saved beside the report is read back. A section
    the report already had for an experiment with no saved result is not carried forward:
    it loses its verdict, and the change is listed against the previous report."""
    from rlscale.experiments.record import Analysis, ExperimentResult, Table

    out = tmp_path / "docs" / "experiments.md"
    effect = Effect("an effect", (0.1, 0.12, 0.11, 0.13), expected_sign=+1, min_effect=0.05)
    saved = ExperimentResult(
        name="staleness", claim=staleness.CLAIM, setup="s", budget="full", seeds=[0, 1, 2, 3],
        command="rlscale experiments run staleness", arms=[],
        analysis=Analysis([effect], Table(["a"], [["1"]]), ["a note"]), figure="figure.png",
        seconds=60.0, date="2026-12-03")
    (out.parent / "experiments").mkdir(parents=True)
    (out.parent / "experiments" / "staleness.json").write_text(json.dumps(saved.as_dict()))
    old_row = "| [clipping](#clipping) | the claim | supports (full, 2 seeds) |"
    old_section = "## clipping\n\n**Claim.** the claim\n\n**Verdict: supports** (measured 2026-12-03)"
    stale_row = "| [staleness](#staleness) | the claim | contradicts (full, 2 seeds) |"
    previous = tmp_path / "old.md"
    previous.write_text(f"# old\n\n| experiment | claim | verdict |\n| --- | --- | --- |\n"
                        f"{old_row}\n{stale_row}\n\n{old_section}\n\n## staleness\n\n"
                        f"**Set-up.** an older set-up\n")
    out.write_text(previous.read_text())
    text = write_report(tmp_path / "no_runs", out, previous).read_text()
    assert old_section not in text and old_row not in text         # never carried forward
    assert "**Verdict: supports** (4 seeds, full budget" in text    # staleness, from its json
    assert "| [staleness](#staleness) | **supports** (full) | 4 |" in text and "a note" in text
    assert text.count("**Verdict:") == 1
    assert text.count("No saved result, so no verdict") == len(EXPERIMENTS) - 1
    assert text.index("## clipping") < text.index("## staleness")  # registry order
    changes = text.split("### Verdicts changed", 1)[1].split("\n## ", 1)[0]
    assert ("| [clipping](#clipping) | supports (full, 2 seeds) | no saved result |" in changes)
    staleness_change = next(line for line in changes.splitlines() if "[staleness]" in line)
    assert "verdict rule" in staleness_change and "2 seeds -> 4 seeds" in staleness_change
    assert "set-up redesigned" in staleness_change


def test_every_primary_effect_states_its_minimum():
    """A primary effect's `min_effect` is part of its spec, fixed before any run."""
    for name, (module, cases) in SYNTHETIC.items():
        for effect in module.analyse(cases["supports"]).effects:
            assert not effect.primary or effect.min_effect > 0, (name, effect.name)


def test_only_experiments_with_an_arm_on_the_shared_base_build_it():
    from rlscale.experiments.registry import EXPERIMENTS
    from rlscale.experiments.runner import uses_shared_base

    def uses(name):
        return uses_shared_base(EXPERIMENTS[name], EXPERIMENTS[name].arms("quick"))

    assert uses("clipping") and uses("tool_use")  # tool_use's plain arm starts from OUT/base
    assert not uses("checking") and not uses("emergence")  # every arm has a base of its own
    assert uses("baseline_variance")  # no arms: it measures the base itself
    assert not uses("zero_elo")


def test_arms_trained_at_once_are_the_runs_trained_one_at_a_time(experiments_root, monkeypatch):
    """--jobs 2: checking's two arms, each from a base of its own (built first, here), train
    in two worker processes and end at the weights one process reaches. (Not tool_use: its
    arms let the calculator's answers return while other rows decode, without
    rollout.tools.reproducible, so its runs are not bit-exact.)"""
    from safetensors.torch import load_file

    from rlscale.experiments.parallel import train_arms_at_once
    from rlscale.experiments.setup import train_arms

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the workers' threads, and this process's
    torch.set_num_threads(1)
    arms = checking.arms("quick")
    # beside the quick runs: the bases checking's quick run built are reused
    contexts = [Context(out=experiments_root / f"checking-{name}", scale=QUICK, seeds=(0,),
                        base=experiments_root / "base" / "model", progress=False)
                for name in ("serial", "parallel")]
    serial = train_arms(contexts[0], arms)
    parallel = train_arms_at_once(contexts[1], arms, jobs=2)
    assert list(parallel) == [arm.label for arm in arms]
    for label in parallel:
        (one,), (other,) = serial[label], parallel[label]
        assert other.run_dir.is_relative_to(contexts[1].out) and other.seed == 0
        a, b = (load_file(run.final / "model.safetensors") for run in (one, other))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), label
    with pytest.raises(ValueError, match="--jobs must be at least 1"):
        train_arms_at_once(contexts[1], arms, jobs=0)


def test_a_run_that_fails_among_runs_at_once_stops_the_experiment(tmp_path):
    from rlscale.experiments.parallel import train_arms_at_once, worker_threads
    from rlscale.experiments.setup import ZeroArm

    ctx = Context(out=tmp_path / "x", scale=QUICK, seeds=(0, 1), base=None, progress=False)
    broken = ZeroArm("broken", "tictactoe.yaml", ("train.no_such_key=1",))
    with pytest.raises(Exception, match="no_such_key"):
        train_arms_at_once(ctx, [broken], jobs=2)
    assert worker_threads(4, cores=16) == 4 and worker_threads(3, cores=2) == 1


def test_measurements_judged_at_once_come_back_in_order_from_worker_processes(
        tmp_path, monkeypatch):
    """--jobs 2: an experiment's per-seed measurements run in two worker processes with the
    worker's share of threads and come back in the items' order; with --jobs 1 they run here;
    a judgement's error reaches the caller."""
    from judges import where_judged
    from rlscale.experiments.parallel import judge_at_once

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    ctx = Context(out=tmp_path / "x", scale=QUICK, seeds=(0,), base=None, progress=False,
                  jobs=2, threads=1)
    judged = judge_at_once(ctx, where_judged, [3, 1, 2, 5])
    assert [item for item, _, _ in judged] == [3, 1, 2, 5]
    assert {pid for _, pid, _ in judged} - {os.getpid()} == {pid for _, pid, _ in judged}
    assert {threads for _, _, threads in judged} == {1}
    here = judge_at_once(dataclasses.replace(ctx, jobs=1, threads=0), where_judged, [4, 2])
    assert [(item, pid) for item, pid, _ in here] == [(4, os.getpid()), (2, os.getpid())]
    with pytest.raises(ValueError, match="cannot judge item -1"):
        judge_at_once(ctx, where_judged, [1, -1, 2])


def test_judgements_are_kept_as_they_come_back_and_a_rerun_loads_them(tmp_path):
    """`saved_as`: each judgement is written under OUT/judged/ as it comes back, so a rerun
    (after a kill, or a failure in another item) loads it instead of judging it again;
    --overwrite judges everything again."""
    from judges import where_judged
    from rlscale.experiments.parallel import JUDGED_DIR, judge_at_once

    ctx = Context(out=tmp_path / "x", scale=QUICK, seeds=(0,), base=None, progress=False,
                  jobs=2, threads=1)

    def name(item: int) -> str:
        return f"item{item}"

    first = judge_at_once(ctx, where_judged, [3, 1, 2], saved_as=name)
    assert sorted(p.name for p in (ctx.out / JUDGED_DIR).iterdir()) == [
        "item1.json", "item2.json", "item3.json"]
    assert os.getpid() not in {pid for _, pid, _ in first}  # judged in the workers
    again = judge_at_once(ctx, where_judged, [3, 1, 2, 4], saved_as=name)
    assert again[:3] == [list(j) for j in first]  # loaded: the first run's worker pids
    assert tuple(again[3][:2]) == (4, os.getpid())  # the one left: judged here
    redone = judge_at_once(dataclasses.replace(ctx, jobs=1, threads=0, overwrite=True),
                           where_judged, [3, 1], saved_as=name)
    assert [pid for _, pid, _ in redone] == [os.getpid()] * 2
    with pytest.raises(ValueError, match="cannot judge item -1"):
        judge_at_once(dataclasses.replace(ctx, jobs=1, threads=0), where_judged, [5, -1],
                      saved_as=name)
    assert json.loads((ctx.out / JUDGED_DIR / "item5.json").read_text())[0] == 5
    assert not list((ctx.out / JUDGED_DIR).glob(".*tmp*"))


def test_the_progress_line_says_where_each_run_in_flight_is(tmp_path):
    """Every PROGRESS_SECONDS `--jobs` prints how far each run in flight is: its last step
    of the ones its config asks for (RLVR `train.steps`, Zero `train.iterations`, SFT
    `steps`); a metrics line still being written is skipped. In flight is a run whose
    folder a live process on this host holds: a run queued behind the others (its earlier,
    killed run's lock stale) is not listed, though a process pool calls it running."""
    from rlscale.experiments.parallel import in_flight_line, run_progress

    ctx = Context(out=tmp_path / "x", scale=QUICK, seeds=(0, 1), base=None, progress=False)
    zero, rlvr = ctx.out / "arms" / "recipe_s0", ctx.out / "arms" / "grpo_s1"
    zero.mkdir(parents=True)
    rlvr.mkdir(parents=True)
    (zero / "config.yaml").write_text(yaml.safe_dump({"train": {"iterations": 48}}))
    (zero / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n"
                                                for s in (1, 2, 3)) + '{"step": 4, "lo')
    (rlvr / "config.yaml").write_text(yaml.safe_dump({"train": {"steps": 100, "seed": 1}}))
    assert run_progress(zero) == "step 3/48" and run_progress(rlvr) == "starting"
    sft = ctx.out / "arms" / "sft_s0"
    sft.mkdir()
    (sft / "config.yaml").write_text(yaml.safe_dump({"steps": 30}))
    (sft / "metrics.jsonl").write_text(json.dumps({"step": 7}) + "\n")
    assert run_progress(sft) == "step 7/30"
    me = f"{socket.gethostname()} {os.getpid()}\n"
    for run in (zero, rlvr):
        (run / ".lock").write_text(me)
    # queued: sft has metrics from an earlier, interrupted run and a dead process's lock
    gone = subprocess.Popen(["true"])
    gone.wait()
    (sft / ".lock").write_text(f"{socket.gethostname()} {gone.pid}\n")
    line = in_flight_line(ctx, [("recipe", 0), ("grpo", 1), ("sft", 0)], done=2, total=8)
    assert line == ("2/8 runs trained; in flight: recipe seed 0: step 3/48; "
                    "grpo seed 1: starting")
    (zero / ".lock").unlink()
    (rlvr / ".lock").write_text(f"another-host {os.getpid()}\n")
    assert in_flight_line(ctx, [("recipe", 0), ("grpo", 1), ("sft", 0)], done=2,
                          total=8) == "2/8 runs trained; in flight: none"


def test_runs_trained_at_once_get_their_share_of_the_cores(tmp_path):
    """A Zero config names its threads (connect4: 2): under --jobs a run gets at most its
    worker's share, and a config that asks for fewer keeps them."""
    from rlscale.experiments.setup import ZeroArm, zero_arm_config

    ctx = Context(out=tmp_path / "x", scale=QUICK, seeds=(0,), base=None, progress=False)
    connect4, go9 = ZeroArm("a", "connect4.yaml", ()), ZeroArm("b", "go9_grow.yaml", ())
    assert zero_arm_config(ctx, connect4, 0).train.threads == 2
    shared = dataclasses.replace(ctx, threads=1)
    assert zero_arm_config(shared, connect4, 0).train.threads == 1
    assert zero_arm_config(dataclasses.replace(ctx, threads=2), go9, 3).train.threads == 1
    cfg = zero_arm_config(shared, connect4, 3)
    assert cfg.train.seed == 3 and cfg.out == str(tmp_path / "x" / "arms" / "a_s3")
