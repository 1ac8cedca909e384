"""Go on an N x N board (5 <= N <= 19), Tromp-Taylor style.

Rules:
- Black (player 0) moves first; a move is a stone or a pass (action `N * N`).
- Stones without liberties are captured; opponent stones are removed first, so a move that
  captures is never suicide. Suicide (a move leaving its own group without liberties and
  capturing nothing) is illegal.
- Positional superko: a stone may not recreate any earlier board position (whoever was to
  move). States carry the Zobrist hashes of every position so far.
- Two consecutive passes end the game. So does a move cap (`max_moves`, default 2 * N * N,
  passes included): a capped game is terminal and scored as it stands.
- Scoring is Tromp-Taylor area scoring: a point counts for a colour if it holds that
  colour's stone or is empty and reaches only that colour's stones; `score` is black minus
  white minus komi, and `outcome` its sign (a draw only with an integer komi).

Points are numbered row by row from the top-left (`point = row * N + col`, row 0 the top).
A person writes moves in GTP coordinates: a column letter A..T without I, then the row
number counted from the bottom (`D4`), or `pass`.

The board work (liberties, captures, legality, area) runs in numba-compiled kernels over a
flat int8 board (0 empty, 1 black, 2 white), all on one flood fill (`_flood`). State arrays
are read-only and never mutated.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .base import IllegalMove
from .tictactoe import dihedral_symmetries

COLUMNS = "ABCDEFGHJKLMNOPQRST"
MIN_SIZE, MAX_SIZE = 5, 19
EMPTY, BLACK, WHITE = 0, 1, 2


# --------------------------------------------------------------------------- kernels


@njit(cache=True, inline="always")
def _flood(board, nbr, start, mark, stamp, members, stop_at_liberty):
    """Flood fill from `start` over the connected points holding its value: a stone group,
    or an empty region. The one walk behind captures, suicide, legality and area.

    Marks every point it reaches `mark[p] = stamp`: the region's points, listed in
    `members[:size]`, and a group's liberties (the empty points beside it; a point's value
    tells the two kinds apart). Returns (size, liberties, reach): the distinct liberties of a
    group (0 for an empty region), and `reach`, the OR of the colours of the stones beside the
    region that are not its own (1 black, 2 white: an empty region reaching only black stones
    has reach 1, both colours 3). With `stop_at_liberty` it returns at a group's first
    liberty, as (size so far, 1, reach so far); members then lists only part of the group.
    Inlined into each kernel: a call per group made `_legal` about 7% slower."""
    color = board[start]
    mark[start] = stamp
    members[0] = start
    size = 1
    head = 0
    liberties = 0
    reach = 0
    while head < size:
        q = members[head]
        head += 1
        for k in range(4):
            r = nbr[q, k]
            if r < 0:
                break
            v = board[r]
            if v == color:
                if mark[r] != stamp:
                    mark[r] = stamp
                    members[size] = r
                    size += 1
            elif v == 0:  # a liberty of the group
                if stop_at_liberty:
                    return size, 1, reach
                if mark[r] != stamp:
                    mark[r] = stamp
                    liberties += 1
            else:
                reach |= v
    return size, liberties, reach


@njit(cache=True)
def _play(board, nbr, zobrist, point, color, pos_hash, seen):
    """(status, board, hash, seen) after `color` plays `point`.

    status: 0 legal, 1 occupied, 2 suicide, 3 superko. On failure the arrays are junk."""
    n = board.shape[0]
    out = board.copy()
    if out[point] != 0:
        return 1, out, pos_hash, np.empty(0, np.int64)
    out[point] = color
    h = pos_hash ^ zobrist[point, color]
    opp = 3 - color
    members = np.empty(n, np.int32)
    mark = np.zeros(n, np.int32)
    stamp = 0
    captured = False
    for k in range(4):
        r = nbr[point, k]
        if r < 0:
            break
        if out[r] == opp:
            stamp += 1
            size, liberties, _ = _flood(out, nbr, r, mark, stamp, members, True)
            if liberties == 0:  # the walk did not stop early: members lists the whole group
                for i in range(size):
                    out[members[i]] = 0
                    h ^= zobrist[members[i], opp]
                captured = True
    if not captured:
        stamp += 1
        if _flood(out, nbr, point, mark, stamp, members, True)[1] == 0:
            return 2, out, pos_hash, np.empty(0, np.int64)
    i = np.searchsorted(seen, h)
    if i < seen.shape[0] and seen[i] == h:
        return 3, out, pos_hash, np.empty(0, np.int64)
    new_seen = np.empty(seen.shape[0] + 1, np.int64)
    new_seen[:i] = seen[:i]
    new_seen[i] = h
    new_seen[i + 1 :] = seen[i:]
    return 0, out, h, new_seen


@njit(cache=True)
def _legal(board, nbr, zobrist, color, pos_hash, seen):
    """Boolean [n + 1] of legal moves for `color` (pass last, always legal)."""
    n = board.shape[0]
    label = np.full(n, -1, np.int32)  # a stone's group (the flood also marks liberties)
    libs = np.zeros(n, np.int32)
    group_hash = np.zeros(n, np.int64)
    members = np.empty(n, np.int32)
    groups = 0
    for p in range(n):
        col = board[p]
        if col == 0 or label[p] >= 0:
            continue
        g = groups
        groups += 1
        size, liberties, _ = _flood(board, nbr, p, label, g, members, False)
        h = np.int64(0)
        for i in range(size):
            h ^= zobrist[members[i], col]
        libs[g] = liberties
        group_hash[g] = h

    out = np.zeros(n + 1, np.bool_)
    out[n] = True
    captured = np.empty(4, np.int32)
    for p in range(n):
        if board[p] != 0:
            continue
        h = pos_hash ^ zobrist[p, color]
        breathes = False
        ncap = 0
        for k in range(4):
            r = nbr[p, k]
            if r < 0:
                break
            v = board[r]
            if v == 0:
                breathes = True
                continue
            g = label[r]
            if v == color:
                if libs[g] > 1:  # p is one liberty; another one remains
                    breathes = True
            elif libs[g] == 1:  # the opponent group's last liberty is p
                fresh = True
                for j in range(ncap):
                    if captured[j] == g:
                        fresh = False
                if fresh:
                    captured[ncap] = g
                    ncap += 1
                    h ^= group_hash[g]
        if not breathes and ncap == 0:
            continue
        i = np.searchsorted(seen, h)
        if i < seen.shape[0] and seen[i] == h:
            continue
        out[p] = True
    return out


@njit(cache=True)
def _ownership(board, nbr):
    """Tromp-Taylor owner of every point, int8 [n]: 1 black, -1 white, 0 neither (an empty
    region reaching both colours, or none)."""
    n = board.shape[0]
    owner = np.zeros(n, np.int8)
    visited = np.zeros(n, np.int32)
    members = np.empty(n, np.int32)
    for p in range(n):
        v = board[p]
        if v == 1:
            owner[p] = 1
        elif v == 2:
            owner[p] = -1
        elif visited[p] == 0:
            size, _, reach = _flood(board, nbr, p, visited, 1, members, False)
            if reach == 1 or reach == 2:
                for i in range(size):
                    owner[members[i]] = 1 if reach == 1 else -1
    return owner


@njit(cache=True)
def _area(board, nbr):
    """(black, white) Tromp-Taylor area."""
    owner = _ownership(board, nbr)
    return np.sum(owner == 1), np.sum(owner == -1)


# --------------------------------------------------------------------------- tables

_TABLES: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def _tables(size: int) -> tuple[np.ndarray, np.ndarray]:
    """Neighbour table [n, 4] (-1 padded at the end) and Zobrist keys [n, 3] for `size`."""
    if size not in _TABLES:
        n = size * size
        nbr = np.full((n, 4), -1, np.int32)
        for p in range(n):
            r, c = divmod(p, size)
            adjacent = [(r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)]
            inside = [a * size + b for a, b in adjacent if 0 <= a < size and 0 <= b < size]
            nbr[p, : len(inside)] = inside
        rng = np.random.default_rng(20240601 + size)
        zobrist = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, (n, 3), np.int64)
        zobrist[:, EMPTY] = 0
        _TABLES[size] = (nbr, zobrist)
    return _TABLES[size]


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


# --------------------------------------------------------------------------- game


class GoState:
    """An immutable Go position (by convention: never assign to its fields).

    board: read-only int8 [N*N] (0 empty, 1 black, 2 white); to_play: 0 black, 1 white;
    passes: consecutive passes just played; moves: moves played, passes included;
    hash: Zobrist hash of the board; seen: read-only sorted int64 hashes of every board so
    far (this one included); last_move: last action or -1; history: the previous boards,
    newest first, as many as the game's `history` planes need.
    """

    __slots__ = ("board", "to_play", "passes", "moves", "hash", "seen", "last_move", "history")

    def __init__(self, board, to_play, passes, moves, hash, seen, last_move, history):
        self.board = board
        self.to_play = to_play
        self.passes = passes
        self.moves = moves
        self.hash = hash
        self.seen = seen
        self.last_move = last_move
        self.history = history

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, GoState)
            and self.hash == other.hash
            and self.to_play == other.to_play
            and self.passes == other.passes
            and self.moves == other.moves
            and np.array_equal(self.board, other.board)
            and np.array_equal(self.seen, other.seen)
        )

    def __hash__(self) -> int:
        return hash((self.hash, self.to_play, self.passes, self.moves))

    def __repr__(self) -> str:
        return f"GoState(moves={self.moves}, to_play={self.to_play}, passes={self.passes})"

    def __reduce__(self):
        fields = tuple(getattr(self, name) for name in self.__slots__)
        return _restore_state, fields


def _restore_state(board, to_play, passes, moves, hash, seen, last_move, history):
    # Unpickled arrays come back writable; freeze them again (and keep one kernel signature).
    return GoState(
        _frozen(board), to_play, passes, moves, hash, _frozen(seen), last_move,
        tuple(_frozen(past) for past in history),
    )


class Go:
    name = "go"

    def __init__(
        self, size: int = 9, komi: float = 7.5, max_moves: int | None = None, history: int = 0
    ):
        if not isinstance(size, int) or not MIN_SIZE <= size <= MAX_SIZE:
            raise ValueError(f"go size must be an integer {MIN_SIZE}..{MAX_SIZE}, got {size!r}")
        if history < 0:
            raise ValueError(f"go history must be >= 0, got {history}")
        self.size = size
        self.komi = float(komi)
        self.max_moves = 2 * size * size if max_moves is None else int(max_moves)
        if self.max_moves < 1:
            raise ValueError(f"go max_moves must be >= 1, got {max_moves}")
        self.history = history
        self.num_points = size * size
        self.pass_action = size * size
        self.num_actions = size * size + 1
        # own stones, opponent stones, (own, opponent) per history board, black to move, ones
        self.plane_shape = (4 + 2 * history, size, size)
        self._nbr, self._zobrist = _tables(size)

    def __repr__(self) -> str:
        return f"Go(size={self.size}, komi={self.komi}, max_moves={self.max_moves})"

    # ---------------------------------------------------------------- protocol

    def initial_state(self) -> GoState:
        board = _frozen(np.zeros(self.num_points, np.int8))
        seen = _frozen(np.zeros(1, np.int64))  # the empty board hashes to 0
        return GoState(board, 0, 0, 0, 0, seen, -1, ())

    def to_play(self, state: GoState) -> int:
        return state.to_play

    def is_terminal(self, state: GoState) -> bool:
        return state.passes >= 2 or state.moves >= self.max_moves

    def outcome(self, state: GoState) -> float:
        score = self.score(state)
        return 1.0 if score > 0 else -1.0 if score < 0 else 0.0

    def legal_mask(self, state: GoState) -> np.ndarray:
        if self.is_terminal(state):
            return np.zeros(self.num_actions, dtype=bool)
        return _legal(
            state.board, self._nbr, self._zobrist, state.to_play + 1, state.hash, state.seen
        )

    def apply(self, state: GoState, action: int) -> GoState:
        if not 0 <= action <= self.pass_action:
            raise IllegalMove(f"go action {action} is not in 0..{self.pass_action}")
        if self.is_terminal(state):
            raise IllegalMove("the game is over")
        history = state.history
        if self.history:
            history = (state.board,) + history[: self.history - 1]
        if action == self.pass_action:
            return GoState(
                state.board, 1 - state.to_play, state.passes + 1, state.moves + 1,
                state.hash, state.seen, action, history,
            )
        status, board, new_hash, seen = _play(
            state.board, self._nbr, self._zobrist, action, state.to_play + 1,
            state.hash, state.seen,
        )
        if status:
            raise IllegalMove(self._reason(status, action))
        board.flags.writeable = False
        seen.flags.writeable = False
        return GoState(
            board, 1 - state.to_play, 0, state.moves + 1, int(new_hash), seen, action, history
        )

    def planes(self, state: GoState) -> np.ndarray:
        n = self.size
        own, opp = state.to_play + 1, 2 - state.to_play
        out = np.zeros(self.plane_shape, dtype=np.float32)
        board = state.board.reshape(n, n)
        out[0] = board == own
        out[1] = board == opp
        for i, past in enumerate(state.history):
            past = past.reshape(n, n)
            out[2 + 2 * i] = past == own
            out[3 + 2 * i] = past == opp
        if state.to_play == 0:
            out[-2] = 1.0
        out[-1] = 1.0
        return out

    def symmetries(
        self, planes: np.ndarray, policy: np.ndarray
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        return dihedral_symmetries(planes, policy, self.size)

    def render(self, state: GoState) -> str:
        n = self.size
        letters = "   " + " ".join(COLUMNS[:n])
        lines = [letters]
        for r in range(n):
            row = " ".join(".XO"[v] for v in state.board[r * n : (r + 1) * n])
            lines.append(f"{n - r:2d} {row} {n - r:2d}")
        lines.append(letters)
        lines.append(f"{'Black' if state.to_play == 0 else 'White'} to play, move {state.moves}")
        return "\n".join(lines)

    def parse_move(self, state: GoState, text: str) -> int:
        action = gtp_to_action(self.size, text)
        reason = self.illegal_reason(state, action)
        if reason:
            raise IllegalMove(reason)
        return action

    def format_move(self, state: GoState, action: int) -> str:
        return action_to_gtp(self.size, action)

    # ---------------------------------------------------------------- Go extras

    def illegal_reason(self, state: GoState, action: int) -> str | None:
        """Why `action` is illegal in `state`, or None when it is legal."""
        if not 0 <= action <= self.pass_action:
            return f"go action {action} is not in 0..{self.pass_action}"
        if self.is_terminal(state):
            return "the game is over"
        if action == self.pass_action:
            return None
        status, *_ = _play(
            state.board, self._nbr, self._zobrist, action, state.to_play + 1,
            state.hash, state.seen,
        )
        return self._reason(status, action) if status else None

    def _reason(self, status: int, action: int) -> str:
        move = action_to_gtp(self.size, action)
        return {
            1: f"{move} is occupied",
            2: f"{move} is suicide",
            3: f"{move} repeats an earlier position (superko)",
        }[status]

    def area(self, state: GoState) -> tuple[int, int]:
        """Tromp-Taylor (black, white) area."""
        black, white = _area(state.board, self._nbr)
        return int(black), int(white)

    def ownership(self, state: GoState) -> np.ndarray:
        """Tromp-Taylor owner of every point as int8 [N, N]: +1 black (a black stone, or an
        empty point reaching only black stones), -1 white, 0 neither. Black's area is the
        count of +1, white's of -1 (`area`); at the end of a game it is KataGo's ownership
        target."""
        return _ownership(state.board, self._nbr).reshape(self.size, self.size)

    def score(self, state: GoState) -> float:
        """Black's area minus white's, minus komi (positive: black wins)."""
        black, white = self.area(state)
        return black - white - self.komi

    def set_to_play(self, state: GoState, player: int) -> GoState:
        """The same position with `player` to move (for GTP, where either colour may play)."""
        if player not in (0, 1):
            raise ValueError(f"player must be 0 or 1, got {player!r}")
        if player == state.to_play:
            return state
        return GoState(
            state.board, player, state.passes, state.moves, state.hash, state.seen,
            state.last_move, state.history,
        )

    def stone_at(self, state: GoState, point: int) -> int:
        """0 empty, 1 black, 2 white."""
        return int(state.board[point])

    def from_diagram(self, diagram: str, to_play: int = 0) -> GoState:
        """A fresh state (no history) from rows of `.`, `X` (black), `O` (white), top row
        first; spaces are ignored. Every group must have a liberty."""
        rows = [row.replace(" ", "") for row in diagram.strip().splitlines()]
        if len(rows) != self.size or any(len(row) != self.size for row in rows):
            raise ValueError(f"diagram must be {self.size} rows of {self.size} points")
        try:
            cells = [".XO".index(ch) for ch in "".join(rows)]
        except ValueError:
            raise ValueError("diagram points must be '.', 'X' or 'O'") from None
        board = _frozen(np.array(cells, np.int8))
        pos_hash = 0
        for point in np.flatnonzero(board):
            pos_hash ^= int(self._zobrist[point, board[point]])
        mark = np.zeros(self.num_points, np.int32)
        members = np.empty(self.num_points, np.int32)
        for point in np.flatnonzero(board):
            if _flood(board, self._nbr, point, mark, point + 1, members, True)[1] == 0:
                raise ValueError(f"the group at {action_to_gtp(self.size, point)} has no liberty")
        seen = _frozen(np.array([pos_hash], np.int64))
        return GoState(board, to_play, 0, 0, pos_hash, seen, -1, ())


# --------------------------------------------------------------------------- helpers


def gtp_to_action(size: int, text: str) -> int:
    """Action for a GTP vertex (`D4`, `d4`, `pass`) on a size x size board."""
    move = text.strip().upper()
    if move == "PASS":
        return size * size
    if len(move) < 2 or move[0] not in COLUMNS or not move[1:].isdigit():
        raise IllegalMove(f"bad go move {text!r} (write e.g. D4 or pass)")
    col = COLUMNS.index(move[0])
    row = int(move[1:])
    if col >= size or not 1 <= row <= size:
        raise IllegalMove(f"{move} is off the {size}x{size} board")
    return (size - row) * size + col


def action_to_gtp(size: int, action: int) -> str:
    """GTP vertex (`D4` or `pass`) of an action on a size x size board."""
    if action == size * size:
        return "pass"
    if not 0 <= action < size * size:
        raise IllegalMove(f"go action {action} is not in 0..{size * size}")
    row, col = divmod(int(action), size)
    return f"{COLUMNS[col]}{size - row}"


def result_string(score: float) -> str:
    """GTP/SGF result: `B+3.5`, `W+0.5` or `0`."""
    if score == 0:
        return "0"
    return f"{'B' if score > 0 else 'W'}+{abs(score):g}"


def random_move(game: Go, state: GoState, rng: np.random.Generator | None = None) -> int:
    """A uniformly random legal stone that does not fill one of the mover's own eyes
    (an empty point whose neighbours are all its stones); pass when there is none.

    A cheap baseline that ends games: it never passes early and never self-destructs."""
    rng = np.random.default_rng() if rng is None else rng
    legal = game.legal_mask(state)
    if not legal.any():
        raise IllegalMove("the game is over")
    n = game.size
    own = np.pad(state.board.reshape(n, n) == state.to_play + 1, 1, constant_values=True)
    eyes = own[:-2, 1:-1] & own[2:, 1:-1] & own[1:-1, :-2] & own[1:-1, 2:]
    candidates = np.flatnonzero(legal[:-1] & ~eyes.reshape(-1))
    if candidates.size == 0:
        return game.pass_action
    return int(candidates[rng.integers(candidates.size)])
