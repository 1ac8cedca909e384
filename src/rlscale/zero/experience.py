"""Where Zero's games come from: one experience source, in the learner's process or a fleet.

Both kinds answer the loop the same way:
`next_batch(games, on_step)` gives the samples of `games` finished games, their statistics
and the source's own figures; `publish(state_dict, version)` hands over new weights;
`set_resign_threshold` passes the tuned threshold on; `checkpoint_state` and
`save_games`/`load_games` are what a checkpoint keeps of it. `InProcessSelfPlay` is one
`Actor` playing between learner phases (a resumed run continues exactly);
`zero.actors.FleetSelfPlay` is M Ray actors playing while the learner trains.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..runtime.versions import WeightStore
from .replay import Samples
from .selfplay import Actor, PlayStats

GAMES_FILE = "actor.pkl"  # the in-process actor's games in flight, with their trees


class InProcessSelfPlay:
    """Self-play in the learner's process: `actor` on the newest weights of `weights`."""

    def __init__(self, actor: Actor, weights: WeightStore) -> None:
        self.actor, self.weights = actor, weights

    def reset_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Start the store afresh at `version` (a checkpoint was loaded); the actor reloads
        at its next sync."""
        self.weights = WeightStore(state_dict, version=version)
        self.actor.weights = self.weights

    def next_batch(self, games: int, on_step: Callable[[PlayStats], None] | None = None
                   ) -> tuple[Samples, PlayStats, dict[str, float]]:
        self.actor.sync()
        samples, stats = self.actor.play(games, on_step=on_step)
        return samples, stats, {}

    def publish(self, state_dict: dict[str, Any], version: int) -> None:
        self.weights.publish(state_dict, version)

    def set_resign_threshold(self, threshold: float | None) -> None:
        self.actor.resign_threshold = threshold

    def checkpoint_state(self) -> None:
        return None

    def save_games(self, folder: Path) -> None:
        with open(folder / GAMES_FILE, "wb") as f:
            pickle.dump(self.actor.state_dict(), f)

    def load_games(self, folder: Path, concurrent_games: int) -> None:
        """The games in flight saved in `folder`, unless it has none (saved by a fleet run:
        fresh games) or the resumed config plays another number at once."""
        if not (folder / GAMES_FILE).is_file():
            return
        with open(folder / GAMES_FILE, "rb") as f:
            state = pickle.load(f)
        if len(state["slots"]) == concurrent_games:
            self.actor.load_state_dict(state)

    def close(self) -> None:
        return None
