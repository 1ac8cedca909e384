"""Tic-tac-toe on a 3x3 board.

Actions 0..8 number the cells row by row from the top-left. A person writes a move either
as the cell number 1..9 (action + 1, the same order) or as column letter + row number,
`a1`..`c3`, with column `a` on the left and row `1` at the top (so `a1` is cell 1 and
`c3` is cell 9). `format_move` writes the cell number.

A state is a `TicTacToeState(x, o)`: two 9-bit masks of the first (X) and second (O)
player's marks; the player to move follows from the number of marks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from .base import IllegalMove

_LINES = tuple(
    sum(1 << cell for cell in line)
    for line in (
        (0, 1, 2), (3, 4, 5), (6, 7, 8),
        (0, 3, 6), (1, 4, 7), (2, 5, 8),
        (0, 4, 8), (2, 4, 6),
    )
)
_FULL = (1 << 9) - 1
_CELLS = np.arange(9)


class TicTacToeState(NamedTuple):
    x: int  # marks of player 0
    o: int  # marks of player 1


def _has_line(marks: int) -> bool:
    return any(marks & line == line for line in _LINES)


class TicTacToe:
    name = "tictactoe"
    num_actions = 9
    plane_shape = (3, 3, 3)  # own marks, opponent marks, ones

    def initial_state(self) -> TicTacToeState:
        return TicTacToeState(0, 0)

    def to_play(self, state: TicTacToeState) -> int:
        return (state.x | state.o).bit_count() & 1

    def winner(self, state: TicTacToeState) -> int | None:
        """0 or 1 for a completed line, else None."""
        if _has_line(state.x):
            return 0
        if _has_line(state.o):
            return 1
        return None

    def is_terminal(self, state: TicTacToeState) -> bool:
        return (state.x | state.o) == _FULL or self.winner(state) is not None

    def outcome(self, state: TicTacToeState) -> float:
        winner = self.winner(state)
        return 0.0 if winner is None else (1.0 if winner == 0 else -1.0)

    def legal_mask(self, state: TicTacToeState) -> np.ndarray:
        if self.is_terminal(state):
            return np.zeros(9, dtype=bool)
        return ((state.x | state.o) >> _CELLS) & 1 == 0

    def apply(self, state: TicTacToeState, action: int) -> TicTacToeState:
        if not 0 <= action < 9:
            raise IllegalMove(f"tictactoe action {action} is not in 0..8")
        bit = 1 << action
        if (state.x | state.o) & bit:
            raise IllegalMove(f"cell {action + 1} is already taken")
        if self.is_terminal(state):
            raise IllegalMove("the game is over")
        if self.to_play(state) == 0:
            return TicTacToeState(state.x | bit, state.o)
        return TicTacToeState(state.x, state.o | bit)

    def planes(self, state: TicTacToeState) -> np.ndarray:
        own, opp = (state.x, state.o) if self.to_play(state) == 0 else (state.o, state.x)
        out = np.ones((3, 3, 3), dtype=np.float32)
        out[0] = ((own >> _CELLS) & 1).reshape(3, 3)
        out[1] = ((opp >> _CELLS) & 1).reshape(3, 3)
        return out

    def symmetries(
        self, planes: np.ndarray, policy: np.ndarray
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        return dihedral_symmetries(planes, policy, 3)

    def render(self, state: TicTacToeState) -> str:
        rows = []
        for r in range(3):
            row = ""
            for c in range(3):
                bit = 1 << (3 * r + c)
                row += "X" if state.x & bit else "O" if state.o & bit else "."
            rows.append(f"{r + 1} {row}")
        return "  abc\n" + "\n".join(rows)

    def parse_move(self, state: TicTacToeState, text: str) -> int:
        move = text.strip().lower()
        if len(move) == 1 and move in "123456789":
            action = int(move) - 1
        elif len(move) == 2 and move[0] in "abc" and move[1] in "123":
            action = 3 * (int(move[1]) - 1) + "abc".index(move[0])
        else:
            raise IllegalMove(f"bad tictactoe move {text!r} (write 1-9 or a1-c3)")
        if not self.legal_mask(state)[action]:
            if self.is_terminal(state):
                raise IllegalMove("the game is over")
            raise IllegalMove(f"cell {action + 1} is already taken")
        return action

    def format_move(self, state: TicTacToeState, action: int) -> str:
        if not 0 <= action < 9:
            raise IllegalMove(f"tictactoe action {action} is not in 0..8")
        return str(action + 1)


# The exact solution. The whole game has 5,478 positions, so plain memoised negamax solves
# it in a fraction of a second: a yardstick for what a network learned (its values and
# moves against the true ones) and a perfect opponent.
_GAME = TicTacToe()


@functools.cache
def minimax_value(state: TicTacToeState) -> int:
    """The exact value for the player to move: +1 a win, 0 a draw, -1 a loss."""
    if _GAME.is_terminal(state):
        outcome = _GAME.outcome(state)
        return int(outcome if _GAME.to_play(state) == 0 else -outcome)
    return max(-minimax_value(_GAME.apply(state, int(a)))
               for a in np.flatnonzero(_GAME.legal_mask(state)))


def optimal_moves(state: TicTacToeState) -> list[int]:
    """Every move that keeps the exact value: a perfect player plays one of these."""
    values = {int(a): -minimax_value(_GAME.apply(state, int(a)))
              for a in np.flatnonzero(_GAME.legal_mask(state))}
    best = max(values.values())
    return [a for a, v in values.items() if v == best]


def reachable_positions() -> list[TicTacToeState]:
    """Every position a legal game can reach with a move still to play (4,520), in a fixed
    order."""
    seen, order, stack = set(), [], [_GAME.initial_state()]
    while stack:
        state = stack.pop()
        if state in seen or _GAME.is_terminal(state):
            continue
        seen.add(state)
        order.append(state)
        stack.extend(_GAME.apply(state, int(a)) for a in np.flatnonzero(_GAME.legal_mask(state)))
    return order


def losses_to_minimax(choose: Callable[[TicTacToeState], int], player: int) -> tuple[int, int]:
    """Play `choose` as `player` (0 moves first) against a perfect player that tries every
    one of its optimal moves: (games lost, games played) over that whole tree."""
    lost = games = 0
    stack = [_GAME.initial_state()]
    while stack:
        state = stack.pop()
        if _GAME.is_terminal(state):
            games += 1
            lost += _GAME.outcome(state) * (1 if player == 0 else -1) < 0
        elif _GAME.to_play(state) == player:
            stack.append(_GAME.apply(state, choose(state)))
        else:
            stack.extend(_GAME.apply(state, a) for a in optimal_moves(state))
    return lost, games


def dihedral_symmetries(
    planes: np.ndarray, policy: np.ndarray, size: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The 8 rotations/reflections of square `planes` [C, size, size] and of the first
    size*size entries of `policy` (any entries after those, e.g. pass, stay put)."""
    board_policy = policy[: size * size].reshape(size, size)
    rest = policy[size * size :]
    out = []
    for flip in (False, True):
        p_planes = planes[:, :, ::-1] if flip else planes
        p_policy = board_policy[:, ::-1] if flip else board_policy
        for k in range(4):
            sym_planes = np.ascontiguousarray(np.rot90(p_planes, k, axes=(1, 2)))
            sym_policy = np.rot90(p_policy, k).reshape(-1)
            out.append((sym_planes, np.concatenate([sym_policy, rest])))
    return out
