"""The Zero experiments zero_compute, zero_elo and grpo_vs_zero_connect4: their analyses on
synthetic numbers give each verdict, their figures draw, and their small helpers compute what
they say. (The quick run of every registered experiment is in test_experiments.py.)"""

import pytest

from rlscale.experiments import grpo_vs_zero_connect4, zero_compute, zero_elo
from rlscale.experiments.registry import EXPERIMENTS
from rlscale.experiments.verdict import experiment_verdict

PNG = b"\x89PNG\r\n\x1a\n"
SEEDS = [0, 1, 2]
JITTER = (-0.004, 0.0, 0.004)  # per seed: a spread small against the effects below
NOISE = (-0.4, 0.3, 0.1)       # per seed: a spread that swamps them


def compute_numbers(agreement, jitter=JITTER):
    """`agreement`: one curve over the budgets 0, 1, 2, ..., 256; each seed's is shifted by
    its jitter from 1 simulation on (the raw policy's stays), so the jitter is the spread
    of both primary effects."""
    sims = [0, 1, 2, 4, 8, 16, 32, 64, 128, 256]
    curves = [[agreement[0]] + [a + j * (1 + i) for i, a in enumerate(agreement[1:])]
              for j in jitter]
    score = [[0.5] + [min(1.0, 0.5 + 2 * (a - c[0])) for a in c[1:]] for c in curves]
    return {"seeds": SEEDS, "simulations": sims, "early": 8,
            "files": ["Test_L3_R1", "Test_L2_R1", "Test_L2_R2"], "positions": 3000,
            "games": 64, "agreement": curves, "score": score}


# Concave in log-budget, flat below 8 simulations (the Gumbel search's considered moves).
DIMINISHING = [0.70, 0.70, 0.71, 0.72, 0.73, 0.80, 0.85, 0.88, 0.90, 0.91]
# Rises, but its last doubling gains more than 8 -> 16.
ACCELERATING = [0.70, 0.70, 0.70, 0.70, 0.70, 0.71, 0.72, 0.74, 0.78, 0.86]
# Search makes the moves worse.
WORSE = [0.80, 0.80, 0.79, 0.78, 0.77, 0.74, 0.72, 0.71, 0.70, 0.695]


def elo_run(elo, shift=0.0):
    """A seed's ratings of six checkpoints, the last moved by `shift`."""
    elo = [*elo[:-1], elo[-1] + shift]
    return {"iterations": list(range(1, len(elo) + 1)),
            "selfplay_games": [256 * i for i in range(1, len(elo) + 1)], "elo": elo,
            "low": [e - 100 for e in elo], "high": [e + 100 for e in elo],
            "anchors": {"random": [0.0, 0.0, 0.0], "mcts:100": [650.0, 550.0, 750.0]},
            "matches": 26}


def elo_numbers(elo, shifts=(-10.0, 0.0, 10.0)):
    return {"seeds": SEEDS, "simulations": 32, "games": 40, "anchors": ["random", "mcts:100"],
            "neighbours": 2, "runs": [elo_run(elo, s) for s in shifts]}


def versus_arm(agreement, elo, spread, curve=None):
    """One arm of grpo_vs_zero_connect4 over the seeds: its agreement and Elo moved by each
    seed's `spread` (agreement by it, Elo by 2,500 times it)."""
    arm = {"agreement": [agreement + j for j in spread],
           "searched": [min(1.0, agreement + 0.1 + j) for j in spread],
           "elo": [elo + 2500 * j for j in spread], "low": [elo - 120] * len(spread),
           "high": [elo + 120] * len(spread), "evaluations": [370_000] * len(spread)}
    if curve is None:
        return {**arm, "games": [520] * len(spread), "trained_positions": [26_000] * len(spread)}
    return {**arm, "games": [18_000] * len(spread), "trained_positions": [370_000] * len(spread),
            "steps": [70] * len(spread), "curve": [[c + j for c in curve] for j in spread]}


def versus_numbers(alphazero, grpo, spread=JITTER):
    """`alphazero`, `grpo`: (raw-policy agreement, Elo); AlphaZero's values carry the
    per-seed spread, so it is the spread of both primary effects."""
    curve = [0.66 + (grpo[0] - 0.66) * k / 10 for k in range(11)]
    return {"seeds": SEEDS, "positions": 32, "group": 8, "score_points": 10,
            "files": ["Test_L3_R1", "Test_L2_R1", "Test_L2_R2"], "judged": 1500,
            "simulations": 16, "games": 40, "anchors": ["random", "mcts:25", "mcts:100"],
            "pairings": 10,
            "arms": {"alphazero": versus_arm(*alphazero, spread),
                     "grpo": versus_arm(*grpo, (0.0, 0.0, 0.0), curve)},
            "anchor_elo": {"random": [[0.0, 0.0, 0.0]] * 3,
                           "mcts:25": [[200.0, 100.0, 300.0]] * 3,
                           "mcts:100": [[500.0, 380.0, 620.0]] * 3}}


CASES = {
    zero_compute: {
        "supports": compute_numbers(DIMINISHING),
        "contradicts": compute_numbers(WORSE),
        "inconclusive": compute_numbers(DIMINISHING, NOISE)},
    zero_elo: {
        "supports": elo_numbers([300.0, 420.0, 480.0, 550.0, 600.0, 640.0]),
        "contradicts": elo_numbers([600.0, 560.0, 500.0, 450.0, 400.0, 380.0]),
        "inconclusive": elo_numbers([300.0, 420.0, 480.0, 550.0, 600.0, 400.0],
                                    (-400.0, 300.0, 100.0))},
    grpo_vs_zero_connect4: {
        "supports": versus_numbers((0.75, 400.0), (0.70, 250.0)),
        "contradicts": versus_numbers((0.70, 250.0), (0.75, 400.0)),
        "inconclusive": versus_numbers((0.75, 400.0), (0.70, 250.0), NOISE)},
}


@pytest.mark.parametrize("module", list(CASES), ids=lambda m: m.NAME)
def test_each_analysis_gives_all_three_verdicts(module, tmp_path):
    assert EXPERIMENTS[module.NAME] is module.EXPERIMENT
    for expected, numbers in CASES[module].items():
        analysis = module.analyse(numbers)
        assert experiment_verdict(analysis.effects) == expected, (expected, [
            (e.name, e.per_seed, e.verdict) for e in analysis.effects])
        assert analysis.table.rows and all(len(r) == len(analysis.table.columns)
                                           for r in analysis.table.rows)
        assert analysis.notes
    module.plot(CASES[module]["supports"], tmp_path / "figure.png")
    assert (tmp_path / "figure.png").read_bytes().startswith(PNG)


def test_compute_contradicts_without_diminishing_returns():
    """Search helps, but the last doubling gains more than the early one: the claim's second
    half fails, and with it the claim."""
    analysis = zero_compute.analyse(compute_numbers(ACCELERATING))
    better, diminishing, score = analysis.effects
    assert better.verdict == "supports" and diminishing.verdict == "contradicts"
    assert not score.primary and score.verdict == "supports"
    assert experiment_verdict(analysis.effects) == "contradicts"
    assert better.estimate.mean == pytest.approx(0.16)
    # the mean gain of 8 -> 16 -> 32 against that of 64 -> 128 -> 256, fixed in advance
    assert diminishing.estimate.mean == pytest.approx((0.01 + 0.01) / 2 - (0.04 + 0.08) / 2)
    assert zero_compute.compared_doublings([0, 1, 2, 4, 8, 16, 32, 64, 128, 256], 8) == (
        [8, 16], [64, 128])


def test_compute_doubling_gains():
    gains = zero_compute.doubling_gains([0, 1, 2, 4, 16], [0.5, 0.6, 0.65, 0.7, 0.9])
    assert gains == pytest.approx({1: 0.05, 2: 0.05})  # 0 and 4 -> 8 are no doublings here
    for scale, s in zero_compute.SETTINGS.items():
        assert s.simulations[0] == 0, scale
        first, last = zero_compute.compared_doublings(list(s.simulations), s.early)
        assert {*first, *last, 2 * first[-1], s.simulations[-1]} <= set(s.simulations), scale


def test_elo_spearman_and_ranks():
    assert zero_elo.ranks([30.0, 10.0, 20.0, 10.0]) == [4.0, 1.5, 3.0, 1.5]
    assert zero_elo.spearman([1, 2, 3, 4], [10.0, 20.0, 25.0, 90.0]) == pytest.approx(1.0)
    assert zero_elo.spearman([1, 2, 3, 4], [9.0, 7.0, 5.0, 1.0]) == pytest.approx(-1.0)
    assert zero_elo.spearman([1, 2, 3], [5.0, 5.0, 5.0]) == 0.0
    assert zero_elo.spearman([1, 2, 3, 4, 5], [1.0, 3.0, 2.0, 5.0, 4.0]) == pytest.approx(0.8)


def test_elo_arms_keep_a_checkpoint_every_iteration():
    for scale, s in zero_elo.SETTINGS.items():
        (arm,) = zero_elo.arms(scale)
        assert "checkpoint.every=1" in arm.overrides
        assert f"checkpoint.keep={s.iterations}" in arm.overrides
        assert f"train.iterations={s.iterations}" in arm.overrides


def test_versus_connect4_effects_and_table():
    """AlphaZero - GRPO, in that order, for both primary effects; the searched agreement is
    reported beside them; the table has a row per arm and per anchor, the costs in it."""
    analysis = grpo_vs_zero_connect4.analyse(versus_numbers((0.75, 400.0), (0.70, 250.0)))
    agreement, elo, searched = analysis.effects
    assert agreement.primary and elo.primary and not searched.primary
    assert agreement.estimate.mean == pytest.approx(0.05)
    assert elo.estimate.mean == pytest.approx(150.0)
    assert [row[0].split()[0] for row in analysis.table.rows] == [
        "AlphaZero", "GRPO", "anchor", "anchor", "anchor"]
    assert {"network evaluations while playing", "games", "positions trained"} <= set(
        analysis.table.columns)
    assert analysis.table.rows[2][4] == "fixed"  # random, the fit's zero


def test_versus_connect4_arm_is_the_alphazero_recipe():
    """One AlphaZero arm on configs/zero/connect4.yaml; GRPO is trained inside `measure` at
    that run's budget."""
    for scale, s in grpo_vs_zero_connect4.SETTINGS.items():
        (arm,) = grpo_vs_zero_connect4.arms(scale)
        assert (arm.label, arm.config) == ("alphazero", "connect4.yaml")
        assert f"train.iterations={s.iterations}" in arm.overrides
        assert s.anchors[0] == "random"
