"""The Agent that plays with a trained network, and loading one from disk.

An `Agent` is a network and its search settings: what plays matches (arena, GTP,
`rlscale zero play` and `move`). `load_agent` builds one from a saved model folder, a
checkpoint or a run directory, with the search settings saved for play.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rlscale.zero.config import MCTSConfig
from rlscale.zero.games.base import Game
from rlscale.zero.mcts import SearchResult, search_states
from rlscale.zero.network import PolicyValueNet, load_network


class Agent:
    """A network and its search: what plays matches (arena, GTP, `rlscale zero play`).

    `choose(state, simulations)` searches a fresh tree (no state kept between calls, no
    noise, most-visited move); `simulations=0` plays the raw policy. `choose_many` searches
    many positions in one batched search, for arenas playing many games at once.
    """

    def __init__(
        self, game: Game, net: PolicyValueNet, mcts: MCTSConfig | None = None, seed: int = 0
    ) -> None:
        self.game, self.net = game, net
        self.mcts = mcts or MCTSConfig()
        self.rng = np.random.default_rng(seed)

    def evaluate(self, planes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.net.evaluate(planes)

    def policy(self, state: Any) -> np.ndarray:
        """The network's prior over legal moves."""
        prior, _ = self.net.evaluate(self.game.planes(state)[None])
        legal = self.game.legal_mask(state)
        p = np.where(legal, prior[0], 0.0)
        return p / p.sum() if p.sum() > 0 else legal / legal.sum()

    def value(self, state: Any) -> float:
        """The network's value, from the view of the player to move."""
        return float(self.net.evaluate(self.game.planes(state)[None])[1][0])

    def search(self, states: list[Any], simulations: int | None = None) -> SearchResult:
        return search_states(
            self.game, states, self.net.evaluate, self.mcts, self.rng,
            simulations=self.mcts.simulations if simulations is None else simulations,
        )

    def choose_many(self, states: list[Any], simulations: int | None = None) -> np.ndarray:
        if simulations == 0:
            planes = np.stack([self.game.planes(s) for s in states])
            prior, _ = self.net.evaluate(planes)
            legal = np.stack([self.game.legal_mask(s) for s in states])
            return np.argmax(np.where(legal, prior, -1.0), -1)
        return self.search(states, simulations).chosen

    def choose(self, state: Any, simulations: int | None = None) -> int:
        return int(self.choose_many([state], simulations)[0])

    def choose_move(self, game: Game, state: Any) -> int:
        """The `choose_move(game, state)` callable the GTP engine takes."""
        return self.choose(state)


def load_agent(
    path: str | Path, simulations: int | None = None, seed: int = 0, **mcts_overrides: Any
) -> Agent:
    """Load an Agent from a saved network folder (`model.json`), a checkpoint, or a run dir
    (its `final/`, else its newest checkpoint). The search settings are those the network
    was trained with, minus self-play-only ones, then its saved play settings (`play_mcts`
    of the training config), then `mcts_overrides`."""
    from rlscale.runtime.checkpoint import latest_checkpoint
    from rlscale.zero.games import make_game

    path = Path(path)
    if not (path / "model.json").is_file():
        final = path / "final"
        latest = latest_checkpoint(path)
        if (final / "model.json").is_file():
            path = final
        elif latest is not None:
            path = latest
    net, meta = load_network(path)
    game = make_game(meta.game, **meta.game_kwargs)
    settings = dict(meta.extra.get("mcts", {}))
    settings.update(meta.extra.get("play_mcts", {}))
    settings.update(mcts_overrides)
    if simulations is not None:
        settings["simulations"] = simulations
    return Agent(game, net, MCTSConfig(**settings), seed=seed)
