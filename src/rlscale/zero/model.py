"""A trained network with the search it plays with (`Model`), and loading one from disk.

A `Model` is a network, its game and its search settings; an arena agent (`NetworkAgent`,
zero/agents.py), GTP and `rlscale zero play` / `move` play through one. `load_model` builds one
from a saved model folder, a checkpoint or a run directory, with the search settings saved for
play (`play_settings`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from .config import MCTSConfig
from .games.base import Game
from .mcts import SearchResult
from .network import PolicyValueNet, load_network
from .search import search_states

MODELS_DIR = Path(__file__).resolve().parent / "models"


def shipped_model(game: str) -> Path:
    """Where the package ships the trained model of `game` (it may not exist)."""
    return MODELS_DIR / game


class Model:
    """A network and its search: what a network agent, GTP and `rlscale zero play` play with.

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

    def search(
        self, states: list[Any], simulations: int | None = None, game: Game | None = None
    ) -> SearchResult:
        return search_states(
            game or self.game, states, self.net.evaluate, self.mcts, self.rng,
            simulations=self.mcts.simulations if simulations is None else simulations,
        )

    def choose_many(
        self, states: list[Any], simulations: int | None = None, game: Game | None = None
    ) -> np.ndarray:
        """`game`: the rules to search with, when they differ from the model's own in what
        the network does not see (a GTP controller's komi)."""
        game = game or self.game
        if simulations == 0:
            planes = np.stack([game.planes(s) for s in states])
            prior, _ = self.net.evaluate(planes)
            legal = np.stack([game.legal_mask(s) for s in states])
            return np.argmax(np.where(legal, prior, -1.0), -1)
        return self.search(states, simulations, game).chosen

    def choose(self, state: Any, simulations: int | None = None) -> int:
        return int(self.choose_many([state], simulations)[0])

    def choose_move(self, game: Game, state: Any, simulations: int | None = None) -> int:
        """The `choose_move(game, state)` callable the GTP engine takes."""
        return int(self.choose_many([state], simulations, game)[0])


def play_settings(extra: dict[str, Any], **overrides: Any) -> MCTSConfig:
    """The search a saved network plays with (arena, play, move, gtp): the search it was
    trained with (`extra["mcts"]`, saved without the self-play-only noise settings), updated
    by its saved play settings (`extra["play_mcts"]`, the config's `play_mcts`), then by
    `overrides`."""
    settings = dict(extra.get("mcts", {}))
    settings.update(extra.get("play_mcts", {}))
    settings.update(overrides)
    return MCTSConfig(**settings)


def model_folder(path: str | Path) -> Path:
    """The folder holding `model.json` that `path` names: itself, or for a run directory its
    `final/`, else its newest checkpoint (else `path`, for the loader to refuse)."""
    from ..runtime.checkpoint import latest_checkpoint

    path = Path(path)
    if (path / "model.json").is_file():
        return path
    if (path / "final" / "model.json").is_file():
        return path / "final"
    return latest_checkpoint(path) or path


def load_model(
    path: str | Path, simulations: int | None = None, seed: int = 0, *,
    device: str | torch.device = "cpu", **mcts_overrides: Any
) -> Model:
    """Load a Model from a saved network folder (`model.json`), a checkpoint, or a run dir
    (its `final/`, else its newest checkpoint), with its `play_settings` updated by
    `mcts_overrides` (and `simulations`), its network on `device`."""
    from .games import make_game

    net, meta = load_network(model_folder(path), device=device)
    game = make_game(meta.game, **meta.game_kwargs)
    if simulations is not None:
        mcts_overrides["simulations"] = simulations
    return Model(game, net, play_settings(meta.extra, **mcts_overrides), seed=seed)
