"""The search takes its action selection injected: PUCT and Gumbel are policies built on it, and
hand-made selection functions reproduce them visit for visit."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch

from rlscale.zero.config import MCTSConfig
from rlscale.zero.forest import Forest
from rlscale.zero.games import make_game
from rlscale.zero.gumbel import gumbel_root, gumbel_root_selection
from rlscale.zero.mcts import expand_roots, root_stats, simulate
from rlscale.zero.network import PolicyValueNet
from rlscale.zero.puct import dirichlet_root_prior, puct_interior_selection
from rlscale.zero.search import search, search_states

torch.set_num_threads(1)


def positions(game, count, seed):
    rng, out = np.random.default_rng(seed), []
    while len(out) < count:
        state = game.initial_state()
        for _ in range(int(rng.integers(5))):
            state = game.apply(state, int(rng.choice(np.flatnonzero(game.legal_mask(state)))))
        if not game.is_terminal(state):
            out.append(state)
    return out


@pytest.fixture(scope="module", params=["tictactoe", "connect4"])
def setting(request):
    game = make_game(request.param)
    torch.manual_seed(0)
    net = PolicyValueNet(game.plane_shape, game.num_actions, blocks=1, channels=8,
                         value_hidden=8).eval()
    return game, net.evaluate, positions(game, 4, seed=1)


def fresh_forest(game, states, simulations):
    forest = Forest(game, len(states), capacity=simulations + 1)
    for i, state in enumerate(states):
        forest.reset(i, state)
    return forest


def hand_puct(config, prior_of):
    """PUCT written out per node in plain Python: Q + c * P * sqrt(N) / (1 + N_a), an
    unvisited child at the parent's mean value minus the FPU reduction, first best wins."""

    def select(forest, trees, where):
        actions = []
        for i, tree in enumerate(trees):
            node = 0 if prior_of is not None else int(where[i])
            prior = prior_of[where[i]] if prior_of is not None else forest.prior[tree, node]
            parent_n = forest.visits[tree, node] + forest.virtual[tree, node]
            parent_q = forest.value_sum[tree, node] / max(forest.visits[tree, node], 1)
            scale = config.c_puct * math.sqrt(parent_n)
            best, best_score = -1, -math.inf
            for a in np.flatnonzero(forest.legal[tree, node]):
                child = forest.children[tree, node, a]
                n = q = 0
                if child >= 0:
                    pending = forest.virtual[tree, child]
                    n = forest.visits[tree, child] + pending
                    same = forest.player[tree, child] == forest.player[tree, node]
                    value = (1.0 if same else -1.0) * forest.value_sum[tree, child]
                    q = (value - config.virtual_loss * pending) / max(n, 1)
                if n == 0:
                    q = parent_q - config.fpu_reduction
                score = q + scale * float(prior[a]) / (1.0 + n)
                if score > best_score:
                    best, best_score = int(a), score
            actions.append(best)
        return np.array(actions, np.int64)

    return select


@pytest.mark.parametrize("leaves_per_call", [1, 3])
def test_hand_made_puct_reproduces_the_puct_policy(setting, leaves_per_call):
    game, evaluate, states = setting
    config = MCTSConfig(simulations=30, leaves_per_call=leaves_per_call, fpu_reduction=0.1)
    named = search_states(game, states, evaluate, config, np.random.default_rng(4),
                          add_noise=True)

    rng = np.random.default_rng(4)
    forest = fresh_forest(game, states, config.simulations)
    roots = expand_roots(forest, evaluate, config, add_noise=True)
    root_prior = dirichlet_root_prior(roots, config, rng)  # the same noise draws
    simulate(forest, evaluate, config, roots, hand_puct(config, root_prior),
             hand_puct(config, None))
    np.testing.assert_array_equal(root_stats(forest, roots, config).visits, named.visit_counts)


def test_hand_made_root_reproduces_gumbel_with_one_considered_action(setting):
    """With one considered action, sequential halving sends every simulation to the top of
    g + logits: a root selection that always takes it gives the same visits."""
    game, evaluate, states = setting
    config = MCTSConfig(simulations=12, gumbel=True, gumbel_considered=1)
    named = search_states(game, states, evaluate, config, np.random.default_rng(2),
                          add_noise=True)

    rng = np.random.default_rng(2)
    forest = fresh_forest(game, states, config.simulations)
    roots = expand_roots(forest, evaluate, config, add_noise=True)
    logits = np.where(roots.legal, np.log(np.maximum(roots.prior, 1e-12)), -np.inf)
    top = np.argmax(rng.gumbel(size=logits.shape) + logits, -1)  # the same noise draw
    simulate(forest, evaluate, config, roots, lambda forest, trees, rows: top[rows],
             puct_interior_selection(config))
    visits = root_stats(forest, roots, config).visits
    np.testing.assert_array_equal(visits, named.visit_counts)
    assert (visits[np.arange(len(states)), top] == config.simulations).all()
    np.testing.assert_array_equal(named.chosen, top)


def test_gumbel_policy_is_the_search_with_its_selection_injected(setting):
    game, evaluate, states = setting
    config = MCTSConfig(simulations=20, gumbel=True, gumbel_considered=4, leaves_per_call=2)
    named = search_states(game, states, evaluate, config, np.random.default_rng(5),
                          add_noise=True)

    rng = np.random.default_rng(5)
    forest = fresh_forest(game, states, config.simulations)
    roots = expand_roots(forest, evaluate, config, add_noise=True)
    root = gumbel_root(forest, roots, config, rng)
    simulate(forest, evaluate, config, roots, gumbel_root_selection(root, config),
             puct_interior_selection(config))
    np.testing.assert_array_equal(root_stats(forest, roots, config).visits, named.visit_counts)


def test_an_injected_root_selection_is_obeyed():
    game = make_game("tictactoe")
    config = MCTSConfig(simulations=25)
    forest = fresh_forest(game, [game.initial_state()], config.simulations)
    roots = expand_roots(forest, lambda planes: (np.full((len(planes), 9), 1 / 9),
                                                 np.zeros(len(planes))), config)
    simulate(forest, lambda planes: (np.full((len(planes), 9), 1 / 9), np.zeros(len(planes))),
             config, roots, lambda forest, trees, rows: np.full(trees.size, 4),
             puct_interior_selection(config))
    visits = root_stats(forest, roots, config).visits[0]
    assert visits[4] == 25 and visits.sum() == 25


def test_a_forest_pickled_under_its_old_module_still_loads():
    """Checkpoints from before the search was split pickled `rlscale.zero.mcts.Forest`."""
    game = make_game("tictactoe")
    forest = fresh_forest(game, [game.initial_state()], 8)
    uniform = lambda planes: (np.full((len(planes), 9), 1 / 9), np.zeros(len(planes)))  # noqa: E731
    search(forest, uniform, MCTSConfig(simulations=8), np.random.default_rng(0))
    old = pickle.dumps(forest, protocol=0).replace(b"crlscale.zero.forest\nForest",
                                                   b"crlscale.zero.mcts\nForest")
    assert b"rlscale.zero.forest" not in old
    restored = pickle.loads(old)
    assert isinstance(restored, Forest)
    np.testing.assert_array_equal(restored.visits, forest.visits)
