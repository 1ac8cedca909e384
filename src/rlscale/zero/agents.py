"""The agents: anything with `name`, `act(game, state) -> action` and
`act_many(game, states) -> actions` plays a match (the `Agent` protocol). An agent that keeps
records of its games (`GtpAgent`'s SGFs) may also have `game_over(game, final_state)`: the
arena calls it with every game's last position, whoever made the last move (`game_over`).

`RandomAgent` (uniform over legal moves), `PureMCTSAgent` (UCT with uniformly random
playouts, no knowledge: zero/uct.py), `NetworkAgent` (a `Model`, zero/model.py: its raw
policy with 0 simulations, else its search with N simulations, no noise), `SolverAgent`
(perfect Connect Four) and `GtpAgent` (any GTP engine, zero/gtp_client.py). `act_many` is
where batching pays: a `NetworkAgent` searches every position of the call in ONE batched
search (one network call per simulation step over all trees), so a match moves all its games
at once.

Agent specs (`make_agent`: `--opponent`, `--agent`, the anchors of an Elo curve) name them on
the command line.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from .games.base import Game
from .uct import DEFAULT_UCT_C, uct_search

if TYPE_CHECKING:
    import torch

    from .model import Model

@runtime_checkable
class Agent(Protocol):
    name: str

    def act(self, game: Game, state: Any) -> int:
        """The move to play in `state` (never called on a terminal state)."""

    def act_many(self, game: Game, states: Sequence[Any]) -> np.ndarray:
        """The moves for many positions at once (one batched search where that helps)."""


class _OneByOne:
    """`act_many` by calling `act` per position, for agents with nothing to batch."""

    def act_many(self, game: Game, states: Sequence[Any]) -> np.ndarray:
        return np.array([self.act(game, s) for s in states], dtype=np.int64)


class RandomAgent(_OneByOne):
    """Uniform over the legal moves."""

    def __init__(self, seed: int = 0) -> None:
        self.name = "random"
        self.rng = np.random.default_rng(seed)

    def act(self, game: Game, state: Any) -> int:
        legal = np.flatnonzero(game.legal_mask(state))
        return int(legal[self.rng.integers(legal.size)])


class FirstLegalAgent(_OneByOne):
    """The lowest-numbered legal move: a deterministic agent for tests."""

    name = "first-legal"

    def act(self, game: Game, state: Any) -> int:
        return int(np.flatnonzero(game.legal_mask(state))[0])


class SolverAgent(_OneByOne):
    """Perfect Connect Four: a move of the best exact score (fastest win, slowest loss)."""

    def __init__(self, seed: int = 0) -> None:
        self.name = "solver"
        self.rng = np.random.default_rng(seed)

    def act(self, game: Game, state: Any) -> int:
        from .solver import best_moves

        if game.name != "connect4":
            raise ValueError(f"the solver agent plays connect4, not {game.name}")
        best = best_moves(state)
        return int(best[self.rng.integers(len(best))])


class PureMCTSAgent(_OneByOne):
    """Pure MCTS (`rlscale.zero.uct.uct_search`): UCT with `simulations` uniformly random
    playouts per move, no network, no priors, a fresh tree per move."""

    def __init__(self, simulations: int = 1000, seed: int = 0, uct_c: float = DEFAULT_UCT_C):
        if simulations < 1:
            raise ValueError("pure MCTS needs at least 1 simulation")
        self.simulations, self.uct_c = simulations, uct_c
        self.name = f"mcts:{simulations}"
        self.rng = np.random.default_rng(seed)

    def act(self, game: Game, state: Any) -> int:
        return uct_search(game, state, self.simulations, self.rng, self.uct_c)


class NetworkAgent:
    """A `Model` (a network with its search) at a budget: raw policy at 0 simulations, else
    `simulations` of search from a fresh tree per move, no root noise, the search's own move
    choice (most visited for PUCT; the sequential-halving survivor for Gumbel)."""

    def __init__(self, model: Model, simulations: int, name: str | None = None) -> None:
        self.model = model
        self.simulations = simulations
        self.name = name or (f"net({simulations} sims)" if simulations else "net(raw)")

    @property
    def game(self) -> Game:
        return self.model.game

    def with_simulations(self, simulations: int, name: str | None = None) -> NetworkAgent:
        """The same network (shared, not copied) with another budget."""
        return NetworkAgent(self.model, simulations, name)

    def act(self, game: Game, state: Any) -> int:
        return int(self.act_many(game, [state])[0])

    def act_many(self, game: Game, states: Sequence[Any]) -> np.ndarray:
        if game.name != self.model.game.name:
            raise ValueError(f"{self.name} plays {self.model.game.name}, not {game.name}")
        return np.asarray(self.model.choose_many(list(states), self.simulations), np.int64)


SEARCH_KINDS = ("trained", "puct", "gumbel")


def load_network_agent(
    path: str | Path,
    simulations: int,
    game: str | None = None,
    search: str = "trained",
    seed: int = 0,
    name: str | None = None,
    device: str | torch.device = "cpu",
) -> NetworkAgent:
    """A NetworkAgent from a model folder, a checkpoint or a run directory.

    `search`: "trained" keeps the search settings saved with the network (its self-play
    settings updated by its `play_mcts`, see `load_model`),
    "puct"/"gumbel" force one. With `game`, a checkpoint for another game is refused with a
    one-line ValueError. `device`: where the network evaluates."""
    from .model import load_model

    if search not in SEARCH_KINDS:
        raise ValueError(f"unknown search {search!r} (choose from {', '.join(SEARCH_KINDS)})")
    if not Path(path).exists():
        raise FileNotFoundError(f"no model at {path}")
    overrides = {} if search == "trained" else {"gumbel": search == "gumbel"}
    model = load_model(path, seed=seed, device=device, **overrides)
    if game is not None and model.game.name != game:
        raise ValueError(f"checkpoint {path} is for {model.game.name}, not for {game}")
    return NetworkAgent(model, simulations, name)


def act_many(agent: Any, game: Game, states: Sequence[Any]) -> np.ndarray:
    """`agent.act_many` if it has one, else `act` per position."""
    if hasattr(agent, "act_many"):
        return np.asarray(agent.act_many(game, states), np.int64)
    return np.array([agent.act(game, s) for s in states], np.int64)


def game_over(agent: Any, game: Game, state: Any) -> None:
    """Tell `agent` the game that ended in `state` is over, if it listens (`game_over`)."""
    listener = getattr(agent, "game_over", None)
    if listener is not None:
        listener(game, state)


# -- agent specs (`--opponent`, `--agent`, anchors) ------------------------------------------

# The search preallocates a node per simulation (x the game's moves): a budget beyond this
# asks for gigabytes before the first move, and no game here gains from it.
MAX_SIMULATIONS = 200_000


def check_simulations(simulations: int, flag: str = "--simulations") -> int:
    if not 0 <= simulations <= MAX_SIMULATIONS:
        raise ValueError(f"{flag} must be in 0..{MAX_SIMULATIONS}, got {simulations}")
    return simulations


def load_model_agent(path: Path, game: str, simulations: int, search: str, seed: int,
                     name: str | None = None, device: Any = "cpu") -> NetworkAgent:
    """`load_network_agent` for a path a user gave: the budget checked, and a corrupt or
    mismatched weights file named in a one-line ValueError."""
    check_simulations(simulations)
    try:
        return load_network_agent(path, simulations, game=game, search=search, seed=seed,
                                  name=name, device=device)
    except (ValueError, FileNotFoundError):
        raise
    except Exception as err:  # a corrupt or mismatched weights file: say which file
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ValueError(f"cannot load the model at {path}: {first}") from err


def _count_after(spec: str, prefix: str) -> int:
    try:
        value = int(spec[len(prefix):])
    except ValueError:
        raise ValueError(f"bad agent {spec!r}: {prefix}N needs an integer N") from None
    if value < (1 if prefix == "mcts:" else 0):
        raise ValueError(f"bad agent {spec!r}: N is too small")
    return check_simulations(value, f"agent {spec[:40]!r}: N")


def make_agent(spec: str, game: str, main: Any, simulations: int, search: str, seed: int,
               device: Any = "cpu"):
    """The agent a spec names (`random`, `mcts:N`, `raw`, `sims:N`, `model:PATH`, `solver`,
    `gtp:COMMAND`); `main` returns the model's own agent (or is None when the spec does not
    need it); a `model:PATH` network searches `simulations` with `search` on `device`."""
    spec = spec.strip()
    if spec == "random":
        return RandomAgent(seed)
    if spec.startswith("mcts:"):
        return PureMCTSAgent(_count_after(spec, "mcts:"), seed)
    if spec == "solver":
        if game != "connect4":
            raise ValueError("the solver agent plays connect4 only")
        return SolverAgent(seed)
    if spec == "model":
        return main()
    if spec == "raw":
        return main().with_simulations(0, "raw policy")
    if spec.startswith("sims:"):
        return main().with_simulations(_count_after(spec, "sims:"))
    if spec.startswith("model:"):
        path = Path(spec[len("model:"):])
        return load_model_agent(path, game, simulations, search, seed,
                                name=f"{path.name}({simulations} sims)", device=device)
    if spec.startswith("gtp:"):  # any GTP engine, e.g. gtp:/usr/games/gnugo --mode gtp
        from .gtp_client import gtp_agent

        if game != "go":
            raise ValueError(f"a gtp: agent plays go, not {game!r}")
        agent = gtp_agent(spec[len("gtp:"):])
        print(f"{agent.name}: every game saved as SGF in {agent.sgf_dir}", file=sys.stderr)
        return agent
    raise ValueError(
        f"unknown agent {spec!r} (random, mcts:N, raw, sims:N, model:PATH, solver, gtp:COMMAND)"
    )
