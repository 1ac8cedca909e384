"""selfplay_cycles: the reduced Zero loop settles on a transitive game and cycles on
rock-paper-scissors; its analysis can say all three verdicts; it measures, plots and
saves like every experiment."""

import dataclasses
import json

import numpy as np
import pytest

from rlscale.experiments import selfplay_cycles as sc
from rlscale.experiments.setup import QUICK, Context
from rlscale.experiments.verdict import experiment_verdict

PNG = b"\x89PNG\r\n\x1a\n"
SEEDS = (0, 1, 2, 3)
QUICK_SETTINGS = sc.SETTINGS["quick"]


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="module")
def quick_numbers(tmp_path_factory):
    ctx = Context(out=tmp_path_factory.mktemp("selfplay_cycles"), scale=QUICK, seeds=SEEDS,
                  base=None, progress=False)
    return sc.measure(ctx, {})


def run(game: str, seed: int, settings: sc.Settings = QUICK_SETTINGS) -> dict:
    return sc.selfplay(sc.GAMES[game][0], seed, settings)


# -- the games and the loop's pieces -------------------------------------------------------

@pytest.mark.parametrize("game", list(sc.GAMES))
def test_games_are_symmetric_zero_sum(game):
    matrix = sc.GAMES[game][0]
    np.testing.assert_array_equal(matrix, -matrix.T)


def test_exploitability_is_zero_at_the_equilibrium_and_one_at_a_pure_rps_move():
    rps, strength = sc.rock_paper_scissors(), sc.strength_game(4)
    assert sc.exploitability(rps, np.full(3, 1 / 3)) == pytest.approx(0.0, abs=1e-12)
    assert sc.exploitability(rps, np.array([1.0, 0.0, 0.0])) == pytest.approx(1.0)
    assert sc.exploitability(strength, np.eye(4)[3]) == pytest.approx(0.0)
    assert sc.exploitability(strength, np.eye(4)[0]) == pytest.approx(1.0)


def test_search_sharpens_towards_the_best_response():
    rock_heavy = np.array([0.6, 0.2, 0.2])
    target = sc.search_policy(sc.rock_paper_scissors(), rock_heavy, temperature=0.05)
    assert target.argmax() == 1 and target[1] > 0.99  # paper beats a rock-heavy policy


def test_distillation_moves_the_policy_towards_the_target():
    logits, target = np.zeros(3), np.array([0.1, 0.8, 0.1])
    before = np.abs(sc.softmax(logits) - target).sum()
    after = np.abs(sc.softmax(sc.distill(logits, target, QUICK_SETTINGS)) - target).sum()
    assert after < before


# -- the dynamics ----------------------------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
def test_the_loop_settles_on_the_transitive_game(seed):
    result = run("transitive", seed)
    assert result["last"][-1] < 0.05
    assert result["argmax_changes"] == 0
    assert np.argmax(result["trajectory"][-1]) == sc.STRENGTHS - 1  # the strongest action


@pytest.mark.parametrize("seed", SEEDS)
def test_the_loop_cycles_on_rps_while_its_average_converges(seed):
    result = run("rps", seed)
    assert result["last"][-1] > 0.1
    assert result["average"][-1] < result["last"][-1] - 0.05
    assert result["average"][-1] < 0.01
    assert result["cycling"] > 0.05 and result["argmax_changes"] > 10


def test_the_linear_stability_bound_predicts_the_cycle():
    """Above 1 (the chosen settings) the uniform equilibrium repels and the loop cycles; a
    soft search with small steps (below 1) converges on RPS's equilibrium instead."""
    assert sc.equilibrium_growth(QUICK_SETTINGS) > 1
    gentle = dataclasses.replace(QUICK_SETTINGS, iterations=2000, temperature=0.2,
                                 learning_rate=0.05)
    assert sc.equilibrium_growth(gentle) < 1
    assert run("rps", 0, gentle)["last"][-1] < 0.01


def test_a_seed_gives_the_same_run():
    assert run("rps", 3) == run("rps", 3)
    assert run("rps", 3)["trajectory"][0] != run("rps", 4)["trajectory"][0]


# -- measure, analyse, plot ------------------------------------------------------------------

def test_quick_numbers_support_the_claim(quick_numbers):
    analysis = sc.analyse(quick_numbers)
    assert experiment_verdict(analysis.effects) == "supports", [
        (e.name, e.per_seed, e.verdict) for e in analysis.effects]
    assert all(e.min_effect > 0 for e in analysis.effects if e.primary)
    assert analysis.table.rows and all(len(r) == len(analysis.table.columns)
                                       for r in analysis.table.rows)
    assert analysis.notes


def test_measurements_round_trip_through_json(quick_numbers):
    assert json.loads(json.dumps(quick_numbers)) == quick_numbers
    points = QUICK_SETTINGS.iterations // QUICK_SETTINGS.record_every + 1
    assert all(len(curve) == points for game in quick_numbers["games"].values()
               for curve in game["last"])


def synthetic(rps_last, rps_average, transitive_last, noise=(0.0,) * 3) -> dict:
    """Numbers in `measure`'s shape whose curves end at the given values, each seed's noise
    added to the RPS last iterate's."""
    def game(lasts, average, cycling, actions):
        return {"actions": actions,
                "last": [[0.5, (0.5 + last) / 2, last] for last in lasts],
                "average": [[0.5, (0.5 + average) / 2, average] for _ in lasts],
                "cycling": [cycling] * len(lasts), "argmax_changes": [10] * len(lasts),
                "trajectory": [[[1 / len(actions)] * len(actions)] * 4 for _ in lasts]}

    games = {"rps": game([rps_last + e for e in noise], rps_average, 0.2,
                         ["rock", "paper", "scissors"]),
             "transitive": game([transitive_last] * len(noise), 0.01, 0.0, ["s0", "s1", "s2"])}
    return {"seeds": list(range(len(noise))), "settings": dataclasses.asdict(QUICK_SETTINGS),
            "iterations": [0, 50, 100], "equilibrium_growth": 3.0, "games": games}


NOISE = (0.4, -0.5, 0.3)


@pytest.mark.parametrize("expected, numbers", [
    ("supports", synthetic(0.3, 0.001, 0.001)),
    ("contradicts", synthetic(0.001, 0.3, 0.3)),     # RPS settles, its average does not
    ("inconclusive", synthetic(0.1, 0.001, 0.001, NOISE)),
])
def test_the_analysis_gives_all_three_verdicts(expected, numbers):
    analysis = sc.analyse(numbers)
    assert experiment_verdict(analysis.effects) == expected, [
        (e.name, e.per_seed, e.verdict) for e in analysis.effects]
    assert all(len(r) == len(analysis.table.columns) for r in analysis.table.rows)


def test_plot_writes_a_png(quick_numbers, tmp_path):
    path = sc.plot(quick_numbers, tmp_path / "figure.png")
    assert path.read_bytes().startswith(PNG)
    sc.plot(synthetic(0.3, 0.001, 0.001), tmp_path / "synthetic.png")
    assert (tmp_path / "synthetic.png").read_bytes().startswith(PNG)


def test_the_experiment_is_declared_like_the_others():
    from rlscale.experiments.registry import module_claim

    assert sc.EXPERIMENT.name == sc.NAME == "selfplay_cycles"
    assert module_claim(sc.NAME) == sc.CLAIM
    assert sc.arms("quick") == [] and not sc.EXPERIMENT.needs_base
    assert set(sc.SETTINGS) == {"quick", "full"}
