"""Elo during training: the joint Bradley-Terry fit, the schedule, and `rlscale zero
elo-curve` on a tiny tic-tac-toe run."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from rlscale.config import load_config
from rlscale.zero.config import ZeroConfig
from rlscale.zero.elo_curve import find_checkpoints, schedule
from rlscale.zero.matches import MatchResult
from rlscale.zero.ratings import fit_ratings

torch.set_num_threads(1)
TRUE = {"random": 0.0, "a": -120.0, "b": 150.0, "c": 400.0, "d": 700.0}


def expected_score(elo_a: float, elo_b: float) -> float:
    return 1.0 / (1.0 + 10.0 ** ((elo_b - elo_a) / 400.0))


def round_robin(games: int, rng: np.random.Generator | None = None) -> list[MatchResult]:
    """Every pair of TRUE's players, `games` each: the expected results (rounded) or, with
    `rng`, results drawn from the model (win/draw/loss, 20% draws)."""
    names, results = list(TRUE), []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            p = expected_score(TRUE[a], TRUE[b])
            if rng is None:
                wins = round(games * p)
                results.append(MatchResult(a, b, wins=wins, losses=games - wins))
            else:  # draws at 20%, wins so that the expected score is still p
                draw = 0.2 * min(1.0, 2 * min(p, 1 - p) / 0.2)
                win = p - draw / 2
                w, d, lo = rng.multinomial(games, [win, draw, 1 - win - draw])
                results.append(MatchResult(a, b, wins=int(w), draws=int(d), losses=int(lo)))
    return results


def test_fit_recovers_known_elo_gaps():
    ratings = fit_ratings(round_robin(20_000), "random", prior_draws=0.0)
    for name, elo in TRUE.items():
        assert ratings[name].elo == pytest.approx(elo, abs=3.0), name
    assert ratings["random"].elo == 0.0 == ratings["random"].low == ratings["random"].high
    # With the default prior (one virtual draw a pairing) the gaps shrink only slightly.
    shrunk = fit_ratings(round_robin(20_000), "random")
    assert all(abs(shrunk[n].elo - TRUE[n]) < 5.0 for n in TRUE)


def test_intervals_cover_the_truth_and_shrink_with_games():
    rng = np.random.default_rng(0)
    for games in (100, 400):
        ratings = fit_ratings(round_robin(games, rng), "random")
        for name, elo in TRUE.items():
            r = ratings[name]
            assert math.isfinite(r.elo) and r.games == 4 * games
            if name != "random":
                assert r.low < r.elo < r.high
                half = (r.high - r.low) / 2
                assert abs(r.elo - elo) < 1.6 * half, (games, name)  # ~3 standard errors
    wide = fit_ratings(round_robin(100, rng), "random")["b"]
    narrow = fit_ratings(round_robin(1600, rng), "random")["b"]
    assert (narrow.high - narrow.low) < 0.35 * (wide.high - wide.low)  # ~1 / sqrt(16)


def test_a_perfect_score_has_a_finite_rating_and_a_wide_interval():
    ratings = fit_ratings([MatchResult("random", "x", wins=0, losses=40)], "random")
    x = ratings["x"]
    assert math.isfinite(x.elo) and 400 < x.elo < 1500 and x.high - x.low > 300


def test_fit_refuses_unlinked_players_and_a_missing_anchor():
    results = [MatchResult("random", "a", wins=3, losses=2), MatchResult("b", "c", wins=1)]
    with pytest.raises(ValueError, match="no chain of matches links 'b'"):
        fit_ratings(results, "random")
    with pytest.raises(ValueError, match="anchor 'mcts:10'"):
        fit_ratings(results, "mcts:10")


def test_schedule_pairs_neighbours_and_anchors():
    pairs = schedule(["i1", "i2", "i3"], ["random", "mcts:5"], neighbours=1)
    assert pairs[0] == ("random", "mcts:5")
    assert {p for p in pairs if "i2" in p} == {("i2", "random"), ("i2", "mcts:5"),
                                               ("i1", "i2"), ("i2", "i3")}
    assert len(pairs) == 1 + 3 * 2 + 2
    assert len(schedule(["i1", "i2", "i3"], ["random"], neighbours=5)) == 3 + 3


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A tic-tac-toe run of 3 iterations, checkpoints every 2: checkpoints/step_000002,
    step_000003 (the loop's last) and final/ (the same iteration 3)."""
    from rlscale.zero.loop import train

    out = tmp_path_factory.mktemp("elo") / "run"
    cfg = load_config(ZeroConfig, None, [
        f"out={out}", "train.iterations=3", "network.blocks=1", "network.channels=8",
        "mcts.simulations=8", "selfplay.concurrent_games=8", "selfplay.games_per_iteration=8",
        "train.min_replay=16", "train.batch_size=16", "checkpoint.every=2"])
    train(cfg, progress=False)
    return out


def test_find_checkpoints_takes_the_checkpoints_and_a_later_final(run_dir, tmp_path):
    found = find_checkpoints(run_dir)
    assert [(c.name, c.path.name, c.iteration) for c in found] == [
        ("iter 2", "step_000002", 2), ("iter 3", "step_000003", 3)]  # final/ = iteration 3
    assert 0 < found[0].selfplay_games < found[1].selfplay_games
    # A run kept with fewer checkpoints than its final/ (here: only final/) rates final/.
    shutil.copytree(run_dir / "final", tmp_path / "run" / "final")
    shutil.copytree(run_dir / "checkpoints" / "step_000002",
                    tmp_path / "run" / "checkpoints" / "step_000002")
    found = find_checkpoints(tmp_path / "run")
    assert [(c.name, c.path.name) for c in found] == [("iter 2", "step_000002"),
                                                     ("iter 3", "final")]


def test_milestone_networks_outlive_pruned_checkpoints_and_are_rated(tmp_path):
    """checkpoint.networks_every keeps the network of every N-th iteration in networks/
    (no optimiser, no replay), never pruned: with keep=1 the curve still has every one."""
    from rlscale.zero.loop import train

    out = tmp_path / "run"
    cfg = load_config(ZeroConfig, None, [
        f"out={out}", "train.iterations=3", "network.blocks=1", "network.channels=8",
        "mcts.simulations=8", "selfplay.concurrent_games=8", "selfplay.games_per_iteration=8",
        "train.min_replay=16", "train.batch_size=16", "checkpoint.every=1", "checkpoint.keep=1",
        "checkpoint.networks_every=1"])
    train(cfg, progress=False)
    assert [p.name for p in sorted((out / "checkpoints").iterdir())] == ["step_000003"]
    networks = sorted((out / "networks").iterdir())
    assert [p.name for p in networks] == ["step_000001", "step_000002", "step_000003"]
    assert {f.name for f in networks[0].iterdir()} == {"model.json", "model.safetensors"}
    found = find_checkpoints(out)
    assert [(c.name, c.path.parent.name) for c in found] == [
        ("iter 1", "networks"), ("iter 2", "networks"), ("iter 3", "checkpoints")]
    assert 0 < found[0].selfplay_games < found[1].selfplay_games < found[2].selfplay_games
    # the run's own folder: --overwrite starts over without the old networks
    train(cfg.model_copy(update={"checkpoint": cfg.checkpoint.model_copy(
        update={"networks_every": 0})}), progress=False, overwrite=True)
    assert not (out / "networks").exists()


def test_elo_curve_cli_writes_table_json_csv_and_plot(cli, run_dir, tmp_path):
    out = tmp_path / "curve"
    result = cli(["elo-curve", str(run_dir), "--games", "4", "--simulations", "2",
                  "--anchors", "random,mcts:10", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "| iter 3 | 3 |" in result.stdout and "random = 0" in result.stdout
    data = json.loads((out / "elo_curve.json").read_text())
    assert data["anchor"] == "random" and data["settings"]["simulations"] == 2
    players = {p["player"]: p for p in data["players"]}
    assert set(players) == {"iter 2", "iter 3", "random", "mcts:10"}
    assert players["iter 3"]["path"] == "checkpoints/step_000003"
    for name, p in players.items():
        assert math.isfinite(p["elo"]) and p["games"] > 0
        if name != "random":
            assert p["low"] < p["elo"] < p["high"]
    # 1 anchor pairing + 2 checkpoints x 2 anchors + 1 checkpoint pairing, 4 games each
    assert len(data["matches"]) == 6
    assert all(m["wins"] + m["draws"] + m["losses"] == 4 for m in data["matches"])
    with open(out / "elo_curve.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["player"] for r in rows] == ["iter 2", "iter 3", "random", "mcts:10"]
    assert (out / "elo_curve.png").stat().st_size > 0 and (out / "elo_curve.md").is_file()


def test_elo_curve_cli_errors_are_one_line(cli, run_dir, tmp_path):
    (tmp_path / "empty").mkdir()
    for args, message in (
        ([str(tmp_path / "empty")], "no checkpoints in"),
        ([str(tmp_path / "missing")], "no run directory"),
        ([str(run_dir), "--anchors", "random,chess"], "unknown agent"),
        ([str(run_dir), "--anchors", "solver"], "connect4 only"),
        ([str(run_dir), "--anchors", "random,random"], "twice"),
        ([str(run_dir), "--anchors", "raw"], "model:PATH"),
        ([str(run_dir), "--games", "0"], "at least 1"),
    ):
        result = cli(["elo-curve", *args, "--out", str(tmp_path / "o")])
        assert result.exit_code == 2, (args, result.output)
        assert result.stderr.startswith("error: ") and message in result.stderr, args
        assert result.stderr.count("\n") == 1, args
