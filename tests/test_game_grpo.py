"""GRPO on a game without search (experiments/game_grpo.py): sampling, credit, learning."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from rlscale.experiments.game_grpo import (
    GRPOGameSettings,
    PlayedGroup,
    move_advantages,
    play_group,
    random_start,
    sample_legal,
    train_grpo,
)
from rlscale.experiments.tictactoe_exact import judge_raw_policy
from rlscale.zero.config import NetworkConfig
from rlscale.zero.games.tictactoe import TicTacToe
from rlscale.zero.network import network_for


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_net(seed: int = 0):
    torch.manual_seed(seed)
    return network_for(TicTacToe(), NetworkConfig(blocks=2, channels=32, value_hidden=32))


def test_sample_legal_follows_the_priors_over_the_legal_moves_only():
    priors = np.array([[0.5, 0.3, 0.2, 0.0]] * 20000, dtype=np.float32)
    legal = np.array([[True, True, False, True]] * 20000)
    moves = sample_legal(priors, legal, np.random.default_rng(0))
    counts = np.bincount(moves, minlength=4) / len(moves)
    assert counts[2] == 0 and counts[3] == 0          # illegal; legal with prior 0
    assert counts[0] == pytest.approx(0.5 / 0.8, abs=0.015)
    assert counts[1] == pytest.approx(0.3 / 0.8, abs=0.015)


def test_the_opponents_moves_take_the_negated_group_advantage():
    # One group of two games from one start: the start player won the first, lost the second.
    played = PlayedGroup(
        planes=np.zeros((5, 3, 3, 3), np.float32), legal=np.ones((5, 9), bool),
        actions=np.zeros(5, np.int64), game_index=np.array([0, 0, 0, 1, 1]),
        same_side=np.array([True, False, True, True, False]),
        rewards=np.array([1.0, -1.0], np.float32), evaluations=5)
    advantages = move_advantages(played, group=2)
    # GRPO's std-normalised group advantages are +1 and -1 for the two games.
    np.testing.assert_allclose(advantages, [1, -1, 1, -1, 1], atol=1e-5)
    drawn = dataclasses.replace(played, rewards=np.zeros(2, np.float32))
    assert not move_advantages(drawn, group=2).any()  # a group of equal rewards: no signal


def test_a_group_is_played_to_the_end_with_one_evaluation_per_move():
    game, rng = TicTacToe(), np.random.default_rng(3)
    starts = [random_start(game, rng, 4) for _ in range(5)]
    played = play_group(game, tiny_net(), starts, group=4, rng=rng)
    assert played.rewards.shape == (20,) and set(np.unique(played.rewards)) <= {-1.0, 0.0, 1.0}
    assert played.evaluations == len(played.actions)
    assert played.legal[np.arange(len(played.actions)), played.actions].all()
    for g in range(20):  # the sides alternate within a game, the start player first
        sides = played.same_side[played.game_index == g]
        assert sides[0] and (sides[::2]).all() and not sides[1::2].any()


def test_grpo_raises_the_share_of_optimal_moves():
    net = tiny_net()
    before = judge_raw_policy(net).optimal_moves
    progress = train_grpo(TicTacToe(), net, GRPOGameSettings(evaluations=20000, positions=32,
                                                             group=8), seed=0,
                          score=lambda n: judge_raw_policy(n).optimal_moves, score_points=2)
    after = judge_raw_policy(net).optimal_moves
    print(f"GRPO on tic-tac-toe: optimal moves {before:.3f} -> {after:.3f}")
    assert progress.evaluations >= 20000 and len(progress.curve) == 3
    assert progress.curve[0][1] == pytest.approx(before) and progress.curve[-1][1] == after
    assert after >= before + 0.04   # measured 0.543 -> 0.622
