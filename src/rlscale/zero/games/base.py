"""The Game protocol every Zero game implements.

A game object is stateless (rules and sizes); states are small immutable values, so the
search can keep them in tree nodes and share them between threads or processes.
Players are 0 (moves first) and 1.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np


class IllegalMove(ValueError):
    """A move that is malformed or not legal in the given position (one-line message)."""


@runtime_checkable
class Game(Protocol):
    name: str                       # registry name: "tictactoe", "connect4", "go"
    num_actions: int                # size of the policy vector
    plane_shape: tuple[int, int, int]  # (planes, height, width) of `planes()`

    def initial_state(self) -> Any: ...

    def to_play(self, state: Any) -> int:
        """The player to move, 0 or 1."""

    def legal_mask(self, state: Any) -> np.ndarray:
        """Boolean [num_actions]; all False only in terminal states."""

    def apply(self, state: Any, action: int) -> Any:
        """The state after `action`; raises IllegalMove if it is not legal."""

    def is_terminal(self, state: Any) -> bool: ...

    def outcome(self, state: Any) -> float:
        """Terminal result from player 0's view: +1 win, -1 loss, 0 draw."""

    def planes(self, state: Any) -> np.ndarray:
        """float32 network input of shape plane_shape, from the view of the player to move."""

    def symmetries(self, planes: np.ndarray, policy: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """All (planes, policy) pairs equivalent under the board's symmetries, identity first."""

    def render(self, state: Any) -> str: ...

    def parse_move(self, state: Any, text: str) -> int:
        """Action index for a move written by a person; raises IllegalMove."""

    def format_move(self, state: Any, action: int) -> str: ...
