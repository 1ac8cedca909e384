"""The search trees: a `Forest` of arrays indexed [tree, node, ...], node 0 of each tree its
root, and the per-child statistics every selection rule reads (`children_stats`).

Sign convention: every value is from the view of the player to move at the node that holds
it. A child's value is seen by its parent through `sign = +1 if same player else -1`
(always -1 in alternating games; kept general for games where a player can move twice).

Checkpoints written before the search was split across modules pickled the forest as
`rlscale.zero.mcts.Forest`: mcts.py imports it, so those still load
(tests/zero/test_search_policies.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .games.base import Game


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

    def add_child(self, tree: int, parent: int, action: int) -> int:
        """Create the node `action` leads to from `parent` (an unexplored edge); its index."""
        state = self.game.apply(self.states[tree][parent], action)
        new = int(self.num_nodes[tree])
        self.num_nodes[tree] += 1
        self.states[tree].append(state)
        self.children[tree, parent, action] = new
        self.parent[tree, new] = parent
        self.action[tree, new] = action
        self._set_node(tree, new, state)
        return new

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


def children_stats(
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
