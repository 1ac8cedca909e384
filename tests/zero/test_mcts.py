"""Batched MCTS on tic-tac-toe and Connect Four with knowledge-free evaluators, and the pure
MCTS (UCT with random playouts)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlscale.zero.config import MCTSConfig
from rlscale.zero.forest import Forest
from rlscale.zero.games import make_game
from rlscale.zero.gumbel import considered_visit_sequence
from rlscale.zero.mcts import UniformEvaluator
from rlscale.zero.search import search, search_states
from rlscale.zero.uct import playout_function, uct_search

torch.set_num_threads(1)
TTT = make_game("tictactoe")


def play(game, moves):
    state = game.initial_state()
    for a in moves:
        state = game.apply(state, a)
    return state


# X: 0 1 .   X to move wins at 2      # X: 0 1 .   O to move must block 2
#    3 4 .   (O on 3 and 4)           #    . 4 .
WIN = play(TTT, [0, 3, 1, 4])
BLOCK = play(TTT, [0, 4, 1])


class RecordingEvaluator(UniformEvaluator):
    """Uniform, and remembers every batch it was asked to evaluate."""

    def __init__(self, num_actions: int, priors: np.ndarray | None = None) -> None:
        super().__init__(num_actions)
        self.batches: list[np.ndarray] = []
        self.priors = priors

    def __call__(self, planes):
        self.batches.append(np.array(planes))
        p, v = super().__call__(planes)
        if self.priors is not None:
            p = np.broadcast_to(self.priors, p.shape).copy()
        return p, v


@pytest.mark.parametrize("leaves", [1, 8])
def test_uniform_search_wins_and_blocks(leaves):
    cfg = MCTSConfig(simulations=200, leaves_per_call=leaves)
    result = search_states(TTT, [WIN, BLOCK], UniformEvaluator(9), cfg, np.random.default_rng(0))
    assert list(result.chosen) == [2, 2]
    assert result.visit_counts.sum(-1).tolist() == [200, 200]
    np.testing.assert_allclose(result.policy.sum(-1), 1.0, rtol=1e-6)


def test_value_signs():
    cfg = MCTSConfig(simulations=100)
    forest = Forest(TTT, 2)
    forest.reset(0, WIN)
    forest.reset(1, BLOCK)
    result = search(forest, UniformEvaluator(9), cfg, np.random.default_rng(0))
    # The player to move at WIN is winning: its root value and the winning move's Q are high.
    assert result.root_value[0] > 0.5
    assert result.q_values[0, 2] == pytest.approx(1.0)
    # The terminal child stores its value from the view of its player to move: the loser.
    child = forest.children[0, 0, 2]
    assert forest.terminal[0, child] and forest.player[0, child] == 1
    assert forest.terminal_value[0, child] == -1.0
    assert forest.value_sum[0, child] / forest.visits[0, child] == pytest.approx(-1.0)
    # At BLOCK every move but the block loses at once: those moves have Q near -1 for O.
    losing = [a for a in (3, 5, 6, 7, 8) if result.visit_counts[1, a] > 1]
    assert losing and all(result.q_values[1, a] < -0.3 for a in losing)
    # O to move is lost: X (0, 2, 4) threatens both 6 and 8. Seen from O, the root is bad.
    lost = play(TTT, [0, 1, 2, 3, 4])
    root = search_states(TTT, [lost], UniformEvaluator(9), MCTSConfig(simulations=400),
                         np.random.default_rng(0))
    assert root.root_value[0] < -0.5
    assert (root.q_values[0][TTT.legal_mask(lost)] < 0).all()


def test_dirichlet_noise_only_at_root_and_only_in_selfplay():
    skewed = np.linspace(1.0, 2.0, 9).astype(np.float32)
    skewed /= skewed.sum()
    cfg = MCTSConfig(simulations=64, dirichlet_fraction=0.5)
    start = TTT.initial_state()

    def run(seed, noise):
        forest = Forest(TTT, 1)
        forest.reset(0, start)
        res = search(forest, RecordingEvaluator(9, skewed), cfg, np.random.default_rng(seed),
                     add_noise=noise)
        return forest, res

    # Without noise the search is deterministic whatever the RNG; with noise it is not.
    _, a = run(0, False)
    _, b = run(1, False)
    np.testing.assert_array_equal(a.visit_counts, b.visit_counts)
    _, c = run(0, True)
    _, d = run(1, True)
    assert not np.array_equal(c.visit_counts, d.visit_counts)
    # The stored priors, at the root and below it, are the evaluator's (noise is only used
    # for the root's selection), and the result reports the noiseless root prior.
    forest, res = run(0, True)
    np.testing.assert_allclose(res.prior[0], skewed, rtol=1e-5)
    for node in range(int(forest.num_nodes[0])):
        if forest.expanded[0, node]:
            legal = forest.legal[0, node]
            expected = np.where(legal, skewed, 0) / skewed[legal].sum()
            np.testing.assert_allclose(forest.prior[0, node], expected, rtol=1e-5)


def test_virtual_loss_batch_returns_distinct_leaves():
    evaluator = RecordingEvaluator(9)
    cfg = MCTSConfig(simulations=64, leaves_per_call=8)
    result = search_states(TTT, [TTT.initial_state()], evaluator, cfg, np.random.default_rng(0))
    assert result.visit_counts.sum() == 64
    sizes = [len(b) for b in evaluator.batches[1:]]  # [0] is the root's own evaluation
    assert max(sizes) > 1
    assert len(evaluator.batches) < 64 // 2  # far fewer calls than simulations
    for batch in evaluator.batches:
        flat = {b.tobytes() for b in batch}
        assert len(flat) == len(batch), "a batch evaluated the same leaf twice"


def test_virtual_loss_search_across_many_trees():
    cfg = MCTSConfig(simulations=200, leaves_per_call=4)
    states = [WIN, BLOCK] * 8
    result = search_states(TTT, states, UniformEvaluator(9), cfg, np.random.default_rng(0))
    assert (result.chosen == 2).all()
    assert (result.visit_counts.sum(-1) == 200).all()


def test_tree_reuse_keeps_counts():
    cfg = MCTSConfig(simulations=100)
    forest = Forest(TTT, 1)
    forest.reset(0, TTT.initial_state())
    search(forest, UniformEvaluator(9), cfg, np.random.default_rng(0))
    action = 4
    child = forest.children[0, 0, action]
    child_visits = int(forest.visits[0, child])
    grandchildren = forest.children[0, child]
    expected = np.where(grandchildren >= 0, forest.visits[0, np.maximum(grandchildren, 0)], 0)
    value_sum = forest.value_sum[0, child]
    forest.advance(0, action)
    assert forest.visits[0, 0] == child_visits
    assert forest.value_sum[0, 0] == pytest.approx(value_sum)
    assert forest.root_state(0) == TTT.apply(TTT.initial_state(), action)
    assert forest.parent[0, 0] == -1
    again = search(forest, UniformEvaluator(9), cfg, np.random.default_rng(0), simulations=0)
    np.testing.assert_array_equal(again.visit_counts[0], expected)
    # Nodes stay consistent after compaction: each child's parent is its parent.
    n = int(forest.num_nodes[0])
    for node in range(n):
        for kid in forest.children[0, node]:
            if kid >= 0:
                assert kid < n and forest.parent[0, kid] == node
    search(forest, UniformEvaluator(9), cfg, np.random.default_rng(0), simulations=50)
    assert forest.visits[0, 0] == child_visits + 50
    # Without reuse the tree starts over.
    forest.advance(0, 0, reuse=False)
    assert forest.num_nodes[0] == 1 and forest.visits[0, 0] == 0


def test_considered_visit_sequence_is_sequential_halving():
    seq = considered_visit_sequence(4, 16)
    assert len(seq) == 16
    assert seq[:4] == (0, 0, 0, 0)  # first every considered action once
    assert max(seq) >= 3  # the survivors get the later visits
    assert considered_visit_sequence(1, 5) == (0, 1, 2, 3, 4)


@pytest.mark.parametrize("noise", [False, True])
def test_gumbel_finds_the_win_with_few_simulations(noise):
    cfg = MCTSConfig(simulations=8, gumbel=True)
    rng = np.random.default_rng(0)
    result = search_states(TTT, [WIN, BLOCK], UniformEvaluator(9), cfg, rng, add_noise=noise)
    assert result.chosen[0] == 2
    assert result.policy[0].argmax() == 2 and result.policy[0, 2] > 0.9
    assert result.visit_counts.sum(-1).tolist() == [8, 8]
    np.testing.assert_allclose(result.policy.sum(-1), 1.0, rtol=1e-5)
    # The improved policy gives no mass to illegal moves.
    assert (result.policy[0][~TTT.legal_mask(WIN)] < 1e-6).all()
    # Blocking needs a deeper look; a few more simulations suffice.
    blocked = search_states(TTT, [BLOCK], UniformEvaluator(9),
                            MCTSConfig(simulations=32, gumbel=True), rng, add_noise=noise)
    assert blocked.chosen[0] == 2


def test_pure_mcts_plays_connect4_and_tictactoe_tactics():
    c4 = make_game("connect4")
    # Player 0 has three in the bottom row (columns 1-3); column 4 wins.
    win = play(c4, [0, 0, 1, 1, 2, 2])
    # Same, but it is player 1 who must block at column 4.
    block = play(c4, [0, 0, 1, 1, 2])
    for seed in range(3):
        rng = np.random.default_rng(seed)
        assert [uct_search(c4, s, 200, rng) for s in (win, block)] == [3, 3]
        assert [uct_search(TTT, s, 200, rng) for s in (WIN, BLOCK)] == [2, 2]
    with pytest.raises(ValueError, match="at least 1"):
        uct_search(TTT, WIN, 0, np.random.default_rng(0))


def test_compiled_connect4_playout_is_uniform_random_play():
    """The compiled playout of Connect Four plays the same game as the generic one (random
    play from the empty board: the first player wins about 55.5%, draws are rare), and is
    a function of the generator's state."""
    c4 = make_game("connect4")
    fast = playout_function(c4)

    def generic(state, rng):
        while not c4.is_terminal(state):
            legal = np.flatnonzero(c4.legal_mask(state))
            state = c4.apply(state, int(legal[rng.integers(legal.size)]))
        return c4.outcome(state)

    rng = np.random.default_rng(0)
    n_fast, n_slow = 20_000, 3_000
    fast_wins = np.mean([fast(c4.initial_state(), rng) == 1.0 for _ in range(n_fast)])
    slow_wins = np.mean([generic(c4.initial_state(), rng) == 1.0 for _ in range(n_slow)])
    assert abs(fast_wins - slow_wins) < 4 * np.sqrt(0.25 / n_slow + 0.25 / n_fast)
    assert 0.53 < fast_wins < 0.58
    assert fast(play(c4, [0, 0, 1, 1, 2, 2, 3]), rng) == 1.0  # a finished game: its result
    # Player 0 to move with three in the bottom row: it wins most random playouts, and the
    # result is from player 0's view whoever is to move.
    for moves in ([0, 0, 1, 1, 2, 6], [6, 0, 0, 1, 1, 2, 5]):
        state = play(c4, moves)
        results = np.array([fast(state, np.random.default_rng(s)) for s in range(300)])
        assert set(results) <= {-1.0, 0.0, 1.0}
        assert np.mean(results == (1.0 if len(moves) == 6 else -1.0)) > 0.5
    state = play(c4, [0, 0, 1, 1, 2, 6])
    assert len({fast(state, np.random.default_rng(7)) for _ in range(5)}) == 1


@pytest.mark.parametrize("gumbel", [False, True])
def test_proofs_propagate_from_finished_games(gumbel):
    cfg = MCTSConfig(simulations=300, propagate_proofs=True, gumbel=gumbel)
    lost = play(TTT, [0, 1, 2, 3, 4])  # O to move; X threatens 6 and 8
    fork = play(TTT, [0, 1, 4, 8])  # X to move: 3 or 6 makes two threats -> a forced win
    forest = Forest(TTT, 3)
    for i, state in enumerate([lost, fork, WIN]):
        forest.reset(i, state)
    result = search(forest, UniformEvaluator(9), cfg, np.random.default_rng(0))
    assert forest.proven[0, 0] == -1  # every O move loses
    assert forest.proven[1, 0] == 1 and forest.proven[2, 0] == 1
    assert result.chosen[2] == 2
    child = forest.children[1, 0, result.chosen[1]]
    assert forest.proven[1, child] == -1  # the chosen move leaves O lost
    # Without proofs nothing is marked beyond the finished games themselves.
    forest_off = Forest(TTT, 1)
    forest_off.reset(0, fork)
    search(forest_off, UniformEvaluator(9), MCTSConfig(simulations=300), np.random.default_rng(0))
    n = int(forest_off.num_nodes[0])
    assert not (forest_off.proven[0, :n][~forest_off.terminal[0, :n]]).any()


def test_proofs_play_the_only_non_losing_move_in_connect4():
    c4 = make_game("connect4")
    block = play(c4, [0, 0, 1, 1, 2])  # player 1 must block column 4 (action 3)
    cfg = MCTSConfig(simulations=64, propagate_proofs=True)
    result = search_states(c4, [block], UniformEvaluator(7), cfg, np.random.default_rng(0))
    assert result.chosen[0] == 3


def test_forest_pickled_before_a_new_field_unpickles_with_defaults():
    import pickle

    forest = Forest(TTT, 1)
    forest.reset(0, WIN)
    search(forest, UniformEvaluator(9), MCTSConfig(simulations=20), np.random.default_rng(0))
    old = forest.__dict__.copy()
    del old["proven"]  # as saved by a version without MCTS-Solver proofs
    restored = Forest.__new__(Forest)
    restored.__setstate__(pickle.loads(pickle.dumps(old)))
    n = int(restored.num_nodes[0])
    assert restored.proven.shape == forest.proven.shape
    assert (restored.proven[0, :n] == np.where(forest.terminal[0, :n],
                                               np.sign(forest.terminal_value[0, :n]), 0)).all()
    restored.ensure_capacity(restored.capacity + 1)  # grows every field, `proven` included
    cfg = MCTSConfig(simulations=20, propagate_proofs=True)
    assert search(restored, UniformEvaluator(9), cfg, np.random.default_rng(0)).chosen[0] == 2
