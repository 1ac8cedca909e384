"""A Go Text Protocol (version 2) engine for Go.

The engine keeps the game (rules, size, komi) and a stack of positions; the move choice is
injected as `choose_move(game, state) -> action`, so the same engine serves a random mover,
a raw network or a full search. Commands:

    protocol_version name version known_command list_commands quit
    boardsize clear_board komi play genmove undo showboard final_score

Either colour may `play` or `genmove` at any time, as GTP allows. A command that fails
answers `? message`; nothing a controller sends, and no exception inside `choose_move`,
stops the engine. `final_score` is the Tromp-Taylor result of the current position
(`B+3.5`, `W+0.5`, `0`); the engine never resigns.

    python -m rlscale.zero.gtp        # a random mover, for testing controllers
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any, TextIO, TypeVar

from .. import __version__
from .games.base import IllegalMove
from .games.go import Go, action_to_gtp, gtp_to_action, random_move, result_string

ChooseMove = Callable[[Go, Any], int]
GameFactory = Callable[..., Go]  # (size=..., komi=...) -> Go
T = TypeVar("T")

COMMANDS = (
    "protocol_version", "name", "version", "known_command", "list_commands", "quit",
    "boardsize", "clear_board", "komi", "play", "genmove", "undo", "showboard", "final_score",
)
_COLOURS = {"b": 0, "black": 0, "w": 1, "white": 1}


class GtpError(Exception):
    """A command failure, answered as `? message`."""


def _default_factory(size: int, komi: float) -> Go:
    return Go(size=size, komi=komi)


class GtpEngine:
    def __init__(
        self,
        game_factory: GameFactory | None,
        choose_move: ChooseMove,
        name: str = "rlscale",
        version: str = __version__,
        size: int = 9,
        komi: float = 7.5,
    ):
        self.game_factory = game_factory or _default_factory
        self.choose_move = choose_move
        self.name = name
        self.version = version
        self.game = self.game_factory(size=size, komi=komi)
        self.states = [self.game.initial_state()]
        self.moves: list[tuple[int, int]] = []  # (player, action) played, for records
        self.finished = False  # set by quit

    @property
    def state(self):
        return self.states[-1]

    # ------------------------------------------------------------------ loop

    def run(self, stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout) -> None:
        """Answer commands from `stdin` until `quit` or end of input."""
        for line in stdin:
            response = self.handle(line)
            if response is None:
                continue
            stdout.write(response)
            stdout.flush()
            if self.finished:
                break

    def handle(self, line: str) -> str | None:
        """The full response (ending in a blank line) to one command line; None for a line
        with no command (empty or only a comment)."""
        line = "".join(ch for ch in line if ch in "\t\n" or ch >= " " and ch != "\x7f")
        line = line.replace("\t", " ").split("#", 1)[0].strip()
        if not line:
            return None
        words = line.split()
        command_id = ""
        if words[0].isdigit():
            command_id = words.pop(0)
        if not words:
            return f"?{command_id} missing command\n\n"
        command, args = words[0].lower(), words[1:]
        try:
            if command not in COMMANDS:
                raise GtpError("unknown command")
            result = getattr(self, f"cmd_{command}")(args)
        except GtpError as err:
            return f"?{command_id} {str(err).replace(chr(10), ' ')}\n\n"
        except Exception as err:  # a bug must not kill the engine mid-game
            message = f"internal error: {type(err).__name__}: {err}".replace("\n", " ")
            return f"?{command_id} {message}\n\n"
        return f"={command_id}" + (f" {result}" if result else "") + "\n\n"

    # ------------------------------------------------------------------ commands

    def cmd_protocol_version(self, args: list[str]) -> str:
        return "2"

    def cmd_name(self, args: list[str]) -> str:
        return self.name

    def cmd_version(self, args: list[str]) -> str:
        return self.version

    def cmd_known_command(self, args: list[str]) -> str:
        _arity(args, 1)
        return "true" if args[0].lower() in COMMANDS else "false"

    def cmd_list_commands(self, args: list[str]) -> str:
        return "\n".join(COMMANDS)

    def cmd_quit(self, args: list[str]) -> str:
        self.finished = True
        return ""

    def cmd_boardsize(self, args: list[str]) -> str:
        size = _one_argument(args, int, "boardsize needs an integer")
        try:
            self.game = self.game_factory(size=size, komi=self.game.komi)
        except ValueError:
            raise GtpError("unacceptable size") from None
        self._clear()
        return ""

    def cmd_clear_board(self, args: list[str]) -> str:
        self._clear()
        return ""

    def cmd_komi(self, args: list[str]) -> str:
        komi = _one_argument(args, float, "komi needs a number")
        if not math.isfinite(komi) or abs(komi) > 1000:
            raise GtpError("syntax error: komi must be a finite number of points")
        # States do not depend on komi, so the position survives.
        self.game = self.game_factory(size=self.game.size, komi=komi)
        return ""

    def cmd_play(self, args: list[str]) -> str:
        _arity(args, 2)
        player = _colour(args[0])
        try:
            action = gtp_to_action(self.game.size, args[1])
        except IllegalMove as err:
            raise GtpError(f"syntax error: {err}") from None
        state = self.game.set_to_play(self.state, player)
        try:
            child = self.game.apply(state, action)
        except IllegalMove as err:
            raise GtpError(f"illegal move: {err}") from None
        self._push(player, action, child)
        return ""

    def cmd_genmove(self, args: list[str]) -> str:
        _arity(args, 1)
        player = _colour(args[0])
        state = self.game.set_to_play(self.state, player)
        if self.game.is_terminal(state):
            return "pass"  # nothing left to play under our rules; the controller decides
        try:
            action = int(self.choose_move(self.game, state))
        except Exception as err:
            raise GtpError(f"move choice failed: {type(err).__name__}: {err}") from None
        try:
            child = self.game.apply(state, action)
        except IllegalMove as err:
            raise GtpError(f"move choice was illegal: {err}") from None
        self._push(player, action, child)
        return action_to_gtp(self.game.size, action)

    def cmd_undo(self, args: list[str]) -> str:
        if len(self.states) == 1:
            raise GtpError("cannot undo")
        self.states.pop()
        self.moves.pop()
        return ""

    def cmd_showboard(self, args: list[str]) -> str:
        return "\n" + self.game.render(self.state)

    def cmd_final_score(self, args: list[str]) -> str:
        return result_string(self.game.score(self.state))

    # ------------------------------------------------------------------ helpers

    def _clear(self) -> None:
        self.states = [self.game.initial_state()]
        self.moves = []

    def _push(self, player: int, action: int, state) -> None:
        self.states.append(state)
        self.moves.append((player, action))


def _arity(args: list[str], count: int) -> None:
    if len(args) != count:
        raise GtpError(f"syntax error: expected {count} argument(s), got {len(args)}")


def _one_argument(args: list[str], parse: Callable[[str], T], needs: str) -> T:
    """The command's one argument, parsed; a syntax error saying what it `needs` if not."""
    _arity(args, 1)
    try:
        return parse(args[0])
    except ValueError:
        raise GtpError(f"syntax error: {needs}") from None


def _colour(word: str) -> int:
    try:
        return _COLOURS[word.lower()]
    except KeyError:
        raise GtpError(f"syntax error: bad colour {word!r}") from None


def random_engine(seed: int | None = None, **kwargs: Any) -> GtpEngine:
    """An engine that plays `random_move` (legal, never fills its own eyes)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return GtpEngine(None, lambda game, state: random_move(game, state, rng), **kwargs)


if __name__ == "__main__":
    random_engine().run()
