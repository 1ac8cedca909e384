"""Batched Monte Carlo tree search with the action selection injected (the mctx shape).

Many trees are searched in lockstep: every simulation step selects one leaf (or a few, with
virtual loss) in each tree, evaluates all of them in ONE evaluator call, and backs the values
up. The trees live in a `Forest` of arrays (forest.py), so selection is a few numpy
operations over all trees at once; only the game rules (`apply`, `planes`) run per leaf in
Python.

What a search does at a node is not decided here: `simulate` takes a
`root_action_selection_fn` and an `interior_action_selection_fn`, and a policy builds them
and turns the root's statistics into a move and a training target: PUCT (puct.py) and Gumbel
(gumbel.py); search.py picks the one a config asks for. A policy is
`expand_roots` -> its root selection -> `simulate` -> `root_stats` -> `search_result`.

Leaf parallelism: with `leaves_per_call > 1` each tree is descended several times per
evaluator call; every pending visit counts as a loss (`virtual_loss`) along its path, so
the next descent goes elsewhere. A descent that reaches a leaf already pending in the same
call is a collision: it is dropped and ends that tree's share of the call, so a batch never
evaluates one leaf twice.

Evaluators are callables `(planes [B, *plane_shape]) -> (priors [B, A], values [B])`, with
priors over all actions (the search masks illegal ones) and values from the view of the
player to move.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from .config import MCTSConfig
from .forest import Forest, children_stats  # Forest: also the name old checkpoints pickled
from .games.base import Game
from .proofs import prefer_proven, propagate_proof

NEW, TERMINAL, COLLISION = 0, 1, 2  # how a selection ended


class Evaluator(Protocol):
    def __call__(self, batch: Any) -> tuple[np.ndarray, np.ndarray]: ...


RootActionSelection = Callable[[Forest, np.ndarray, np.ndarray], np.ndarray]
"""(forest, trees, rows) -> the action to take at each tree's root; `rows` are the trees'
rows in the search's own per-root arrays (`Roots`, the policy's root state)."""

InteriorActionSelection = Callable[[Forest, np.ndarray, np.ndarray], np.ndarray]
"""(forest, trees, nodes) -> the action to take at each (expanded, non-root) node."""


@dataclass(frozen=True)
class SearchResult:
    """What one search returns for each of its trees (first axis = the searched trees)."""

    visit_counts: np.ndarray  # [k, A] visits of each root child
    policy: np.ndarray  # [k, A] training target: visit distribution, or Gumbel improved policy
    prior: np.ndarray  # [k, A] network prior at the root (legal-masked, before noise)
    q_values: np.ndarray  # [k, A] mean value of each root child, root player's view (0 unvisited)
    root_value: np.ndarray  # [k] mean value at the root, from the view of the player to move
    chosen: np.ndarray  # [k] the move to play
    simulations: int  # simulations run per tree (the largest budget in the call)


@dataclass(frozen=True)
class Roots:
    """The roots of one search, expanded: what a policy builds its root selection from."""

    trees: np.ndarray  # [k] the searched trees
    budget: np.ndarray  # [k] simulations per tree
    add_noise: np.ndarray  # [k] bool: root exploration noise (self-play)
    prior: np.ndarray  # [k, A] network prior (legal-masked, before noise)
    legal: np.ndarray  # [k, A]


@dataclass(frozen=True)
class RootStats:
    """The roots' children after the simulations, from the root player's view."""

    visits: np.ndarray  # [k, A]
    q: np.ndarray  # [k, A] mean value (0 unvisited; exact where proven, with proofs)
    proven: np.ndarray  # [k, A] +1 win, -1 loss, 0 unknown (or proofs off)


# -- evaluation ----------------------------------------------------------------------------


def _evaluate(game: Game, evaluator: Evaluator, states: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    priors, values = evaluator(np.stack([game.planes(s) for s in states]))
    return np.asarray(priors, np.float32), np.asarray(values, np.float32).reshape(-1)


def _masked_priors(priors: np.ndarray, legal: np.ndarray) -> np.ndarray:
    p = np.where(legal, priors, 0.0)
    total = p.sum(-1, keepdims=True)
    uniform = legal / np.maximum(legal.sum(-1, keepdims=True), 1)
    return np.where(total > 0, p / np.where(total > 0, total, 1.0), uniform).astype(np.float32)


def _expand(forest: Forest, trees: np.ndarray, nodes: np.ndarray, evaluator: Evaluator) -> np.ndarray:
    """Evaluate and expand the given (non-terminal) nodes; returns their values."""
    if trees.size == 0:
        return np.zeros(0, np.float32)
    game = forest.game
    states = [forest.states[t][n] for t, n in zip(trees, nodes, strict=True)]
    legal = np.stack([game.legal_mask(s) for s in states])
    priors, values = _evaluate(game, evaluator, states)
    forest.legal[trees, nodes] = legal
    forest.prior[trees, nodes] = _masked_priors(priors, legal)
    forest.net_value[trees, nodes] = values
    forest.expanded[trees, nodes] = True
    return values


class UniformEvaluator:
    """Uniform priors and value 0: MCTS with no knowledge (tests, baselines)."""

    def __init__(self, num_actions: int) -> None:
        self.num_actions = num_actions

    def __call__(self, planes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = len(planes)
        return np.full((n, self.num_actions), 1.0 / self.num_actions, np.float32), np.zeros(n)


# -- one search: roots, simulations, statistics ----------------------------------------------


def expand_roots(
    forest: Forest,
    evaluator: Evaluator,
    config: MCTSConfig,
    trees: Sequence[int] | np.ndarray | None = None,
    simulations: int | np.ndarray | None = None,
    add_noise: bool | np.ndarray = False,
) -> Roots:
    """Expand the fresh roots of `trees` (all by default); a root's own evaluation counts as
    its first visit. `simulations`: per tree, default config.simulations."""
    trees = np.arange(forest.num_trees) if trees is None else np.asarray(trees, np.int64)
    k = trees.size
    budget = np.broadcast_to(
        np.asarray(config.simulations if simulations is None else simulations, np.int64), (k,)
    ).copy()
    add_noise = np.broadcast_to(np.asarray(add_noise, bool), (k,))
    if forest.terminal[trees, 0].any():
        raise ValueError("cannot search from a terminal position")
    fresh = trees[~forest.expanded[trees, 0]]
    values = _expand(forest, fresh, np.zeros_like(fresh), evaluator)
    forest.visits[fresh, 0] += 1
    forest.value_sum[fresh, 0] += values
    return Roots(trees, budget, add_noise, forest.prior[trees, 0].copy(), forest.legal[trees, 0])


def _select(
    forest: Forest,
    trees: np.ndarray,
    rows: np.ndarray,
    root_action_selection_fn: RootActionSelection,
    interior_action_selection_fn: InteriorActionSelection,
    config: MCTSConfig,
) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """Descend one path in each of `trees` (rows `rows` of the search's per-root arrays).

    Returns (path: per depth an array of node indices, -1 where the tree had stopped;
    leaf node per tree; how each selection ended: NEW, TERMINAL or COLLISION)."""
    k = trees.size
    node = np.zeros(k, np.int64)
    leaf = np.full(k, -1, np.int64)
    kind = np.full(k, NEW, np.int8)
    path = [node.copy()]
    live = np.arange(k)
    depth = 0
    while live.size:
        t, n = trees[live], node[live]
        if depth == 0:
            actions = root_action_selection_fn(forest, t, rows[live])
        else:
            actions = interior_action_selection_fn(forest, t, n)
        child = forest.children[t, n, actions].astype(np.int64)
        created = child < 0
        for i in np.flatnonzero(created):  # an unexplored edge: the new node is the leaf
            child[i] = forest.add_child(int(t[i]), int(n[i]), int(actions[i]))
        step = np.full(k, -1, np.int64)
        step[live] = child
        path.append(step)
        node[live] = child
        terminal = forest.terminal[t, child]
        if config.propagate_proofs:  # a proven node is as good as a terminal one
            terminal = terminal | (forest.proven[t, child] != 0)
        # An existing child that is not expanded is a leaf still waiting for its evaluation
        # in this call: selecting it again would evaluate it twice.
        pending = ~created & ~terminal & ~forest.expanded[t, child]
        kind[live[terminal]] = TERMINAL
        kind[live[pending]] = COLLISION
        stop = created | terminal | pending
        leaf[live[stop]] = child[stop]
        live = live[~stop]
        depth += 1
    return path, leaf, kind


def _backup(
    forest: Forest, trees: np.ndarray, path: list[np.ndarray], leaf: np.ndarray,
    leaf_value: np.ndarray,
) -> None:
    """Add each leaf's value to the nodes on its path and release their virtual loss."""
    leaf_player = forest.player[trees, leaf]
    for nodes in path:
        ok = nodes >= 0
        t, n = trees[ok], nodes[ok]
        sign = np.where(forest.player[t, n] == leaf_player[ok], 1.0, -1.0)
        forest.value_sum[t, n] += sign * leaf_value[ok]
        forest.visits[t, n] += 1
        forest.virtual[t, n] -= 1


Pass = tuple[np.ndarray, list[np.ndarray], np.ndarray, np.ndarray]  # rows, path, leaf, kind


def _descend(
    forest: Forest, roots: Roots, done: np.ndarray, in_call: np.ndarray,
    root_action_selection_fn: RootActionSelection,
    interior_action_selection_fn: InteriorActionSelection, config: MCTSConfig,
) -> list[Pass]:
    """Up to `leaves_per_call` descents per tree with budget left, each path under virtual
    loss until its leaf is evaluated; counts the kept ones in `in_call`."""
    trees, budget = roots.trees, roots.budget
    blocked = np.zeros(trees.size, bool)
    passes = []
    for _ in range(config.leaves_per_call):
        rows = np.flatnonzero(~blocked & (done + in_call < budget))
        if rows.size == 0:
            break
        path, leaf, kind = _select(forest, trees[rows], rows, root_action_selection_fn,
                                   interior_action_selection_fn, config)
        collided = kind == COLLISION
        blocked[rows[collided]] = True  # a collision ends this tree's batch for this call
        keep = ~collided
        rows, leaf, kind = rows[keep], leaf[keep], kind[keep]
        path = [p[keep] for p in path]
        for nodes in path:  # virtual loss on the whole path while the leaf is pending
            ok = nodes >= 0
            forest.virtual[trees[rows][ok], nodes[ok]] += 1
        in_call[rows] += 1
        passes.append((rows, path, leaf, kind))
    return passes


def _evaluate_and_back_up(
    forest: Forest, trees: np.ndarray, passes: list[Pass], evaluator: Evaluator,
    config: MCTSConfig,
) -> None:
    """One evaluator call for every new leaf of every tree, then every pass backed up."""
    new_t = np.concatenate([trees[p][kd == NEW] for p, _, _, kd in passes])
    new_n = np.concatenate([lf[kd == NEW] for _, _, lf, kd in passes])
    new_values = _expand(forest, new_t, new_n, evaluator)
    offset = 0
    for rows, path, leaf, kind in passes:
        t = trees[rows]
        value = np.where(
            forest.terminal[t, leaf], forest.terminal_value[t, leaf], forest.proven[t, leaf]
        ).astype(np.float64)
        is_new = kind == NEW
        value[is_new] = new_values[offset : offset + is_new.sum()]
        offset += int(is_new.sum())
        _backup(forest, t, path, leaf, value)
        if config.propagate_proofs:
            for i in np.flatnonzero(forest.proven[t, leaf] != 0):
                propagate_proof(forest, int(t[i]), int(leaf[i]))


def simulate(
    forest: Forest,
    evaluator: Evaluator,
    config: MCTSConfig,
    roots: Roots,
    root_action_selection_fn: RootActionSelection,
    interior_action_selection_fn: InteriorActionSelection,
) -> None:
    """Run each root's budget of simulations, choosing actions with the two selection
    functions (see the module docstring)."""
    forest.ensure_capacity(int(roots.budget.max(initial=0)) + 1)
    done = np.zeros(roots.trees.size, np.int64)
    while (done < roots.budget).any():
        in_call = np.zeros(roots.trees.size, np.int64)
        passes = _descend(forest, roots, done, in_call, root_action_selection_fn,
                          interior_action_selection_fn, config)
        _evaluate_and_back_up(forest, roots.trees, passes, evaluator, config)
        done += in_call


def root_stats(forest: Forest, roots: Roots, config: MCTSConfig) -> RootStats:
    _, visits, q, proven = children_stats(
        forest, roots.trees, np.zeros_like(roots.trees), 0.0, config.propagate_proofs
    )
    return RootStats(visits, q, proven)


def search_result(
    forest: Forest, roots: Roots, stats: RootStats, policy: np.ndarray, chosen: np.ndarray,
    config: MCTSConfig,
) -> SearchResult:
    """The SearchResult of a policy's target and move; with proofs, a proven win is played
    and a proven loss avoided whatever the policy chose."""
    trees = roots.trees
    root_value = forest.value_sum[trees, 0] / np.maximum(forest.visits[trees, 0], 1)
    if config.propagate_proofs:
        prefer_proven(chosen, forest.legal[trees, 0], stats.proven, stats.visits)
    return SearchResult(
        visit_counts=stats.visits.astype(np.int64),
        policy=policy.astype(np.float32),
        prior=roots.prior,
        q_values=stats.q.astype(np.float32),
        root_value=root_value.astype(np.float32),
        chosen=chosen.astype(np.int64),
        simulations=int(roots.budget.max()),
    )
