"""A perfect Connect Four solver.

Negamax with alpha-beta pruning over bitboards (the 7 x (6 + 1) layout and the compiled
primitives of `rlscale.zero.games.connect4_bitboard`), compiled with numba:

- only moves that do not hand the opponent an immediate win are searched, and a position
  where every move does is scored at once;
- moves are tried in order of how many winning spots they create, centre columns first on
  ties;
- a transposition table keeps lower and upper bounds on positions' scores, kept between
  calls (bounds stay true whatever window found them);
- the root runs null-window searches, narrowing [min, max] around the score until it is
  exact (a binary search that leans towards 0, where most scores lie).

Scores follow the benchmark files (`shared/data/connect4/README.md`): from the side to move,
0 a draw, a win `22 - (stones the winner will have played)`, a loss the negative of that.
Positions are strings of 1-based columns played from the empty board, e.g. "4453".
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .games.base import IllegalMove
from .games.connect4 import Connect4, Connect4State, state_from_moves
from .games.connect4_bitboard import (
    CELLS,
    HEIGHT,
    WIDTH,
    playable,
    popcount,
    winning_spots,
)

# Transposition-table entries are `key << 8 | value` (key = current + mask, < 2**49), value 0
# empty, an upper bound u as u + 22 (1..43), a lower bound l as l + 66 (45..87): any score
# of any position lies in -21..21.
_UPPER_OFFSET = 22
_LOWER_OFFSET = 66
_ORDER = np.array([3, 2, 4, 1, 5, 0, 6], np.int64)  # centre first


@njit(cache=True)
def _safe_moves(current, mask):
    """Playable cells that do not let the opponent win next move (0 if none)."""
    threats = winning_spots(current ^ mask, mask)
    moves = playable(mask)
    forced = moves & threats
    if forced:
        if forced & (forced - 1):  # two threats to parry: lost
            return 0
        moves = forced
    return moves & ~(threats >> 1)  # never play just below an opponent's winning spot


@njit(cache=True)
def _negamax(current, mask, moves, alpha, beta, table, move_buf, score_buf):
    """Score of a position where the side to move cannot win at once.

    Fail-soft contract: a result <= alpha is an upper bound, >= beta a lower bound,
    anything between exact."""
    candidates = _safe_moves(current, mask)
    if candidates == 0:
        return -((CELLS - moves) // 2)
    if moves >= CELLS - 2:
        return 0
    low = -((CELLS - 2 - moves) // 2)  # the opponent cannot win on its next move
    if alpha < low:
        alpha = low
        if alpha >= beta:
            return alpha
    high = (CELLS - 1 - moves) // 2  # nor can we win on this one
    if beta > high:
        beta = high
        if alpha >= beta:
            return beta

    key = current + mask
    slot = key % table.shape[0]
    entry = table[slot]
    if (entry >> 8) == key:
        stored = entry & 255
        if stored > _LOWER_OFFSET - 22:
            bound = stored - _LOWER_OFFSET
            if alpha < bound:
                alpha = bound
                if alpha >= beta:
                    return alpha
        elif stored > 0:
            bound = stored - _UPPER_OFFSET
            if beta > bound:
                beta = bound
                if alpha >= beta:
                    return beta

    # Order the candidates by threats created, stable over the centre-first order.
    count = 0
    for i in range(WIDTH):
        column = _ORDER[i]
        move = candidates & (((1 << HEIGHT) - 1) << (7 * column))
        if move:
            score = popcount(winning_spots(current | move, mask))
            j = count
            while j > 0 and score_buf[moves, j - 1] < score:
                move_buf[moves, j] = move_buf[moves, j - 1]
                score_buf[moves, j] = score_buf[moves, j - 1]
                j -= 1
            move_buf[moves, j] = move
            score_buf[moves, j] = score
            count += 1

    for i in range(count):
        move = move_buf[moves, i]
        score = -_negamax(
            current ^ mask, mask | move, moves + 1, -beta, -alpha,
            table, move_buf, score_buf,
        )
        if score >= beta:
            table[slot] = (key << 8) | (score + _LOWER_OFFSET)
            return score
        if score > alpha:
            alpha = score
    table[slot] = (key << 8) | (alpha + _UPPER_OFFSET)
    return alpha


@njit(cache=True)
def _half_toward_zero(x):
    return -((-x) // 2) if x < 0 else x // 2


@njit(cache=True)
def _solve(current, mask, moves, weak, table, move_buf, score_buf):
    if winning_spots(current, mask) & playable(mask):
        return (CELLS + 1 - moves) // 2
    low = -((CELLS - moves) // 2)
    high = (CELLS + 1 - moves) // 2
    if weak:
        low, high = -1, 1
    while low < high:
        pivot = low + (high - low) // 2
        if pivot <= 0 and _half_toward_zero(low) < pivot:
            pivot = _half_toward_zero(low)
        elif pivot >= 0 and _half_toward_zero(high) > pivot:
            pivot = _half_toward_zero(high)
        result = _negamax(
            current, mask, moves, pivot, pivot + 1, table, move_buf, score_buf
        )
        if result <= pivot:
            high = result
        else:
            low = result
    return low


def _next_prime(n: int) -> int:
    def is_prime(k: int) -> bool:
        return k > 1 and all(k % d for d in range(2, int(k**0.5) + 1))

    while not is_prime(n):
        n += 1
    return n


class Solver:
    """A solver with its own transposition table (8 bytes x about 2**tt_bits)."""

    def __init__(self, tt_bits: int = 22):
        # One int64 per entry: one memory access per lookup. A prime size spreads the keys.
        self._table = np.zeros(_next_prime(1 << tt_bits), np.int64)
        self._move_buf = np.zeros((CELLS + 1, WIDTH), np.int64)
        self._score_buf = np.zeros((CELLS + 1, WIDTH), np.int64)
        self._game = Connect4()

    def reset(self) -> None:
        """Forget the transposition table."""
        self._table[:] = 0

    def _state(self, moves: str | Connect4State) -> Connect4State:
        state = moves if isinstance(moves, Connect4State) else state_from_moves(self._game, moves)
        if state.result is not None:
            raise IllegalMove(f"position {state.moves!r} is already over")
        return state

    def _search(self, state: Connect4State, weak: bool) -> int:
        return int(
            _solve(
                state.mine, state.mask, len(state.moves), weak,
                self._table, self._move_buf, self._score_buf,
            )
        )

    def solve(self, moves: str | Connect4State, weak: bool = False) -> int:
        """Exact score of the position for the side to move (weak: only its sign, +-1/0)."""
        score = self._search(self._state(moves), weak)
        return wdl(score) if weak else score

    def move_values(
        self, moves: str | Connect4State, weak: bool = False
    ) -> list[int | None]:
        """Score of each column 0..6 for the side to move (None where the column is full)."""
        state = self._state(moves)
        values: list[int | None] = []
        for column, legal in enumerate(self._game.legal_mask(state)):
            if not legal:
                values.append(None)
                continue
            child = self._game.apply(state, column)
            if child.result is not None:  # a win or the board's last cell
                win = (CELLS + 1 - len(state.moves)) // 2
                value = 0 if child.result == 0 else win
                values.append(wdl(value) if weak else value)
            elif weak:
                values.append(-wdl(self._search(child, True)))
            else:
                values.append(-self._search(child, False))
        return values

    def best_moves(self, moves: str | Connect4State) -> list[int]:
        """The columns (actions 0..6) with the best score."""
        values = self.move_values(moves)
        best = max(v for v in values if v is not None)
        return [c for c, v in enumerate(values) if v == best]


_default: Solver | None = None


def default_solver() -> Solver:
    """The process-wide solver behind the module functions (created on first use)."""
    global _default
    if _default is None:
        _default = Solver()
    return _default


def solve(moves: str | Connect4State, weak: bool = False) -> int:
    """Exact score of the position `moves` (e.g. "4453") for the side to move."""
    return default_solver().solve(moves, weak)


def move_values(moves: str | Connect4State, weak: bool = False) -> list[int | None]:
    """Score of each column 0..6 for the side to move; None for a full column."""
    return default_solver().move_values(moves, weak)


def best_moves(moves: str | Connect4State) -> list[int]:
    """Actions (columns 0..6) of maximal score for the side to move."""
    return default_solver().best_moves(moves)


def wdl(score: int) -> int:
    """+1 win, 0 draw, -1 loss."""
    return (score > 0) - (score < 0)
