"""Run an OpenSpiel game through the Game protocol: `make_game("openspiel:connect_four")`.

Only two-player, sequential, deterministic, perfect-information, zero-sum games fit the
protocol. States are OpenSpiel states that this adapter never mutates (`apply` clones).
Planes are OpenSpiel's observation tensor for the player to move, reshaped to 3-D; there
are no symmetries beyond the identity. Moves are written as OpenSpiel writes them
(`action_to_string`) or as the action number.
"""

from __future__ import annotations

import difflib
from typing import Any

import numpy as np

from .base import IllegalMove


class OpenSpielMissing(ImportError):
    """OpenSpiel is not installed."""


def _pyspiel():
    try:
        import pyspiel
    except ImportError:
        raise OpenSpielMissing(
            "OpenSpiel is not installed: pip install 'rlscale[openspiel]'"
        ) from None
    return pyspiel


def check_game_name(pyspiel, short_name: str) -> None:
    """A one-line ValueError, with the closest names, for a game OpenSpiel does not know:
    its own error prints every registered name (128 lines), on stderr too."""
    known = pyspiel.registered_names()
    name = short_name.split("(", 1)[0]  # "connect_four(rows=5)": parameters in the name
    if name not in known:
        close = difflib.get_close_matches(name, known, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ValueError(f"unknown OpenSpiel game {name!r}{hint}; "
                         f"pyspiel.registered_names() lists the {len(known)} it knows")


class OpenSpielGame:
    def __init__(self, short_name: str, **params: Any):
        pyspiel = _pyspiel()
        check_game_name(pyspiel, short_name)
        try:
            self._game = pyspiel.load_game(short_name, params)
        except Exception as err:  # pyspiel raises RuntimeError/SpielError for unknown names
            raise ValueError(f"OpenSpiel cannot load {short_name!r}: {err}") from None
        kind = self._game.get_type()
        problems = []
        if self._game.num_players() != 2:
            problems.append(f"{self._game.num_players()} players")
        if kind.dynamics != pyspiel.GameType.Dynamics.SEQUENTIAL:
            problems.append("simultaneous moves")
        if kind.chance_mode != pyspiel.GameType.ChanceMode.DETERMINISTIC:
            problems.append("chance")
        if kind.information != pyspiel.GameType.Information.PERFECT_INFORMATION:
            problems.append("imperfect information")
        if kind.utility not in (
            pyspiel.GameType.Utility.ZERO_SUM, pyspiel.GameType.Utility.CONSTANT_SUM
        ):
            problems.append("not zero-sum")
        if not kind.provides_observation_tensor:
            problems.append("no observation tensor")
        if problems:
            raise ValueError(f"OpenSpiel game {short_name!r} does not fit: {', '.join(problems)}")
        self.name = f"openspiel:{short_name}"
        self.num_actions = self._game.num_distinct_actions()
        shape = tuple(self._game.observation_tensor_shape())
        if len(shape) > 3:
            shape = (int(np.prod(shape)),)
        self.plane_shape = (1,) * (3 - len(shape)) + shape

    @property
    def spiel_game(self):
        """The underlying `pyspiel.Game`."""
        return self._game

    def initial_state(self):
        return self._game.new_initial_state()

    def to_play(self, state) -> int:
        player = state.current_player()
        return player if player >= 0 else state.move_number() % 2

    def is_terminal(self, state) -> bool:
        return state.is_terminal()

    def outcome(self, state) -> float:
        if not state.is_terminal():
            return 0.0
        return float(np.sign(state.returns()[0]))

    def legal_mask(self, state) -> np.ndarray:
        if state.is_terminal():
            return np.zeros(self.num_actions, dtype=bool)
        return np.asarray(state.legal_actions_mask(), dtype=bool)[: self.num_actions]

    def apply(self, state, action: int):
        if not 0 <= action < self.num_actions:
            raise IllegalMove(f"{self.name} action {action} is not in 0..{self.num_actions - 1}")
        if state.is_terminal():
            raise IllegalMove("the game is over")
        if not self.legal_mask(state)[action]:
            raise IllegalMove(f"{self.format_move(state, action)} is not legal here")
        child = state.clone()
        child.apply_action(int(action))
        return child

    def planes(self, state) -> np.ndarray:
        tensor = np.asarray(state.observation_tensor(self.to_play(state)), dtype=np.float32)
        return tensor.reshape(self.plane_shape)

    def symmetries(
        self, planes: np.ndarray, policy: np.ndarray
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        return [(planes, policy)]

    def render(self, state) -> str:
        return str(state)

    def parse_move(self, state, text: str) -> int:
        move = text.strip()
        if state.is_terminal():
            raise IllegalMove("the game is over")
        player = state.current_player()
        legal = state.legal_actions()
        for action in legal:
            if state.action_to_string(player, action) == move:
                return action
        if move.isdigit() and int(move) in legal:
            return int(move)
        raise IllegalMove(f"{move!r} is not a legal {self.name} move here")

    def format_move(self, state, action: int) -> str:
        player = state.current_player()
        return state.action_to_string(player if player >= 0 else 0, int(action))
