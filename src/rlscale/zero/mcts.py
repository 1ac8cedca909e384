"""Batched Monte Carlo tree search: PUCT (AlphaZero) and Gumbel root search (Gumbel MuZero).

Many trees are searched in lockstep: every simulation step selects one leaf (or a few, with
virtual loss) in each tree, evaluates all of them in ONE evaluator call, and backs the values
up. The trees live in a `Forest` of arrays indexed [tree, node, ...], so selection is a few
numpy operations over all trees at once; only the game rules (`apply`, `planes`) run per leaf
in Python.

Sign convention: every value is from the view of the player to move at the node that holds
it. A child's value is seen by its parent through `sign = +1 if same player else -1`
(always -1 in alternating games; kept general for games where a player can move twice).

Selection at a node: PUCT, argmax_a Q(a) + c * P(a) * sqrt(N) / (1 + N(a)), N counting the
node's own first evaluation so the prior matters from the first simulation. First-play
urgency: an unvisited child's Q is the parent's mean value minus `fpu_reduction` (0 by
default: "as good as the position so far", which neither forces every move to be tried once,
as Q=+1 would, nor writes moves off, as Q=-1 would).

Leaf parallelism: with `leaves_per_call > 1` each tree is descended several times per
evaluator call; every pending visit counts as a loss (`virtual_loss`) along its path, so
the next descent goes elsewhere. A descent that reaches a leaf already pending in the same
call is a collision: it is dropped and ends that tree's share of the call, so a batch never
evaluates one leaf twice.

Gumbel (Danihelka et al. 2022, "Policy improvement by planning with Gumbel"): the root
samples m actions without replacement by Gumbel top-k on the prior's logits, splits the
budget between them by sequential halving ranked on g + logits + sigma(Q), plays the
survivor, and returns the completed-Q improved policy softmax(logits + sigma(completed Q))
as the training target. Below the root, nodes use PUCT.

Evaluators are callables `(planes [B, *plane_shape]) -> (priors [B, A], values [B])`, with
priors over all actions (the search masks illegal ones) and values from the view of the
player to move.

Pure MCTS (`uct_search`, the `mcts:N` baseline of the arena) is the knowledge-free search of
AlphaZero papers and of OpenSpiel's MCTSBot: UCT (UCB1 selection with c = 2, untried moves
first), one node added and one uniformly random playout per simulation, the most visited
move. It searches one position at a time with nodes as Python objects: with no network to
batch, that is many times faster per simulation than the array forest. A game may offer a
compiled `random_playout(state, rng)` (Connect Four does); others play out through the
Game protocol.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from rlscale.zero.config import MCTSConfig
from rlscale.zero.games.base import Game

NEW, TERMINAL, COLLISION = 0, 1, 2  # how a selection ended


class Evaluator(Protocol):
    def __call__(self, batch: Any) -> tuple[np.ndarray, np.ndarray]: ...


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


class Forest:
    """Search trees for `num_trees` games as arrays; node 0 of each tree is its root."""

    def __init__(self, game: Game, num_trees: int, capacity: int = 64) -> None:
        self.game = game
        self.num_trees = num_trees
        self.num_actions = game.num_actions
        self.capacity = 0
        self._allocate(capacity)
        self.num_nodes = np.zeros(num_trees, np.int64)
        self.states: list[list[Any]] = [[] for _ in range(num_trees)]

    # -- storage -------------------------------------------------------------------------
    _FIELDS = {  # name: (dtype, per-action?, fill)
        "children": (np.int32, True, -1),
        "prior": (np.float32, True, 0.0),
        "legal": (np.bool_, True, False),
        "visits": (np.int32, False, 0),
        "value_sum": (np.float64, False, 0.0),
        "virtual": (np.int32, False, 0),  # pending (in-flight) visits for virtual loss
        "player": (np.int8, False, 0),
        "terminal": (np.bool_, False, False),
        "terminal_value": (np.float32, False, 0.0),
        "proven": (np.int8, False, 0),  # +1/-1: the player to move wins/loses with best play
        "expanded": (np.bool_, False, False),
        "net_value": (np.float32, False, 0.0),
        "parent": (np.int32, False, -1),
        "action": (np.int32, False, -1),
    }

    def _blank(self, name: str, capacity: int) -> np.ndarray:
        dtype, per_action, fill = self._FIELDS[name]
        shape = (self.num_trees, capacity) + ((self.num_actions,) if per_action else ())
        return np.full(shape, fill, dtype=dtype)

    def _allocate(self, capacity: int) -> None:
        old = self.capacity
        for name in self._FIELDS:
            arr = self._blank(name, capacity)
            if old:
                arr[:, :old] = getattr(self, name)
            setattr(self, name, arr)
        self.capacity = capacity

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickle a forest saved by an older version (e.g. in a resumed run's actor): a
        field it lacks is filled with its default; `proven` is derived from the terminals."""
        self.__dict__.update(state)
        for name in self._FIELDS.keys() - state.keys():
            setattr(self, name, self._blank(name, self.capacity))
        if "proven" not in state:
            self.proven[...] = np.where(self.terminal, np.sign(self.terminal_value), 0)

    def ensure_capacity(self, extra_nodes: int) -> None:
        need = int(self.num_nodes.max(initial=0)) + extra_nodes
        if need > self.capacity:
            self._allocate(max(need, 2 * self.capacity))

    def _clear_rows(self, tree: int, start: int, stop: int) -> None:
        for name, (_, _, fill) in self._FIELDS.items():
            getattr(self, name)[tree, start:stop] = fill

    # -- per-tree operations ---------------------------------------------------------------
    def reset(self, tree: int, state: Any) -> None:
        """Start a fresh tree at `state` (its root is expanded by the next search)."""
        self._clear_rows(tree, 0, int(self.num_nodes[tree]))
        self.num_nodes[tree] = 1
        self.states[tree] = [state]
        self._set_node(tree, 0, state)

    def _set_node(self, tree: int, node: int, state: Any) -> None:
        game = self.game
        player = game.to_play(state)
        self.player[tree, node] = player
        if game.is_terminal(state):
            self.terminal[tree, node] = True
            outcome = game.outcome(state)
            self.terminal_value[tree, node] = outcome if player == 0 else -outcome
            self.proven[tree, node] = np.sign(self.terminal_value[tree, node])

    def root_state(self, tree: int) -> Any:
        return self.states[tree][0]

    def advance(self, tree: int, action: int, reuse: bool = True) -> Any:
        """Play `action` at the root; keep the chosen child's subtree if `reuse`.

        Returns the new root state. Node statistics of the kept subtree are unchanged, so
        the next search starts with the visits already spent below that move."""
        child = int(self.children[tree, 0, action])
        if not reuse or child < 0 or not self.expanded[tree, child]:
            state = self.game.apply(self.states[tree][0], action)
            self.reset(tree, state)
            return state
        # Breadth-first list of the subtree's nodes; their new indices are their positions.
        order = [np.array([child])]
        frontier = order[0]
        while frontier.size:
            kids = self.children[tree, frontier].ravel()
            frontier = kids[kids >= 0]
            order.append(frontier)
        keep = np.concatenate(order)
        count, old_count = keep.size, int(self.num_nodes[tree])
        remap = np.full(old_count + 1, -1, np.int32)  # remap[-1] = -1 stays "no node"
        remap[keep] = np.arange(count, dtype=np.int32)
        for name in self._FIELDS:
            arr = getattr(self, name)
            arr[tree, :count] = arr[tree, keep]
        self.children[tree, :count] = remap[self.children[tree, :count]]
        self.parent[tree, :count] = remap[self.parent[tree, :count]]
        self.parent[tree, 0] = -1
        self.action[tree, 0] = -1
        self._clear_rows(tree, count, old_count)
        self.num_nodes[tree] = count
        self.states[tree] = [self.states[tree][i] for i in keep]
        return self.states[tree][0]


# -- evaluation helpers --------------------------------------------------------------------


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


# -- Gumbel helpers ------------------------------------------------------------------------


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


def _gumbel_sigma(q: np.ndarray, visit_counts: np.ndarray, config: MCTSConfig) -> np.ndarray:
    # Values live in [-1, 1]; sigma is monotone in q and grows with the search's confidence.
    max_visits = visit_counts.max(-1, keepdims=True)
    return (config.gumbel_c_visit + max_visits) * config.gumbel_c_scale * (q + 1.0) / 2.0


def _completed_q(
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


# -- the search ------------------------------------------------------------------------------


def _children_stats(
    forest: Forest, trees: np.ndarray, nodes: np.ndarray, virtual_loss: float,
    proofs: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(children [k, A], visits incl. pending [k, A], Q from the parent's view [k, A],
    proven result from the parent's view [k, A]: +1 win, -1 loss, 0 unknown or unused).
    With `proofs`, a proven child's Q is its exact value."""
    children = forest.children[trees, nodes]
    has = children >= 0
    idx = np.where(has, children, 0)
    t = trees[:, None]
    pending = np.where(has, forest.virtual[t, idx], 0)
    visits = np.where(has, forest.visits[t, idx], 0) + pending
    sign = np.where(forest.player[t, idx] == forest.player[trees, nodes][:, None], 1.0, -1.0)
    value = sign * forest.value_sum[t, idx] - virtual_loss * pending
    q = np.where(visits > 0, value / np.maximum(visits, 1), 0.0)
    proven = np.zeros(q.shape, np.int8)
    if proofs:
        proven = (np.where(has, forest.proven[t, idx], 0) * sign).astype(np.int8)
        q = np.where(proven != 0, proven, q)
    return children, visits, q, proven


def _puct_scores(
    forest: Forest,
    trees: np.ndarray,
    nodes: np.ndarray,
    prior: np.ndarray,
    config: MCTSConfig,
) -> np.ndarray:
    _, child_visits, q, proven = _children_stats(
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
    return np.where(forest.legal[trees, nodes], q + u + _PROOF_BONUS * proven, -np.inf)


@dataclass
class _Gumbel:
    """Per-search state of the Gumbel root: noise, logits, considered set, this search's visits."""

    gumbel: np.ndarray  # [k, A]
    logits: np.ndarray  # [k, A], -inf for illegal
    considered: np.ndarray  # [k, A] bool: the Gumbel top-m actions
    num_considered: np.ndarray  # [k]
    search_visits: np.ndarray  # [k, A] root visits made by this search (incl. pending)
    budget: np.ndarray  # [k]

    def scores(self, forest: Forest, trees: np.ndarray, pos: np.ndarray, config: MCTSConfig):
        _, visits, q, proven = _children_stats(
            forest, trees, np.zeros_like(trees), config.virtual_loss, config.propagate_proofs
        )
        prior = np.exp(self.logits[pos])
        completed = _completed_q(q, visits, prior, forest.net_value[trees, 0])
        sigma = _gumbel_sigma(completed, visits, config)
        return self.gumbel[pos] + self.logits[pos] + sigma + _PROOF_BONUS * proven

    def root_actions(self, forest, trees, pos, config) -> np.ndarray:
        scores = self.scores(forest, trees, pos, config)
        wanted = np.array([
            considered_visit_sequence(int(m), int(b))[min(int(n), int(b) - 1)]
            for m, b, n in zip(
                self.num_considered[pos], self.budget[pos],
                self.search_visits[pos].sum(-1), strict=True,
            )
        ])
        ok = self.considered[pos] & (self.search_visits[pos] == wanted[:, None])
        # If reuse or collisions leave no action at the scheduled count, fall back to the
        # least-visited considered actions.
        none = ~ok.any(-1)
        if none.any():
            sv = np.where(self.considered[pos], self.search_visits[pos], np.iinfo(np.int64).max)
            ok[none] = sv[none] == sv[none].min(-1, keepdims=True)
        return np.argmax(np.where(ok, scores, -np.inf), -1)


def _select(
    forest: Forest,
    trees: np.ndarray,
    root_prior: np.ndarray,
    pos: np.ndarray,
    gumbel: _Gumbel | None,
    config: MCTSConfig,
) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """Descend one path in each of `trees` (positions `pos` in the search's arrays).

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
        if depth == 0 and gumbel is not None:
            actions = gumbel.root_actions(forest, t, pos[live], config)
        else:
            prior = root_prior[pos[live]] if depth == 0 else forest.prior[t, n]
            actions = np.argmax(_puct_scores(forest, t, n, prior, config), -1)
        child = forest.children[t, n, actions].astype(np.int64)
        created = child < 0
        for i in np.flatnonzero(created):  # an unexplored edge: the new node is the leaf
            tree, parent, action = int(t[i]), int(n[i]), int(actions[i])
            state = forest.game.apply(forest.states[tree][parent], action)
            new = int(forest.num_nodes[tree])
            forest.num_nodes[tree] += 1
            forest.states[tree].append(state)
            forest.children[tree, parent, action] = new
            forest.parent[tree, new] = parent
            forest.action[tree, new] = action
            forest._set_node(tree, new, state)
            child[i] = new
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


_PROOF_BONUS = 1e6  # added to selection scores of proven wins (and subtracted for losses)


def _propagate_proof(forest: Forest, tree: int, node: int) -> None:
    """MCTS-Solver (Winands et al. 2008): a node is won if some move reaches a position lost
    for the opponent, and lost if every move reaches a position won for the opponent. Walk
    up from a newly proven node while that makes its parent proven too."""
    while True:
        parent = int(forest.parent[tree, node])
        if parent < 0 or forest.proven[tree, parent] != 0:
            return
        kids = forest.children[tree, parent]
        legal = forest.legal[tree, parent]
        has = kids >= 0
        idx = np.where(has, kids, 0)
        same = forest.player[tree, idx] == forest.player[tree, parent]
        view = np.where(has, np.where(same, 1, -1) * forest.proven[tree, idx], 0)
        if (view > 0).any():
            forest.proven[tree, parent] = 1
        elif (legal & (view < 0)).sum() == legal.sum():
            forest.proven[tree, parent] = -1
        else:
            return
        node = parent


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


def search(
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
    """Run `simulations` (per tree, default config.simulations) from the roots of `trees`.

    add_noise: root exploration for self-play — Dirichlet noise on the priors (PUCT) or
    Gumbel noise on the sampled actions (Gumbel). Never used in evaluation.
    temperature: PUCT move choice; > 0 samples from visits^(1/tau), 0 takes the most
    visited. The Gumbel search chooses by sequential halving (its noise is the sampling).
    """
    trees = np.arange(forest.num_trees) if trees is None else np.asarray(trees, np.int64)
    k = trees.size
    budget = np.broadcast_to(
        np.asarray(config.simulations if simulations is None else simulations, np.int64), (k,)
    ).copy()
    add_noise = np.broadcast_to(np.asarray(add_noise, bool), (k,))
    if forest.terminal[trees, 0].any():
        raise ValueError("cannot search from a terminal position")

    # Expand fresh roots; a root's own evaluation counts as its first visit.
    fresh = trees[~forest.expanded[trees, 0]]
    values = _expand(forest, fresh, np.zeros_like(fresh), evaluator)
    forest.visits[fresh, 0] += 1
    forest.value_sum[fresh, 0] += values

    raw_prior = forest.prior[trees, 0].copy()
    legal = forest.legal[trees, 0]
    root_prior = raw_prior.copy()
    gumbel = None
    if config.gumbel:
        logits = _log_prior(raw_prior, legal)
        noise = np.where(add_noise[:, None], rng.gumbel(size=logits.shape), 0.0)
        num_considered = np.minimum(config.gumbel_considered, legal.sum(-1))
        ranked = np.argsort(-(noise + logits), -1, kind="stable")
        considered = np.zeros_like(legal)
        for i in range(k):
            considered[i, ranked[i, : num_considered[i]]] = True
        gumbel = _Gumbel(
            noise, logits, considered, num_considered, np.zeros(legal.shape, np.int64),
            np.maximum(budget, 1),
        )
    else:
        for i in np.flatnonzero(add_noise):
            moves = np.flatnonzero(legal[i])
            alpha = config.dirichlet_alpha or 10.0 / moves.size
            eps = config.dirichlet_fraction
            root_prior[i, moves] = (1 - eps) * raw_prior[i, moves] + eps * rng.dirichlet(
                np.full(moves.size, alpha)
            )

    forest.ensure_capacity(int(budget.max(initial=0)) + 1)
    done = np.zeros(k, np.int64)
    while (done < budget).any():
        in_call = np.zeros(k, np.int64)
        blocked = np.zeros(k, bool)
        passes = []
        for _ in range(config.leaves_per_call):
            pos = np.flatnonzero(~blocked & (done + in_call < budget))
            if pos.size == 0:
                break
            path, leaf, kind = _select(forest, trees[pos], root_prior, pos, gumbel, config)
            collided = kind == COLLISION
            blocked[pos[collided]] = True  # a collision ends this tree's batch for this call
            keep = ~collided
            pos, leaf, kind = pos[keep], leaf[keep], kind[keep]
            path = [p[keep] for p in path]
            for nodes in path:  # virtual loss on the whole path while the leaf is pending
                ok = nodes >= 0
                forest.virtual[trees[pos][ok], nodes[ok]] += 1
            if gumbel is not None:
                gumbel.search_visits[pos, forest.action[trees[pos], path[1]]] += 1
            in_call[pos] += 1
            passes.append((pos, path, leaf, kind))
        # One evaluator call for every new leaf of every tree.
        new_t = np.concatenate([trees[p][kd == NEW] for p, _, _, kd in passes])
        new_n = np.concatenate([lf[kd == NEW] for _, _, lf, kd in passes])
        new_values = _expand(forest, new_t, new_n, evaluator)
        offset = 0
        for pos, path, leaf, kind in passes:
            t = trees[pos]
            value = np.where(
                forest.terminal[t, leaf], forest.terminal_value[t, leaf], forest.proven[t, leaf]
            ).astype(np.float64)
            is_new = kind == NEW
            value[is_new] = new_values[offset : offset + is_new.sum()]
            offset += int(is_new.sum())
            _backup(forest, t, path, leaf, value)
            if config.propagate_proofs:
                for i in np.flatnonzero(forest.proven[t, leaf] != 0):
                    _propagate_proof(forest, int(t[i]), int(leaf[i]))
        done += in_call
    return _result(forest, trees, raw_prior, gumbel, config, rng, temperature, int(budget.max()))


def _result(
    forest: Forest,
    trees: np.ndarray,
    raw_prior: np.ndarray,
    gumbel: _Gumbel | None,
    config: MCTSConfig,
    rng: np.random.Generator,
    temperature: float | np.ndarray,
    simulations: int,
) -> SearchResult:
    k = trees.size
    _, visits, q, proven = _children_stats(
        forest, trees, np.zeros_like(trees), 0.0, config.propagate_proofs
    )
    legal = forest.legal[trees, 0]
    root_value = forest.value_sum[trees, 0] / np.maximum(forest.visits[trees, 0], 1)
    if gumbel is not None:
        pos = np.arange(k)
        completed = _completed_q(q, visits, raw_prior, forest.net_value[trees, 0])
        policy = _softmax(gumbel.logits + _gumbel_sigma(completed, visits, config))
        scores = gumbel.scores(forest, trees, pos, config)
        sv = np.where(gumbel.considered, gumbel.search_visits, -1)
        best = gumbel.considered & (sv == sv.max(-1, keepdims=True))
        chosen = np.argmax(np.where(best, scores, -np.inf), -1)
    else:
        total = visits.sum(-1, keepdims=True)
        policy = np.where(total > 0, visits / np.maximum(total, 1), raw_prior)
        chosen = choose_by_temperature(visits, legal, temperature, rng)
    if config.propagate_proofs:  # play a proven win; avoid a proven loss while another move may not lose
        wins = legal & (proven > 0)
        safe = legal & (proven >= 0)
        take_win = wins.any(-1)
        chosen[take_win] = np.argmax(np.where(wins, visits, -1), -1)[take_win]
        losing = ~take_win & (proven[np.arange(k), chosen] < 0) & safe.any(-1)
        chosen[losing] = np.argmax(np.where(safe, visits, -1), -1)[losing]
    return SearchResult(
        visit_counts=visits.astype(np.int64),
        policy=policy.astype(np.float32),
        prior=raw_prior,
        q_values=q.astype(np.float32),
        root_value=root_value.astype(np.float32),
        chosen=chosen.astype(np.int64),
        simulations=simulations,
    )


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


def search_states(
    game: Game,
    states: Sequence[Any],
    evaluator: Evaluator,
    config: MCTSConfig,
    rng: np.random.Generator | None = None,
    **kwargs: Any,
) -> SearchResult:
    """Fresh trees for `states`, searched together (a convenience for one-off searches)."""
    forest = Forest(game, len(states), capacity=config.simulations + 1)
    for i, state in enumerate(states):
        forest.reset(i, state)
    return search(forest, evaluator, config, rng or np.random.default_rng(), **kwargs)


# -- pure MCTS: UCT with random playouts ------------------------------------------------------

# Values are in [-1, 1]; c = 2 is the uct_c of OpenSpiel's MCTS example on that scale.
# Measured at 1000 simulations on Connect Four, c in {0.7, 1, 1.4, 3} against c = 2 came out
# within +-35 Elo (60 games each, all inside the 95% intervals).
DEFAULT_UCT_C = 2.0

Playout = Callable[[Any, np.random.Generator], float]


def playout_function(game: Game) -> Playout:
    """`(state, rng) -> outcome from player 0's view` of uniformly random moves to the end:
    the game's own compiled `random_playout` where it has one, else through the protocol."""
    fast = getattr(game, "random_playout", None)
    if fast is not None:
        return fast

    def playout(state: Any, rng: np.random.Generator) -> float:
        while not game.is_terminal(state):
            legal = np.flatnonzero(game.legal_mask(state))
            state = game.apply(state, int(legal[rng.integers(legal.size)]))
        return game.outcome(state)

    return playout


class _UctNode:
    __slots__ = ("state", "mover", "children", "untried", "visits", "value", "terminal", "result")

    def __init__(self, state: Any, mover: int, game: Game, rng: np.random.Generator) -> None:
        self.state = state
        self.mover = mover  # the player whose move led here; `value` is from their view
        self.children: list[tuple[int, _UctNode]] = []
        self.terminal = game.is_terminal(state)
        self.result = game.outcome(state) if self.terminal else 0.0  # player 0's view
        untried = np.flatnonzero(game.legal_mask(state)).tolist() if not self.terminal else []
        rng.shuffle(untried)
        self.untried: list[int] = untried
        self.visits = 0
        self.value = 0.0


def uct_search(
    game: Game, state: Any, simulations: int, rng: np.random.Generator,
    uct_c: float = DEFAULT_UCT_C,
) -> int:
    """Pure MCTS from a fresh tree at `state`: `simulations` UCT simulations, each adding one
    node and scoring it by one random playout; returns the most visited move (ties: the
    higher total value)."""
    if simulations < 1:
        raise ValueError("pure MCTS needs at least 1 simulation")
    playout = playout_function(game)
    root = _UctNode(state, -1, game, rng)
    log, sqrt = math.log, math.sqrt
    for _ in range(simulations):
        node, path = root, [root]
        while not node.untried and node.children:
            scale = uct_c * sqrt(log(node.visits))
            best, best_score = None, -math.inf
            for _, child in node.children:
                score = child.value / child.visits + scale / sqrt(child.visits)
                if score > best_score:
                    best, best_score = child, score
            node = best
            path.append(node)
        if node.untried:
            action = node.untried.pop()
            child = _UctNode(game.apply(node.state, action), game.to_play(node.state), game, rng)
            node.children.append((action, child))
            node = child
            path.append(node)
        result = node.result if node.terminal else playout(node.state, rng)
        for n in path:
            n.visits += 1
            n.value += result if n.mover == 0 else -result
    action, _ = max(root.children, key=lambda ac: (ac[1].visits, ac[1].value))
    return int(action)
