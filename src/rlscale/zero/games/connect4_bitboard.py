"""Connect Four bitboards: the compiled primitives shared by the game, the solver and the
random playouts of pure MCTS.

Layout: 7 columns x (6 + 1) bits, bit `7 * column + row`, row 0 at the bottom. The spare
bit on top of each column keeps shifted patterns from wrapping into the next column. A
position is two integers: `mine` (the stones of the player to move) and `mask` (all stones).
A move in `column` sets the lowest empty bit of that column: `mask | (mask + bottom(column))`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

WIDTH = 7
HEIGHT = 6
CELLS = WIDTH * HEIGHT
BOTTOM_ROW = sum(1 << (7 * c) for c in range(WIDTH))  # the bottom cell of every column
BOARD = BOTTOM_ROW * ((1 << HEIGHT) - 1)  # every playable cell
COLUMN_BITS = (1 << HEIGHT) - 1  # a column's cells, shifted by 7 * column


def bottom(column: int) -> int:
    """The bottom cell of `column`."""
    return 1 << (7 * column)


def top(column: int) -> int:
    """The top cell of `column` (set when the column is full)."""
    return 1 << (7 * column + HEIGHT - 1)


@njit(cache=True)
def has_four(stones):
    """True when `stones` (one player's bitboard) holds four in a row."""
    for shift in (1, 7, 6, 8):  # vertical, horizontal, two diagonals
        pairs = stones & (stones >> shift)
        if pairs & (pairs >> (2 * shift)):
            return True
    return False


@njit(cache=True)
def winning_spots(stones, mask):
    """Empty cells (reachable or not) where `stones` would complete four in a row."""
    spots = (stones << 1) & (stones << 2) & (stones << 3)
    for shift in (7, 6, 8):
        pair = (stones << shift) & (stones << (2 * shift))
        spots |= pair & (stones << (3 * shift))
        spots |= pair & (stones >> shift)
        pair = (stones >> shift) & (stones >> (2 * shift))
        spots |= pair & (stones << shift)
        spots |= pair & (stones >> (3 * shift))
    return spots & (BOARD ^ mask)


@njit(cache=True)
def playable(mask):
    """The cell each non-full column would fill next."""
    return (mask + BOTTOM_ROW) & BOARD


@njit(cache=True)
def popcount(x):
    count = 0
    while x:
        x &= x - 1
        count += 1
    return count


@njit(cache=True)
def random_playout(mine, mask, seed):
    """Uniformly random moves to the end of the game: +1 if the player to move in (`mine`,
    `mask`) wins, -1 if they lose, 0 for a draw. `seed` drives a splitmix64 stream, so the
    result is a pure function of its arguments."""
    state = np.uint64(seed)
    golden = np.uint64(0x9E3779B97F4A7C15)
    mul1 = np.uint64(0xBF58476D1CE4E5B9)
    mul2 = np.uint64(0x94D049BB133111EB)
    columns = np.empty(WIDTH, np.int64)
    sign = 1
    while True:
        count = 0
        for c in range(WIDTH):
            if not mask & (1 << (7 * c + HEIGHT - 1)):
                columns[count] = c
                count += 1
        if count == 0:
            return 0
        state += golden
        z = state
        z = (z ^ (z >> np.uint64(30))) * mul1
        z = (z ^ (z >> np.uint64(27))) * mul2
        z = z ^ (z >> np.uint64(31))
        column = columns[np.int64(z % np.uint64(count))]
        new_mask = mask | (mask + (1 << (7 * column)))
        mover = mine | (new_mask ^ mask)
        if has_four(mover):
            return sign
        mine, mask = mover ^ new_mask, new_mask
        sign = -sign
