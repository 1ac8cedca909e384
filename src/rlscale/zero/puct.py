"""PUCT (AlphaZero): the selection rule at every node, and the PUCT search policy.

Selection at a node: argmax_a Q(a) + c * P(a) * sqrt(N) / (1 + N(a)), N counting the node's
own first evaluation so the prior matters from the first simulation (with `c_puct_base`, c
grows with N as in AlphaZero). First-play urgency: an unvisited child's Q is the parent's mean
value minus `fpu_reduction` (0 by default: "as good as the position so far", which neither
forces every move to be tried once, as Q=+1 would, nor writes moves off, as Q=-1 would).

`puct_policy`: Dirichlet noise on the root prior for self-play, PUCT everywhere, the visit
distribution as the training target, and the move by temperature over the visits. The Gumbel
policy (gumbel.py) uses the same rule below its root.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .config import MCTSConfig
from .forest import Forest, children_stats
from .mcts import (
    Evaluator,
    InteriorActionSelection,
    RootActionSelection,
    Roots,
    SearchResult,
    expand_roots,
    root_stats,
    search_result,
    simulate,
)
from .proofs import PROOF_BONUS


def puct_scores(
    forest: Forest,
    trees: np.ndarray,
    nodes: np.ndarray,
    prior: np.ndarray,
    config: MCTSConfig,
) -> np.ndarray:
    _, child_visits, q, proven = children_stats(
        forest, trees, nodes, config.virtual_loss, config.propagate_proofs
    )
    parent_visits = forest.visits[trees, nodes] + forest.virtual[trees, nodes]
    parent_q = forest.value_sum[trees, nodes] / np.maximum(forest.visits[trees, nodes], 1)
    q = np.where(child_visits > 0, q, (parent_q - config.fpu_reduction)[:, None])
    c = np.full(parent_visits.shape, config.c_puct)
    if config.c_puct_base is not None:
        c = c + np.log((1.0 + parent_visits + config.c_puct_base) / config.c_puct_base)
    u = (c * np.sqrt(parent_visits))[:, None] * prior / (1.0 + child_visits)
    # A proven win is always taken and a proven loss only when every move loses.
    return np.where(forest.legal[trees, nodes], q + u + PROOF_BONUS * proven, -np.inf)


def puct_interior_selection(config: MCTSConfig) -> InteriorActionSelection:
    """PUCT on the network's prior at the node."""

    def select(forest: Forest, trees: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        return np.argmax(puct_scores(forest, trees, nodes, forest.prior[trees, nodes], config), -1)

    return select


def puct_root_selection(root_prior: np.ndarray, config: MCTSConfig) -> RootActionSelection:
    """PUCT at the roots on `root_prior` [k, A] (the prior, noised for self-play)."""

    def select(forest: Forest, trees: np.ndarray, rows: np.ndarray) -> np.ndarray:
        nodes = np.zeros_like(trees)
        return np.argmax(puct_scores(forest, trees, nodes, root_prior[rows], config), -1)

    return select


def dirichlet_root_prior(roots: Roots, config: MCTSConfig, rng: np.random.Generator) -> np.ndarray:
    """The root prior with Dirichlet noise mixed into the legal moves of the roots that
    `add_noise` (alpha: config.dirichlet_alpha, else 10 / legal moves)."""
    root_prior = roots.prior.copy()
    for i in np.flatnonzero(roots.add_noise):
        moves = np.flatnonzero(roots.legal[i])
        alpha = config.dirichlet_alpha or 10.0 / moves.size
        eps = config.dirichlet_fraction
        root_prior[i, moves] = (1 - eps) * roots.prior[i, moves] + eps * rng.dirichlet(
            np.full(moves.size, alpha)
        )
    return root_prior


def choose_by_temperature(
    visits: np.ndarray, legal: np.ndarray, temperature: float | np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Per row: sample from visits^(1/tau) if tau > 0, else the most visited legal move."""
    k = visits.shape[0]
    tau = np.broadcast_to(np.asarray(temperature, np.float64), (k,))
    chosen = np.argmax(np.where(legal, visits, -1), -1)
    for i in np.flatnonzero(tau > 0):
        weights = np.where(legal[i], visits[i].astype(np.float64), 0.0) ** (1.0 / tau[i])
        if weights.sum() > 0:
            chosen[i] = rng.choice(weights.size, p=weights / weights.sum())
    return chosen


def puct_policy(
    forest: Forest,
    evaluator: Evaluator,
    config: MCTSConfig,
    rng: np.random.Generator,
    *,
    trees: Sequence[int] | np.ndarray | None = None,
    simulations: int | np.ndarray | None = None,
    add_noise: bool | np.ndarray = False,
    temperature: float | np.ndarray = 0.0,
) -> SearchResult:
    """PUCT search from the roots of `trees`: target = the visit distribution (the prior
    where nothing was visited); move: temperature > 0 samples from visits^(1/tau), 0 takes
    the most visited."""
    roots = expand_roots(forest, evaluator, config, trees, simulations, add_noise)
    root_prior = dirichlet_root_prior(roots, config, rng)
    simulate(forest, evaluator, config, roots, puct_root_selection(root_prior, config),
             puct_interior_selection(config))
    stats = root_stats(forest, roots, config)
    total = stats.visits.sum(-1, keepdims=True)
    policy = np.where(total > 0, stats.visits / np.maximum(total, 1), roots.prior)
    chosen = choose_by_temperature(stats.visits, roots.legal, temperature, rng)
    return search_result(forest, roots, stats, policy, chosen, config)
