"""MCTS-Solver (Winands et al. 2008): proven wins and losses in the search trees.

A node is won for the player to move if some move reaches a position lost for the opponent,
and lost if every move reaches a position won for the opponent. Terminal positions are proven
when they are created (`Forest`); `propagate_proof` walks a new proof up the tree. Selection
adds `PROOF_BONUS` to a proven win's score (and subtracts it from a proven loss), and
`prefer_proven` corrects the move a search chose.
"""

from __future__ import annotations

import numpy as np

from .forest import Forest

PROOF_BONUS = 1e6  # added to selection scores of proven wins (and subtracted for losses)


def propagate_proof(forest: Forest, tree: int, node: int) -> None:
    """Walk up from a newly proven node while that makes its parent proven too."""
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


def prefer_proven(
    chosen: np.ndarray, legal: np.ndarray, proven: np.ndarray, visits: np.ndarray
) -> None:
    """Play a proven win; avoid a proven loss while another move may not lose (the most
    visited such move). `chosen` [k] is changed in place; `proven` [k, A] is from the root
    player's view."""
    wins = legal & (proven > 0)
    safe = legal & (proven >= 0)
    take_win = wins.any(-1)
    chosen[take_win] = np.argmax(np.where(wins, visits, -1), -1)[take_win]
    losing = ~take_win & (proven[np.arange(chosen.size), chosen] < 0) & safe.any(-1)
    chosen[losing] = np.argmax(np.where(safe, visits, -1), -1)[losing]
