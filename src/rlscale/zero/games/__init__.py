"""Zero games: the Game protocol, the built-in games and the registry.

    make_game("tictactoe")
    make_game("connect4")
    make_game("go", size=9, komi=7.5)        # also max_moves=..., history=...
    make_game("openspiel:connect_four")      # any OpenSpiel game (pip install 'rlscale[openspiel]')

Game modules are imported on first use, so asking for tic-tac-toe does not compile Go.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from .base import Game, IllegalMove


def _tictactoe() -> type:
    from .tictactoe import TicTacToe

    return TicTacToe


def _connect4() -> type:
    from .connect4 import Connect4

    return Connect4


def _go() -> type:
    from .go import Go

    return Go


# name -> loader returning the game class (called with the options of `make_game`)
GAMES: dict[str, Callable[[], type]] = {
    "connect4": _connect4,
    "go": _go,
    "tictactoe": _tictactoe,
}
OPENSPIEL_PREFIX = "openspiel:"


def make_game(name: str, **kwargs) -> Game:
    """The game registered as `name`, built with `kwargs` (see each game's constructor).

    `openspiel:<short name>` runs an OpenSpiel game through the protocol; its kwargs are
    the OpenSpiel game parameters."""
    if name.startswith(OPENSPIEL_PREFIX):
        from .openspiel import OpenSpielGame

        return OpenSpielGame(name[len(OPENSPIEL_PREFIX) :], **kwargs)
    if name not in GAMES:
        known = ", ".join(sorted(GAMES))
        raise ValueError(f"unknown game {name!r} (known: {known}, openspiel:<name>)")
    cls = GAMES[name]()
    accepted = set(inspect.signature(cls).parameters)
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        allowed = ", ".join(sorted(accepted)) or "none"
        raise ValueError(f"game {name!r} takes no option {unknown[0]!r} (options: {allowed})")
    return cls(**kwargs)


def defines_ownership(name: str) -> bool:
    """Whether the game registered as `name` knows who owns each point at the end (a method
    `ownership(state)`, as Go's): what KataGo's ownership and score targets need."""
    return name in GAMES and callable(getattr(GAMES[name](), "ownership", None))


__all__ = ["GAMES", "Game", "IllegalMove", "defines_ownership", "make_game"]
