"""Tic-tac-toe's exact solution as a table: the yardstick the Zero experiments judge a
network by. All 4,520 positions with a move to play, their input planes, exact values and
optimal moves (zero/games/tictactoe.py solves the game), built once per process."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..zero.games.tictactoe import (
    TicTacToe,
    losses_to_minimax,
    minimax_value,
    optimal_moves,
    reachable_positions,
)


@dataclass(frozen=True)
class ExactTable:
    positions: list[Any]        # TicTacToeState, in reachable_positions() order
    planes: np.ndarray          # [N, 3, 3, 3] the network's input
    values: np.ndarray          # [N] the exact value for the player to move (-1, 0, 1)
    legal: np.ndarray           # [N, 9]
    optimal: np.ndarray         # [N, 9] the moves that keep the exact value


@functools.cache
def exact_table() -> ExactTable:
    game = TicTacToe()
    positions = reachable_positions()
    optimal = np.zeros((len(positions), game.num_actions), dtype=bool)
    for i, state in enumerate(positions):
        optimal[i, optimal_moves(state)] = True
    return ExactTable(positions, np.stack([game.planes(s) for s in positions]),
                      np.array([minimax_value(s) for s in positions], dtype=np.float64),
                      np.stack([game.legal_mask(s) for s in positions]), optimal)


def optimal_share(table: ExactTable, moves: np.ndarray) -> float:
    """The share of the table's positions where `moves` (one per position) is optimal."""
    return float(table.optimal[np.arange(len(moves)), moves].mean())


def raw_policy_moves(table: ExactTable, priors: np.ndarray) -> np.ndarray:
    """The most probable legal move of each position."""
    return np.where(table.legal, priors, -1.0).argmax(axis=1)


@dataclass(frozen=True)
class RawPolicyFigures:
    """A network's raw policy (its most probable legal move, no search) against the exact
    solution, and its value head's predictions for every position."""

    optimal_moves: float        # the share of positions whose raw-policy move is optimal
    lost: float                 # the share of a perfect player's games it loses (both sides)
    values: np.ndarray          # [N] the value head's output, in the table's order


def judge_raw_policy(net) -> RawPolicyFigures:
    """`net` (a Zero PolicyValueNet for tic-tac-toe) over every position of the table, and
    its raw policy against a perfect player that tries every one of its optimal replies."""
    table = exact_table()
    priors, values = net.evaluate(table.planes)
    moves = raw_policy_moves(table, priors)
    chosen = {s: int(m) for s, m in zip(table.positions, moves, strict=True)}
    lost = [losses_to_minimax(chosen.__getitem__, player) for player in (0, 1)]
    return RawPolicyFigures(optimal_share(table, moves),
                            sum(n for n, _ in lost) / sum(g for _, g in lost), values)
