"""Tic-tac-toe on a 3x3 board.

Actions 0..8 number the cells row by row from the top-left. A person writes a move either
as the cell number 1..9 (action + 1, the same order) or as column letter + row number,
`a1`..`c3`, with column `a` on the left and row `1` at the top (so `a1` is cell 1 and
`c3` is cell 9). `format_move` writes the cell number.

A state is a `TicTacToeState(x, o)`: two 9-bit masks of the first (X) and second (O)
player's marks; the player to move follows from the number of marks.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from rlscale.zero.games.base import IllegalMove

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
