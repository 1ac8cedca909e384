"""Gumbel root search (Danihelka et al. 2022, "Policy improvement by planning with Gumbel").

The root samples m actions without replacement by Gumbel top-k on the prior's logits, splits
the budget between them by sequential halving ranked on g + logits + sigma(Q), plays the
survivor, and returns the completed-Q improved policy softmax(logits + sigma(completed Q)) as
the training target. Below the root, nodes use PUCT (puct.py).

The schedule counts the root visits made by this search (pending ones included), not those a
reused subtree brought along: `GumbelRoot.visits_before` holds the latter.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .config import MCTSConfig
from .forest import Forest, children_stats
from .mcts import (
    Evaluator,
    RootActionSelection,
    Roots,
    SearchResult,
    expand_roots,
    root_stats,
    search_result,
    simulate,
)
from .proofs import PROOF_BONUS
from .puct import puct_interior_selection


@functools.lru_cache(maxsize=256)
def considered_visit_sequence(num_considered: int, num_simulations: int) -> tuple[int, ...]:
    """Sequential halving as a schedule: before simulation i, the root action to visit is one
    of the considered actions that currently have exactly `sequence[i]` visits (the
    best-scoring of them). Each phase gives the surviving actions equal visits, then halves."""
    if num_considered <= 1:
        return tuple(range(num_simulations))
    phases = math.ceil(math.log2(num_considered))
    sequence: list[int] = []
    visits = [0] * num_considered
    alive = num_considered
    while len(sequence) < num_simulations:
        per_action = max(1, num_simulations // (phases * alive))
        for _ in range(per_action):
            sequence.extend(visits[:alive])
            for i in range(alive):
                visits[i] += 1
        alive = max(2, alive // 2)
    return tuple(sequence[:num_simulations])


def gumbel_sigma(q: np.ndarray, visit_counts: np.ndarray, config: MCTSConfig) -> np.ndarray:
    # Values live in [-1, 1]; sigma is monotone in q and grows with the search's confidence.
    max_visits = visit_counts.max(-1, keepdims=True)
    return (config.gumbel_c_visit + max_visits) * config.gumbel_c_scale * (q + 1.0) / 2.0


def completed_q(
    q: np.ndarray, visit_counts: np.ndarray, prior: np.ndarray, raw_value: np.ndarray
) -> np.ndarray:
    """Q of visited children; unvisited ones get the mixed value estimate v_mix."""
    visited = visit_counts > 0
    total = visit_counts.sum(-1)
    prior_visited = (prior * visited).sum(-1)
    weighted_q = (prior * q * visited).sum(-1) / np.maximum(prior_visited, 1e-12)
    v_mix = np.where(
        total > 0, (raw_value + total * weighted_q) / (1.0 + total), raw_value
    )
    return np.where(visited, q, v_mix[:, None])


def _log_prior(prior: np.ndarray, legal: np.ndarray) -> np.ndarray:
    return np.where(legal, np.log(np.maximum(prior, 1e-12)), -np.inf)


def _softmax(x: np.ndarray) -> np.ndarray:
    z = x - x.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


@dataclass(frozen=True)
class GumbelRoot:
    """One search's Gumbel roots: noise, logits, the considered set and the schedule's inputs."""

    gumbel: np.ndarray  # [k, A] Gumbel noise (0 where the root takes no noise)
    logits: np.ndarray  # [k, A], -inf for illegal
    considered: np.ndarray  # [k, A] bool: the Gumbel top-m actions
    num_considered: np.ndarray  # [k]
    budget: np.ndarray  # [k]
    visits_before: np.ndarray  # [k, A] visits of each root child before this search


def gumbel_root(
    forest: Forest, roots: Roots, config: MCTSConfig, rng: np.random.Generator
) -> GumbelRoot:
    """Gumbel top-m over the roots' logits (noise drawn for every root, used where
    `add_noise`)."""
    logits = _log_prior(roots.prior, roots.legal)
    noise = np.where(roots.add_noise[:, None], rng.gumbel(size=logits.shape), 0.0)
    num_considered = np.minimum(config.gumbel_considered, roots.legal.sum(-1))
    ranked = np.argsort(-(noise + logits), -1, kind="stable")
    considered = np.zeros_like(roots.legal)
    for i in range(roots.trees.size):
        considered[i, ranked[i, : num_considered[i]]] = True
    _, visits_before, _, _ = children_stats(forest, roots.trees, np.zeros_like(roots.trees), 0.0)
    return GumbelRoot(noise, logits, considered, num_considered, np.maximum(roots.budget, 1),
                      visits_before)


def gumbel_scores(
    root: GumbelRoot, forest: Forest, trees: np.ndarray, rows: np.ndarray, config: MCTSConfig
) -> tuple[np.ndarray, np.ndarray]:
    """(g + logits + sigma(completed Q) of each root child [k, A], this search's visits of
    each root child, pending ones included [k, A])."""
    _, visits, q, proven = children_stats(
        forest, trees, np.zeros_like(trees), config.virtual_loss, config.propagate_proofs
    )
    prior = np.exp(root.logits[rows])
    completed = completed_q(q, visits, prior, forest.net_value[trees, 0])
    sigma = gumbel_sigma(completed, visits, config)
    scores = root.gumbel[rows] + root.logits[rows] + sigma + PROOF_BONUS * proven
    return scores, (visits - root.visits_before[rows]).astype(np.int64)


def gumbel_root_selection(root: GumbelRoot, config: MCTSConfig) -> RootActionSelection:
    """Sequential halving: the best-scoring considered action among those with the visit
    count the schedule asks for next."""

    def select(forest: Forest, trees: np.ndarray, rows: np.ndarray) -> np.ndarray:
        scores, search_visits = gumbel_scores(root, forest, trees, rows, config)
        wanted = np.array([
            considered_visit_sequence(int(m), int(b))[min(int(n), int(b) - 1)]
            for m, b, n in zip(
                root.num_considered[rows], root.budget[rows], search_visits.sum(-1), strict=True,
            )
        ])
        ok = root.considered[rows] & (search_visits == wanted[:, None])
        # If reuse or collisions leave no action at the scheduled count, fall back to the
        # least-visited considered actions.
        none = ~ok.any(-1)
        if none.any():
            sv = np.where(root.considered[rows], search_visits, np.iinfo(np.int64).max)
            ok[none] = sv[none] == sv[none].min(-1, keepdims=True)
        return np.argmax(np.where(ok, scores, -np.inf), -1)

    return select


def gumbel_policy(
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
    """Gumbel search from the roots of `trees`: target = the completed-Q improved policy;
    move = the sequential-halving survivor. `add_noise` adds the Gumbel noise (self-play);
    `temperature` is unused: the noise is the sampling."""
    roots = expand_roots(forest, evaluator, config, trees, simulations, add_noise)
    root = gumbel_root(forest, roots, config, rng)
    simulate(forest, evaluator, config, roots, gumbel_root_selection(root, config),
             puct_interior_selection(config))
    stats = root_stats(forest, roots, config)
    trees, rows = roots.trees, np.arange(roots.trees.size)
    completed = completed_q(stats.q, stats.visits, roots.prior, forest.net_value[trees, 0])
    policy = _softmax(root.logits + gumbel_sigma(completed, stats.visits, config))
    scores, search_visits = gumbel_scores(root, forest, trees, rows, config)
    sv = np.where(root.considered, search_visits, -1)
    best = root.considered & (sv == sv.max(-1, keepdims=True))
    chosen = np.argmax(np.where(best, scores, -np.inf), -1)
    return search_result(forest, roots, stats, policy, chosen, config)
