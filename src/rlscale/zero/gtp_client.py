"""Play any Go Text Protocol engine (GNU Go, KataGo, Leela Zero) as an arena agent.

`GtpProcess` runs the engine from a command line and speaks GTP to it: one command, one
response, each under a deadline. A dead engine (it exited or closed its output) and a hung
one (no answer in time) are one-line `GtpEngineError`s naming the engine, the command and
the end of its stderr. `close()` sends `quit`, then terminates and at last kills it; a
finalizer does the same if the object is dropped, so no engine outlives the Python process.

`GtpAgent` is an `Agent` (zero/agents.py: `name`, `act`, `act_many`). The engine has
one board and the arena plays many games at once, so before every `genmove` the agent puts
the engine's board in the position it is asked about by replaying that game's moves
(`boardsize`, `komi`, `clear_board`, `play` ...; only the missing moves when the engine's
board is already on the way there, as in a match played one game at a time). A Go state does
not carry its move list, so the agent keeps one per game: a state it is asked about is a
game it moved in (the state after its move, or that state and one opponent move), or a new
game, whose opening (the arena's few random plies) it rebuilds from the stones.

Answers the arena's rules cannot take: `resign` is played as a pass (the engine gives up
the rest of the game; the arena scores by Tromp-Taylor, as every game ends), and so is a
move our rules refuse (GNU Go knows simple ko, not positional superko, unless told
`--positional-superko`); both are counted and noted in the game's SGF.

Every game is saved as SGF (`rlscale.zero.sgf`) in `sgf_dir`, `game_0001.sgf` on, rewritten
after each of the engine's moves. A game the engine's own move ends gets its result at once;
one the opponent ends (the engine is not asked again) is completed when the arena says it is
over (`game_over`, with the final position: the opponent's last move and the result). A
caller that never says so gets it inferred at `close()`: after the engine's pass the only
move that ends a game short of the move cap is the opponent's pass.

For GNU Go under Tromp-Taylor scoring use `--chinese-rules --capture-all-dead` (area
scoring; it removes dead stones before passing, which Tromp-Taylor needs) and
`--positional-superko`:

    gtp:/usr/games/gnugo --mode gtp --level 1 --chinese-rules --capture-all-dead --positional-superko
"""

from __future__ import annotations

import atexit
import os
import selectors
import shlex
import subprocess
import tempfile
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .games.base import IllegalMove
from .games.go import Go, GoState, action_to_gtp, gtp_to_action, result_string
from .sgf import write_sgf

DEFAULT_TIMEOUT = 60.0  # seconds for one command (a genmove of a slow engine included)
_COLOURS = "bw"


class GtpEngineError(ValueError):
    """The engine died, hung, or answered nonsense (one line). A ValueError, so the CLI
    reports it as a one-line error like any other bad input."""


class GtpFailure(Exception):
    """The engine answered `? message` to a command."""


def _kill(proc: subprocess.Popen, stderr) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()
    stderr.close()


class GtpProcess:
    """A GTP engine in a subprocess (the command line is split as a shell would)."""

    def __init__(self, command: str | Sequence[str], timeout: float = DEFAULT_TIMEOUT) -> None:
        argv = shlex.split(command) if isinstance(command, str) else list(command)
        if not argv:
            raise GtpEngineError("empty GTP engine command line")
        self.argv, self.timeout = argv, timeout
        self.label = os.path.basename(argv[0])
        self._stderr = tempfile.TemporaryFile()
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._stderr)
        except OSError as err:
            self._stderr.close()
            raise GtpEngineError(f"cannot start GTP engine {argv[0]!r}: {err.strerror}") from None
        self._buffer = b""
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.proc.stdout, selectors.EVENT_READ)
        self._finalizer = weakref.finalize(self, _kill, self.proc, self._stderr)

    def send(self, command: str, timeout: float | None = None) -> str:
        """The engine's answer to `command` (without `= `); GtpFailure on `? message`."""
        if not self._finalizer.alive:
            raise GtpEngineError(f"GTP engine {self.label} was stopped (at {command!r})")
        if self.proc.poll() is not None:
            raise self._dead(command)
        try:
            self.proc.stdin.write(command.encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._dead(command) from None
        response = self._read_response(command, self.timeout if timeout is None else timeout)
        if response[0] == "?":  # commands are sent without ids, so none come back
            raise GtpFailure(response[1:].strip())
        return response[1:].strip()

    def _read_response(self, command: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            text = self._buffer.replace(b"\r", b"")
            # A response is '=' or '?' ... up to an empty line; anything before is noise.
            start = min((i for i in (text.find(b"="), text.find(b"?")) if i >= 0), default=-1)
            end = text.find(b"\n\n", max(start, 0))
            if start >= 0 and end >= 0:
                self._buffer = text[end + 2 :]
                return text[start:end].decode(errors="replace")
            left = deadline - time.monotonic()
            if left <= 0 or not self._selector.select(left):
                error = GtpEngineError(
                    f"GTP engine {self.label} did not answer {command!r} within {timeout:g} s"
                    + self._stderr_tail())
                self._selector.close()
                self._finalizer()  # a late answer would be taken for the next one's: kill it
                raise error
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                try:
                    self.proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    pass
                raise self._dead(command)
            self._buffer += chunk

    def _stderr_tail(self) -> str:
        if self._stderr.closed:
            return ""
        self._stderr.flush()
        self._stderr.seek(0, os.SEEK_END)
        self._stderr.seek(max(0, self._stderr.tell() - 300))
        lines = self._stderr.read().decode(errors="replace").strip().splitlines()
        return f"; its stderr ends: {lines[-1].strip()[:200]}" if lines else ""

    def _dead(self, command: str) -> GtpEngineError:
        code = self.proc.poll()
        status = f"exited with status {code}" if code is not None else "closed its output"
        return GtpEngineError(f"GTP engine {self.label} {status} (at {command!r})"
                              + self._stderr_tail())

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self, timeout: float = 5.0) -> None:
        """`quit`, then terminate, then kill: the engine is gone when this returns."""
        if not self._finalizer.alive:
            return
        if self.proc.poll() is None:
            try:
                self.send("quit", timeout=timeout)
            except (GtpEngineError, GtpFailure):
                pass
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=timeout)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    pass
        self._selector.close()
        self._finalizer()  # kills it if still alive, closes the pipes


@dataclass
class _GameLog:
    """One game as the agent saw it: every move so far, and where its record goes."""

    number: int
    moves: list[tuple[int, int]]  # (player, action), from the initial position
    engine_players: set[int] = field(default_factory=set)  # the colours the engine played
    notes: list[str] = field(default_factory=list)
    result: str | None = None


class GtpAgent:
    """A GTP engine as an arena agent (see the module docstring).

    `sgf_dir`: where every game is saved (None: nowhere). `player_name`: the engine's name in
    the SGF records (default: its `name` and `version` answers)."""

    def __init__(self, command: str | Sequence[str], sgf_dir: str | Path | None = None,
                 timeout: float = DEFAULT_TIMEOUT, name: str | None = None) -> None:
        self.engine = GtpProcess(command, timeout)
        try:
            engine_name = self.engine.send("name")
            version = self.engine.send("version")
        except GtpFailure as err:
            self.engine.close()
            raise GtpEngineError(f"GTP engine {self.engine.label} failed `name`: {err}") from None
        except GtpEngineError:
            self.engine.close()
            raise
        self.player_name = f"{engine_name} {version}".strip()
        args = " ".join(self.engine.argv[1:])
        self.name = name or f"gtp:{self.engine.label}" + (f" {args}" if args else "")
        self.sgf_dir = Path(sgf_dir) if sgf_dir is not None else None
        if self.sgf_dir is not None:
            self.sgf_dir.mkdir(parents=True, exist_ok=True)
        self.resignations = 0  # `resign` answers, played as passes
        self.refused = 0  # engine moves our rules refuse, played as passes
        self._games = 0
        self._pending: dict[GoState, list[_GameLog]] = {}  # state after the engine's move
        # The engine's board (size, komi, moves played) when known to be the game's; its
        # size and komi (changing them costs a reset).
        self._board: tuple[int, float, list[tuple[int, int]]] | None = None
        self._rules: tuple[int, float] | None = None
        self._game: Go | None = None
        atexit.register(self.close)

    # -- the arena's agent protocol -----------------------------------------------------------
    def act(self, game: Go, state: GoState) -> int:
        if game.name != "go":
            raise ValueError(f"a GTP engine plays go, not {game.name}")
        self._game = game
        log = self._log_for(game, state)
        player = game.to_play(state)
        self._sync(game, log.moves)
        try:
            answer = self.engine.send(f"genmove {_COLOURS[player]}")
        except GtpFailure as err:
            raise GtpEngineError(f"GTP engine {self.engine.label} failed genmove: {err}") from None
        action, as_answered = self._action(game, state, answer, log)
        if as_answered and self._board is not None:
            self._board[2].append((player, action))
        else:
            self._board = None  # the engine's board is not the game's: replay next time
        after = game.apply(state, action)
        log.moves.append((player, action))
        log.engine_players.add(player)
        if game.is_terminal(after):
            log.result = result_string(game.score(after))
        else:
            self._pending.setdefault(after, []).append(log)
        self._write(game, log)
        return action

    def act_many(self, game: Go, states: Sequence[GoState]) -> np.ndarray:
        return np.array([self.act(game, s) for s in states], dtype=np.int64)

    def game_over(self, game: Go, state: GoState) -> None:
        """The game that ended in `state`: where the opponent's move ended it, that move and
        the result go into its record (a game the engine's move ended has both already)."""
        log = self._log_after_opponent(game, state)
        if log is not None:
            log.result = result_string(game.score(state))
            self._write(game, log)

    # -- games --------------------------------------------------------------------------------
    def _log_for(self, game: Go, state: GoState) -> _GameLog:
        """The game `state` belongs to, with its moves up to `state`."""
        logs = self._pending.get(state)
        if logs:  # the engine plays both sides, or was asked again
            return self._take(state)
        log = self._log_after_opponent(game, state)
        if log is not None:
            return log
        self._games += 1
        return _GameLog(self._games, opening_moves(game, state))

    def _log_after_opponent(self, game: Go, state: GoState) -> _GameLog | None:
        """The game whose position after the engine's move the opponent's move took to
        `state`, taken off the pending games with that move appended; None if no game was."""
        if state.moves == 0:
            return None
        for before in [s for s in self._pending if s.moves == state.moves - 1]:
            try:
                if game.apply(before, state.last_move) == state:
                    log = self._take(before)
                    log.moves.append((before.to_play, state.last_move))
                    return log
            except IllegalMove:
                continue
        return None

    def _take(self, state: GoState) -> _GameLog:
        logs = self._pending[state]
        log = logs.pop()
        if not logs:
            del self._pending[state]
        return log

    def _sync(self, game: Go, moves: list[tuple[int, int]]) -> None:
        """Bring the engine's board to the position after `moves`."""
        board = self._board
        if board is not None and board[0] == game.size and board[1] == game.komi \
                and moves[: len(board[2])] == board[2]:
            todo = moves[len(board[2]) :]
        else:
            if self._rules != (game.size, game.komi):
                self._rules = None
                self._command(f"boardsize {game.size}")
                self._command(f"komi {game.komi:g}")
                self._rules = (game.size, game.komi)
            self._command("clear_board")
            self._board = board = (game.size, game.komi, [])
            todo = moves
        for player, action in todo:
            self._command(f"play {_COLOURS[player]} {action_to_gtp(game.size, action)}")
            board[2].append((player, action))

    def _command(self, command: str) -> None:
        try:
            self.engine.send(command)
        except GtpFailure as err:
            self._board = None
            raise GtpEngineError(
                f"GTP engine {self.engine.label} refused {command!r}: {err}") from None

    def _action(self, game: Go, state: GoState, answer: str, log: _GameLog) -> tuple[int, bool]:
        """The arena action for the engine's genmove answer, and whether it is the answer
        itself (else a pass stands in for it)."""
        ply = state.moves + 1
        if answer.lower() == "resign":
            self.resignations += 1
            log.notes.append(f"move {ply}: {self.player_name} resigned (played as a pass)")
            return game.pass_action, False
        try:
            action = gtp_to_action(game.size, answer)
        except IllegalMove:
            raise GtpEngineError(f"GTP engine {self.engine.label} answered genmove with "
                                 f"{answer[:40]!r}, not a move") from None
        reason = game.illegal_reason(state, action)
        if reason is not None:
            self.refused += 1
            log.notes.append(f"move {ply}: {self.player_name} played {answer}, illegal here "
                             f"({reason}); played as a pass")
            return game.pass_action, False
        return action, True

    # -- records ------------------------------------------------------------------------------
    def _write(self, game: Go, log: _GameLog) -> None:
        if self.sgf_dir is None:
            return
        black = self.player_name if 0 in log.engine_players else ""
        white = self.player_name if 1 in log.engine_players else ""
        write_sgf(self.sgf_dir / f"game_{log.number:04d}.sgf", game.size, game.komi, log.moves,
                  result=log.result, black=black, white=white, comment="; ".join(log.notes))

    def close(self) -> None:
        """Complete the records of games the opponent ended that no `game_over` call
        completed, and stop the engine.

        Call it when the games are over (after `play_match`; at exit it runs by itself): a
        game left after the engine's pass is taken to have ended with the opponent's pass."""
        atexit.unregister(self.close)
        game, self._game = self._game, None
        for state, logs in list(self._pending.items()) if game is not None else []:
            for log in logs:
                if state.passes == 1 and state.moves + 1 < game.max_moves:
                    final = game.apply(state, game.pass_action)
                    log.moves.append((state.to_play, game.pass_action))
                    log.result = result_string(game.score(final))
                    log.notes.append("the last move (the opponent's pass) inferred at close")
                else:
                    log.notes.append("the game ended on the opponent's next move, not seen "
                                     "by the GTP agent")
                self._write(game, log)
        self._pending.clear()
        self.engine.close()

    def __enter__(self) -> GtpAgent:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def opening_moves(game: Go, state: GoState) -> list[tuple[int, int]]:
    """(player, action) moves from the initial position to `state`, for a game seen first
    after an opening without captures (the arena's few random plies): each colour's stones
    and passes, the trailing pass or the last stone last. ValueError when no such sequence
    gives `state`."""
    previous = 1 - state.to_play  # who made the last move
    counts = ((state.moves + 1) // 2, state.moves // 2)  # black moves first
    lists = []
    for player in (0, 1):
        stones = np.flatnonzero(state.board == player + 1).tolist()
        if player == previous and state.last_move in stones:
            stones.remove(state.last_move)
            stones.append(state.last_move)
        passes = [game.pass_action] * (counts[player] - len(stones))
        trailing = player == previous and state.passes > 0
        lists.append(stones + passes if trailing else passes + stones)
    moves = [(i % 2, lists[i % 2][i // 2]) for i in range(state.moves)]
    replayed = game.initial_state()
    try:
        if any(counts[p] < len(np.flatnonzero(state.board == p + 1)) for p in (0, 1)):
            raise IllegalMove("more stones than moves")
        for _, action in moves:
            replayed = game.apply(replayed, action)
    except IllegalMove:
        replayed = None
    if replayed is None or not np.array_equal(replayed.board, state.board) \
            or (replayed.to_play, replayed.passes) != (state.to_play, state.passes):
        raise ValueError(f"the GTP agent cannot rebuild the moves of a game first seen at "
                         f"move {state.moves}: it follows a game from its start or from a "
                         f"short opening without captures")
    return moves


def default_sgf_dir(label: str, root: str | Path = Path("runs") / "zero" / "gtp") -> Path:
    """A fresh folder for one match's records: `<root>/<engine>-<YYYYmmdd-HHMMSS>[-N]`."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path, n = Path(root) / f"{label}-{stamp}", 1
    while path.exists():
        n += 1
        path = Path(root) / f"{label}-{stamp}-{n}"
    return path


def gtp_agent(command: str, sgf_dir: str | Path | None = None) -> GtpAgent:
    """The agent of an arena spec `gtp:<command line>`; its games go to `sgf_dir`
    (default: `default_sgf_dir`)."""
    if not command.strip():
        raise ValueError("bad agent 'gtp:': give the engine's command line, e.g. "
                         "gtp:/usr/games/gnugo --mode gtp --level 1")
    argv = shlex.split(command)
    return GtpAgent(argv, sgf_dir or default_sgf_dir(os.path.basename(argv[0])))
