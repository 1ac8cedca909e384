"""Connect Four: 6 rows x 7 columns, four in a row wins.

Actions 0..6 are the columns from the left; a person writes a column as 1..7. A position is
written as the string of columns played from the empty board (`"4453"`), the format of the
solver benchmark files; `state_from_moves` and `moves_string` convert.

Bitboards use the 7 x (6 + 1) layout of `connect4_bitboard` (bit `7 * column + row`, row 0
at the bottom), whose compiled primitives the solver and the random playouts share. A state
keeps the stones of the player to move (`mine`), all stones
(`mask`), the columns played (`moves`, needed for the position string) and the result once
the game is over (`result`: +1/-1/0 from player 0's view, None while it goes on).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .base import IllegalMove
from .connect4_bitboard import (
    HEIGHT,
    WIDTH,
    bottom,
    has_four,
    random_playout,
    top,
)

_BOTTOM = [bottom(c) for c in range(WIDTH)]
_TOP = [top(c) for c in range(WIDTH)]
# Bit index of plane cell (r, c), row 0 of the planes being the top row.
_PLANE_BITS = np.array(
    [[7 * c + HEIGHT - 1 - r for c in range(WIDTH)] for r in range(HEIGHT)], dtype=np.int64
)


class Connect4State(NamedTuple):
    mine: int  # stones of the player to move
    mask: int  # all stones
    moves: str  # columns played, 1-based digits
    result: float | None  # +1/-1/0 from player 0's view when over, else None


class Connect4:
    name = "connect4"
    num_actions = WIDTH
    plane_shape = (3, HEIGHT, WIDTH)  # own stones, opponent stones, ones

    def initial_state(self) -> Connect4State:
        return Connect4State(0, 0, "", None)

    def to_play(self, state: Connect4State) -> int:
        return len(state.moves) & 1

    def is_terminal(self, state: Connect4State) -> bool:
        return state.result is not None

    def outcome(self, state: Connect4State) -> float:
        return 0.0 if state.result is None else state.result

    def legal_mask(self, state: Connect4State) -> np.ndarray:
        if state.result is not None:
            return np.zeros(WIDTH, dtype=bool)
        mask = state.mask
        return np.array([not mask & top for top in _TOP], dtype=bool)

    def apply(self, state: Connect4State, action: int) -> Connect4State:
        if not 0 <= action < WIDTH:
            raise IllegalMove(f"connect4 action {action} is not in 0..6")
        if state.result is not None:
            raise IllegalMove("the game is over")
        mask = state.mask
        if mask & _TOP[action]:
            raise IllegalMove(f"column {action + 1} is full")
        new_mask = mask | (mask + _BOTTOM[action])
        mover = state.mine | (new_mask ^ mask)
        moves = state.moves + "123456789"[action]
        result = None
        if has_four(mover):
            result = 1.0 if len(moves) & 1 else -1.0
        elif len(moves) == WIDTH * HEIGHT:
            result = 0.0
        return Connect4State(mover ^ new_mask, new_mask, moves, result)

    def random_playout(self, state: Connect4State, rng: np.random.Generator) -> float:
        """The outcome (player 0's view) of uniformly random moves from `state` to the end,
        played on the bitboards in compiled code: the fast path of pure MCTS."""
        if state.result is not None:
            return state.result
        result = random_playout(state.mine, state.mask, rng.bit_generator.random_raw() >> 1)
        return float(result if len(state.moves) % 2 == 0 else -result)

    def stones(self, state: Connect4State, player: int) -> int:
        """Bitboard of `player`'s stones."""
        if player == self.to_play(state):
            return state.mine
        return state.mine ^ state.mask

    def planes(self, state: Connect4State) -> np.ndarray:
        out = np.ones(self.plane_shape, dtype=np.float32)
        out[0] = (state.mine >> _PLANE_BITS) & 1
        out[1] = ((state.mine ^ state.mask) >> _PLANE_BITS) & 1
        return out

    def symmetries(
        self, planes: np.ndarray, policy: np.ndarray
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        mirrored = np.ascontiguousarray(planes[:, :, ::-1])
        return [(planes, policy), (mirrored, np.ascontiguousarray(policy[::-1]))]

    def render(self, state: Connect4State) -> str:
        first = self.stones(state, 0)
        rows = []
        for row in range(HEIGHT - 1, -1, -1):
            cells = []
            for col in range(WIDTH):
                bit = 1 << (7 * col + row)
                cells.append("X" if first & bit else "O" if state.mask & bit else ".")
            rows.append(" ".join(cells))
        return "\n".join(rows) + "\n" + " ".join("1234567")

    def parse_move(self, state: Connect4State, text: str) -> int:
        move = text.strip()
        if len(move) != 1 or move not in "1234567":
            raise IllegalMove(f"bad connect4 move {text!r} (write a column 1-7)")
        action = int(move) - 1
        if state.result is not None:
            raise IllegalMove("the game is over")
        if state.mask & _TOP[action]:
            raise IllegalMove(f"column {action + 1} is full")
        return action

    def format_move(self, state: Connect4State, action: int) -> str:
        if not 0 <= action < WIDTH:
            raise IllegalMove(f"connect4 action {action} is not in 0..6")
        return str(action + 1)


def state_from_moves(game: Connect4, moves: str) -> Connect4State:
    """The state after playing the columns in `moves` (e.g. "4453") from the empty board."""
    state = game.initial_state()
    for i, ch in enumerate(moves):
        if ch not in "1234567":
            raise IllegalMove(f"bad column {ch!r} at move {i + 1} of {moves!r}")
        try:
            state = game.apply(state, int(ch) - 1)
        except IllegalMove as err:
            raise IllegalMove(f"move {i + 1} of {moves!r}: {err}") from None
    return state


def moves_string(state: Connect4State) -> str:
    """The position as the string of 1-based columns played."""
    return state.moves
