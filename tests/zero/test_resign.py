"""Resignation: the false-positive accounting of played-out games, and the threshold tuning
(AlphaGo Zero's v_resign), as pure functions, inside the actor, and in the loop."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rlscale.config import ConfigError, load_config
from rlscale.runtime.versions import WeightStore
from rlscale.zero.config import MCTSConfig, SelfPlayConfig, ZeroConfig
from rlscale.zero.games import make_game
from rlscale.zero.loop import train
from rlscale.zero.model import load_model
from rlscale.zero.network import PolicyValueNet
from rlscale.zero.resign import (
    PlayedOut,
    false_resignations,
    first_resignation,
    is_false_resignation,
    tune_threshold,
)
from rlscale.zero.selfplay import Actor

TTT = make_game("tictactoe")


def _game(values: list[float], outcome: float, first_player: int = 0) -> PlayedOut:
    """Players alternate from `first_player`; values are from the mover's view."""
    checks = [(ply, (first_player + ply) % 2, v) for ply, v in enumerate(values)]
    return PlayedOut.from_checks(checks, outcome)


def test_first_resignation_follows_the_self_play_rule():
    game = _game([0.1, -0.2, -0.7, -0.95, 0.3], outcome=-1.0)
    assert first_resignation(game, -0.9, min_moves=0) == 1  # ply 3: player 1 at -0.95
    assert first_resignation(game, -0.5, min_moves=0) == 0  # ply 2: player 0 at -0.7
    assert first_resignation(game, -0.1, min_moves=0) == 1  # ply 1
    assert first_resignation(game, -0.1, min_moves=2) == 0  # plies 0-1 cannot resign
    assert first_resignation(game, -0.99, min_moves=0) is None
    # outcome -1: player 1 won. Player 1 resigning would have been false, player 0 not.
    assert is_false_resignation(game, 1) and not is_false_resignation(game, 0)
    draw = _game([-0.8, -0.8], outcome=0.0)
    assert is_false_resignation(draw, 0) and is_false_resignation(draw, 1)  # a draw is not a loss


def test_false_resignations_and_the_tuned_threshold():
    # 20 games the eventual loser (player 0) gives up on at -0.8; 2 games player 0 wins
    # after its value dipped to -0.45 (false at any threshold above -0.45); 10 quiet draws.
    lost = [_game([-0.8, 0.8, -0.85], outcome=-1.0) for _ in range(20)]
    comebacks = [_game([-0.45, 0.45, -0.3], outcome=1.0) for _ in range(2)]
    draws = [_game([-0.05, -0.05, -0.05], outcome=0.0) for _ in range(10)]
    games = lost + comebacks + draws
    assert false_resignations(games, -0.9, 0) == (0, 0)
    assert false_resignations(games, -0.5, 0) == (0, 20)
    assert false_resignations(games, -0.4, 0) == (2, 22)  # 9% false
    assert false_resignations(games, 0.01, 0) == (12, 32)  # every draw too
    # the counts at every threshold at once agree with the one-game rule
    for t in np.linspace(-1.0, 0.1, 23):
        by_rule = [first_resignation(g, t, 1) for g in games]
        would = sum(p is not None for p in by_rule)
        false = sum(is_false_resignation(g, p) for g, p in zip(games, by_rule, strict=True)
                    if p is not None)
        assert false_resignations(games, t, 1) == (false, would)
    # Under 5%: the comebacks must not resign, so the most aggressive threshold is -0.45
    # (resign when the value is *below* it); 10% tolerates them but not the draws (-0.05);
    # 50% the draws too.
    assert tune_threshold(games, target=0.05, min_moves=0, min_games=10) == -0.45
    assert tune_threshold(games, target=0.10, min_moves=0, min_games=10) == -0.05
    assert tune_threshold(games, target=0.5, min_moves=0, min_games=10) == 0.0
    # Too little evidence: no threshold has 25 would-be resignations below 5% false.
    assert tune_threshold(games, target=0.05, min_moves=0, min_games=25) is None
    assert tune_threshold([], target=0.05, min_moves=0, min_games=1) is None


def _actor(selfplay: SelfPlayConfig, seed: int = 0) -> Actor:
    torch.manual_seed(seed)
    net = PolicyValueNet(TTT.plane_shape, 9, 1, 8)
    actor = Actor(TTT, PolicyValueNet(TTT.plane_shape, 9, 1, 8), MCTSConfig(simulations=8),
                  selfplay, WeightStore(net.state_dict()), np.random.default_rng(seed))
    actor.sync()
    return actor


def test_actor_false_resignation_accounting_matches_its_played_out_games():
    """The actor counts false resignations as its games finish; replaying its recorded
    played-out games through zero/resign.py at the same threshold gives the same counts."""
    threshold, min_moves = 0.0, 2  # an untrained value hovers around 0: many would resign
    cfg = SelfPlayConfig(concurrent_games=16, resign_threshold=threshold,
                         resign_min_moves=min_moves, resign_playout_share=0.5)
    _, stats = _actor(cfg).play(48)
    assert stats.resigned > 0 and stats.playout_would_resign > 0
    assert 0 < len(stats.played_out) <= stats.games - stats.resigned
    false, would = false_resignations(stats.played_out, threshold, min_moves)
    assert (false, would) == (stats.false_resignations, stats.playout_would_resign)
    for game in stats.played_out:  # every searched move of the game was recorded
        assert list(game.plies) == list(range(len(game.plies)))
    # Resignation off: nothing recorded, nothing resigned (and the same RNG stream drawn).
    _, off = _actor(SelfPlayConfig(concurrent_games=16)).play(16)
    assert off.played_out == [] and off.resigned == 0 and off.playout_would_resign == 0


def test_tuning_needs_a_starting_threshold_and_played_out_games():
    with pytest.raises(ConfigError, match="needs resign_threshold"):
        load_config(ZeroConfig, None, ["selfplay.resign_false_positive_target=0.05"])
    with pytest.raises(ConfigError, match="resign_playout_share > 0"):
        load_config(ZeroConfig, None, ["selfplay.resign_false_positive_target=0.05",
                                       "selfplay.resign_threshold=-0.9",
                                       "selfplay.resign_playout_share=0"])


def _tuned_args(out, iterations: int) -> list[str]:
    return [
        f"out={out}", f"train.iterations={iterations}", "network.blocks=1", "network.channels=8",
        "mcts.simulations=8", "selfplay.concurrent_games=8", "selfplay.games_per_iteration=16",
        "train.min_replay=32", "train.batch_size=32", "checkpoint.every=2",
        "selfplay.resign_threshold=-0.9", "selfplay.resign_min_moves=2",
        "selfplay.resign_playout_share=0.5", "selfplay.resign_false_positive_target=0.05",
        "selfplay.resign_tune_min_games=3",
    ]


def test_the_loop_tunes_the_threshold_and_resumes_exactly(tmp_path):
    straight = train(load_config(ZeroConfig, None, _tuned_args(tmp_path / "a", 4)),
                     progress=False)
    train(load_config(ZeroConfig, None, _tuned_args(tmp_path / "b", 2)), progress=False)
    resumed = train(load_config(ZeroConfig, None, _tuned_args(tmp_path / "b", 4)),
                    resume=True, progress=False)
    rows = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    thresholds = [r["selfplay/resign_threshold"] for r in rows]
    assert all(-1.0 <= t <= 0.0 for t in thresholds)
    assert thresholds != [-0.9] * 4  # it moved
    assert all(r["selfplay/tuned_false_resign_rate"] <= 0.05 for r in rows
               if r["selfplay/resign_threshold"] != -0.9)
    assert rows[-1]["selfplay/played_out_games"] > rows[0]["selfplay/played_out_games"] > 0
    # the tuning state is in the checkpoint: the resumed run plays and tunes the same
    rows_b = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [r["selfplay/resign_threshold"] for r in rows_b] == thresholds
    assert straight.counters.games == resumed.counters.games
    wa = load_model(straight.final_dir).net.state_dict()
    wb = load_model(resumed.final_dir).net.state_dict()
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], rtol=0, atol=0)
