"""Matches between agents, Elo with confidence intervals, baselines, solver agreement and the
test-time compute curve.

Agents. Anything with `name`, `act(game, state) -> action` and `act_many(game, states) ->
actions` plays: `RandomAgent` (uniform over legal moves), `PureMCTSAgent` (UCT with uniformly
random playouts, no knowledge: `rlscale.zero.mcts.uct_search`), `NetworkAgent` (a saved
network: its raw policy with 0 simulations, else its search with N simulations, no noise)
and `SolverAgent` (perfect Connect Four). `act_many` is where batching pays: a `NetworkAgent` searches every position of
the call in ONE batched search (one network call per simulation step over all trees), so a
match moves all its games at once.

Matches (`play_match`). Games come in pairs that share an opening of `opening_plies` uniformly
random moves (distinct openings while there are enough of them), once with each agent moving
first. Without this, two deterministic agents (a network with no noise, the solver) would
replay one game `games` times. The openings are drawn from `seed` alone, so matches with the
same seed (the points of a compute curve) are played from the same openings.

Elo (`elo_difference`). Logistic model: a score s is worth 400 log10(s / (1 - s)) Elo. The 95%
interval is the Wilson score interval of s over the n games, mapped through the same curve.
Counting a draw as half a win in a binomial model overstates the variance when there are draws,
so the interval is slightly conservative. A 0% or 100% score has no finite Elo: the estimate
is -inf/+inf and the interval's finite end is the bound to report ("> +431").

Connect Four judged by its perfect solver (solver agreement, match audits):
`rlscale.zero.perfect_play`.

Test-time compute (`compute_curve`). The same network with 0, 1, 2, 4, ... simulations
against its own raw policy.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from rlscale.zero.games.base import Game
from rlscale.zero.mcts import DEFAULT_UCT_C, uct_search

if TYPE_CHECKING:
    import torch

DEFAULT_OPENING_PLIES = 2
CURVE_SIMULATIONS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 800)
MODELS_DIR = Path(__file__).resolve().parent / "models"


def connect4_data_dir() -> Path:
    """`<repo>/../shared/data/connect4`, the solver benchmark positions."""
    return Path(__file__).resolve().parents[3].parent / "shared" / "data" / "connect4"


def shipped_model(game: str) -> Path:
    """Where the package ships the trained model of `game` (it may not exist)."""
    return MODELS_DIR / game


# -- agents ----------------------------------------------------------------------------------


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
        from rlscale.zero.solver import best_moves

        if game.name != "connect4":
            raise ValueError(f"the solver agent plays connect4, not {game.name}")
        best = best_moves(state)
        return int(best[self.rng.integers(len(best))])


class PureMCTSAgent(_OneByOne):
    """Pure MCTS (`rlscale.zero.mcts.uct_search`): UCT with `simulations` uniformly random
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
    """A saved network with its search: raw policy at 0 simulations, else `simulations` of
    search from a fresh tree per move, no root noise, the search's own move choice (most
    visited for PUCT; the sequential-halving survivor for Gumbel)."""

    def __init__(self, agent: Any, simulations: int, name: str | None = None) -> None:
        self.agent = agent  # rlscale.zero.agent.Agent
        self.simulations = simulations
        self.name = name or (f"net({simulations} sims)" if simulations else "net(raw)")

    @property
    def game(self) -> Game:
        return self.agent.game

    def with_simulations(self, simulations: int, name: str | None = None) -> NetworkAgent:
        """The same network (shared, not copied) with another budget."""
        return NetworkAgent(self.agent, simulations, name)

    def act(self, game: Game, state: Any) -> int:
        return int(self.act_many(game, [state])[0])

    def act_many(self, game: Game, states: Sequence[Any]) -> np.ndarray:
        if game.name != self.agent.game.name:
            raise ValueError(f"{self.name} plays {self.agent.game.name}, not {game.name}")
        return np.asarray(self.agent.choose_many(list(states), self.simulations), np.int64)


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
    settings updated by its `play_mcts`, see `load_agent`),
    "puct"/"gumbel" force one. With `game`, a checkpoint for another game is refused with a
    one-line ValueError. `device`: where the network evaluates."""
    from rlscale.zero.agent import load_agent

    if search not in SEARCH_KINDS:
        raise ValueError(f"unknown search {search!r} (choose from {', '.join(SEARCH_KINDS)})")
    if not Path(path).exists():
        raise FileNotFoundError(f"no model at {path}")
    overrides = {} if search == "trained" else {"gumbel": search == "gumbel"}
    agent = load_agent(path, seed=seed, device=device, **overrides)
    if game is not None and agent.game.name != game:
        raise ValueError(f"checkpoint {path} is for {agent.game.name}, not for {game}")
    return NetworkAgent(agent, simulations, name)


def act_many(agent: Any, game: Game, states: Sequence[Any]) -> np.ndarray:
    """`agent.act_many` if it has one, else `act` per position."""
    if hasattr(agent, "act_many"):
        return np.asarray(agent.act_many(game, states), np.int64)
    return np.array([agent.act(game, s) for s in states], np.int64)


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
        from rlscale.zero.gtp_client import gtp_agent

        if game != "go":
            raise ValueError(f"a gtp: agent plays go, not {game!r}")
        agent = gtp_agent(spec[len("gtp:"):])
        print(f"{agent.name}: every game saved as SGF in {agent.sgf_dir}", file=sys.stderr)
        return agent
    raise ValueError(
        f"unknown agent {spec!r} (random, mcts:N, raw, sims:N, model:PATH, solver, gtp:COMMAND)"
    )


# -- matches ---------------------------------------------------------------------------------


@dataclass
class GameRecord:
    opening: list[int]
    moves: list[int]  # all actions, opening included
    a_first: bool  # agent A moved first (after the opening, colours are by player number)
    outcome: float  # player 0's view

    @property
    def a_score(self) -> float:
        z = self.outcome if self.a_first else -self.outcome
        return (z + 1.0) / 2.0


@dataclass
class MatchResult:
    agent_a: str
    agent_b: str
    wins: int = 0  # agent A's view
    draws: int = 0
    losses: int = 0
    as_first: list[int] = field(default_factory=lambda: [0, 0, 0])  # A's W/D/L as player 0
    as_second: list[int] = field(default_factory=lambda: [0, 0, 0])
    seconds: float = 0.0
    records: list[GameRecord] = field(default_factory=list)

    @property
    def games(self) -> int:
        return self.wins + self.draws + self.losses

    @property
    def score(self) -> float:
        return (self.wins + 0.5 * self.draws) / max(self.games, 1)

    @property
    def distinct_games(self) -> int:
        """How many different move sequences were played: with no random opening, a match of
        deterministic agents replays one game per colour; a stochastic one varies."""
        return len({tuple(r.moves) for r in self.records})

    def elo(self, confidence: float = 0.95) -> EloEstimate:
        return elo_difference(self.wins, self.draws, self.losses, confidence)

    def summary(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "records"}
        out.update(games=self.games, distinct_games=self.distinct_games, score=self.score,
                   elo=self.elo().as_dict())
        return out


def random_openings(
    game: Game, count: int, plies: int, rng: np.random.Generator
) -> list[list[int]]:
    """`count` sequences of `plies` uniformly random moves that do not end the game; distinct
    while the game has enough of them (then repeated)."""
    if plies <= 0:
        return [[] for _ in range(count)]
    seen: set[tuple[int, ...]] = set()
    openings: list[list[int]] = []
    misses = 0
    while len(openings) < count:
        state, moves = game.initial_state(), []
        for _ in range(plies):
            legal = np.flatnonzero(game.legal_mask(state))
            if legal.size == 0:
                break
            action = int(legal[rng.integers(legal.size)])
            state = game.apply(state, action)
            moves.append(action)
        if game.is_terminal(state):
            continue
        key = tuple(moves)
        if key in seen and misses < 50 * count:
            misses += 1
            continue
        seen.add(key)
        openings.append(moves)
    return openings


def play_match(
    game: Game,
    agent_a: Agent,
    agent_b: Agent,
    games: int,
    seed: int = 0,
    opening_plies: int = DEFAULT_OPENING_PLIES,
    concurrency: int | None = None,
    progress: Callable[[int, int, int], None] | None = None,
) -> MatchResult:
    """Play `games` games of A against B, alternating who moves first, and count A's results.
    `progress(finished games, games, moves played)` is called after every round of moves.

    Games 2k and 2k+1 share a random opening (see the module docstring); A moves first in the
    even ones (after the opening, player 0 is whoever moved first). Up to `concurrency` games
    (default: all) are in flight; each agent is asked for all its moves at once."""
    if games < 1:
        raise ValueError("a match needs at least one game")
    rng = np.random.default_rng(seed)
    openings = random_openings(game, (games + 1) // 2, opening_plies, rng)
    plan = [(openings[i // 2], i % 2 == 0) for i in range(games)]
    result = MatchResult(agent_a.name, agent_b.name)
    start = time.perf_counter()
    width = concurrency or games
    pending = iter(plan)
    live: list[dict[str, Any]] = []

    def refill() -> None:
        while len(live) < width:
            item = next(pending, None)
            if item is None:
                return
            opening, a_first = item
            state = game.initial_state()
            for action in opening:
                state = game.apply(state, action)
            live.append({"state": state, "moves": list(opening), "opening": opening,
                         "a_first": a_first})

    refill()
    moves = 0
    while live:
        for agent, is_a in ((agent_a, True), (agent_b, False)):
            mine = [g for g in live if not game.is_terminal(g["state"])
                    and (game.to_play(g["state"]) == 0) == (g["a_first"] == is_a)]
            if not mine:
                continue
            actions = act_many(agent, game, [g["state"] for g in mine])
            for g, action in zip(mine, actions, strict=True):
                g["state"] = game.apply(g["state"], int(action))
                g["moves"].append(int(action))
            moves += len(mine)
        finished = [g for g in live if game.is_terminal(g["state"])]
        for g in finished:
            live.remove(g)
            record = GameRecord(g["opening"], g["moves"], g["a_first"], game.outcome(g["state"]))
            _count(result, record)
        if progress is not None:
            progress(result.games, games, moves)
        refill()
    result.seconds = time.perf_counter() - start
    return result


def _count(result: MatchResult, record: GameRecord) -> None:
    score = record.a_score
    slot = 0 if score == 1.0 else 1 if score == 0.5 else 2
    per_colour = result.as_first if record.a_first else result.as_second
    per_colour[slot] += 1
    if slot == 0:
        result.wins += 1
    elif slot == 1:
        result.draws += 1
    else:
        result.losses += 1
    result.records.append(record)


# -- Elo -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EloEstimate:
    elo: float  # +-inf at a 100% / 0% score
    low: float  # 95% interval (or the requested confidence); -inf / +inf where unbounded
    high: float
    score: float
    games: int

    def __str__(self) -> str:
        if self.games == 0:
            return "n/a (no games)"
        if math.isinf(self.elo):
            bound = self.low if self.elo > 0 else self.high
            return f"{'>' if self.elo > 0 else '<'} {bound:+.0f} (95% bound)"
        return f"{self.elo:+.0f} [{self.low:+.0f}, {self.high:+.0f}]"

    def as_dict(self) -> dict[str, Any]:
        def clean(x: float) -> float | None:
            return None if math.isinf(x) or math.isnan(x) else round(x, 1)

        return {"elo": clean(self.elo), "low": clean(self.low), "high": clean(self.high),
                "score": self.score, "games": self.games, "text": str(self)}


def score_to_elo(score: float) -> float:
    """Logistic model: the Elo difference at which the expected score is `score`."""
    if score <= 0.0:
        return -math.inf
    if score >= 1.0:
        return math.inf
    return 400.0 * math.log10(score / (1.0 - score))


def normal_quantile(confidence: float) -> float:
    # Two-sided z for `confidence` by bisection on erf (no scipy needed).
    target, lo, hi = (1.0 + confidence) / 2.0, 0.0, 10.0
    for _ in range(100):
        mid = (lo + hi) / 2.0
        if 0.5 * (1.0 + math.erf(mid / math.sqrt(2.0))) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


def wilson_interval(score: float, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a proportion observed as `score` over `n` trials."""
    if n <= 0:
        return 0.0, 1.0
    z = normal_quantile(confidence)
    denom = 1.0 + z * z / n
    centre = (score + z * z / (2 * n)) / denom
    half = z * math.sqrt(score * (1.0 - score) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def elo_difference(wins: int, draws: int, losses: int, confidence: float = 0.95) -> EloEstimate:
    """Elo of the player with these results over its opponent, with a `confidence` interval."""
    n = wins + draws + losses
    if n == 0:
        return EloEstimate(0.0, -math.inf, math.inf, 0.5, 0)
    score = (wins + 0.5 * draws) / n
    low, high = wilson_interval(score, n, confidence)
    return EloEstimate(score_to_elo(score), score_to_elo(low), score_to_elo(high), score, n)


# -- test-time compute curve -----------------------------------------------------------------


@dataclass
class CurvePoint:
    simulations: int
    result: MatchResult

    def row(self) -> dict[str, Any]:
        r = self.result
        return {"simulations": self.simulations, "wins": r.wins, "draws": r.draws,
                "losses": r.losses, "score": r.score, "elo": r.elo().as_dict(),
                "seconds": round(r.seconds, 2)}


def curve_simulations(max_simulations: int) -> list[int]:
    """0, 1, 2, 4, ... up to `max_simulations` (included)."""
    sims, step = [0], 1
    while step < max_simulations:
        sims.append(step)
        step *= 2
    return sims + [max_simulations] if max_simulations > 0 else sims


def compute_curve(
    game: Game,
    agent: NetworkAgent,
    simulations: Sequence[int],
    games: int,
    seed: int = 0,
    opening_plies: int = DEFAULT_OPENING_PLIES,
    on_point: Callable[[CurvePoint], None] | None = None,
) -> list[CurvePoint]:
    """The network with each budget in `simulations` against its own raw policy, every match
    from the same openings."""
    raw = agent.with_simulations(0, "raw policy")
    points = []
    for sims in simulations:
        result = play_match(game, agent.with_simulations(sims), raw, games, seed, opening_plies)
        point = CurvePoint(sims, result)
        points.append(point)
        if on_point is not None:
            on_point(point)
    return points


def curve_table(points: list[CurvePoint]) -> str:
    lines = ["| simulations | W | D | L | score | Elo vs raw policy (95% CI) | seconds |",
             "| ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    for p in points:
        r = p.result
        lines.append(f"| {p.simulations} | {r.wins} | {r.draws} | {r.losses} | "
                     f"{100 * r.score:.1f}% | {r.elo()} | {r.seconds:.0f} |")
    return "\n".join(lines)


def write_compute_curve(points: list[CurvePoint], out: str | Path, title: str = "") -> Path:
    """`curve.md` (table), `curve.json`, `metrics.jsonl` (step = simulations) and `curve.png`
    into the folder `out`; returns the PNG's path."""
    from rlscale.runtime.metrics import MetricsLogger

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "curve.md").write_text(curve_table(points) + "\n")
    (out / "curve.json").write_text(json.dumps([p.row() for p in points], indent=2) + "\n")
    logger = MetricsLogger(out, tensorboard=False)
    for p in points:
        e = p.result.elo()
        logger.log(p.simulations, {"score": p.result.score, "elo": e.elo, "elo_low": e.low,
                                   "elo_high": e.high, "games": p.result.games})
    logger.close()
    return plot_compute_curve(points, out / "curve.png", title)


def plot_compute_curve(points: list[CurvePoint], out: str | Path, title: str = "") -> Path:
    """Two panels against simulations (log2 axis, 0 drawn at 1/2), with 95% intervals: Elo
    over the raw policy (a 100% / 0% score drawn at the finite end of its interval, open
    marker) and the score itself."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rlscale.runtime.figures import save_figure

    def x_of(sims: int) -> float:
        return float(sims) if sims > 0 else 0.5

    xs, ys, lo, hi, open_x, open_y = [], [], [], [], [], []
    for p in points:
        e = p.result.elo()
        if math.isinf(e.elo):
            open_x.append(x_of(p.simulations))
            open_y.append(e.low if e.elo > 0 else e.high)
            continue
        xs.append(x_of(p.simulations))
        ys.append(e.elo)
        lo.append(e.elo - e.low if math.isfinite(e.low) else 0.0)
        hi.append(e.high - e.elo if math.isfinite(e.high) else 0.0)
    fig, (ax, ax_score) = plt.subplots(1, 2, figsize=(11, 4))
    ticks = [p.simulations for p in points]
    scores = [100 * p.result.score for p in points]
    bounds = [wilson_interval(p.result.score, p.result.games) for p in points]
    ax_score.errorbar([x_of(t) for t in ticks], scores, marker="o", capsize=3, color="C1",
                      # max(0, .): at a 0% or 100% score the Wilson bound equals the score
                      # up to rounding, and matplotlib refuses a negative error bar.
                      yerr=[[max(0.0, s - 100 * b[0]) for s, b in zip(scores, bounds, strict=True)],
                            [max(0.0, 100 * b[1] - s) for s, b in zip(scores, bounds, strict=True)]])
    ax_score.axhline(50.0, color="grey", lw=0.8)
    ax_score.set_ylim(0, 100)
    ax_score.set_ylabel("score vs raw policy, % (95% CI)")
    ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label="Elo vs raw policy (95% CI)")
    if open_x:
        ax.plot(open_x, open_y, "^", mfc="none", color="C0", label="score 100%: lower bound")
    ax.axhline(0.0, color="grey", lw=0.8)
    for axis in (ax, ax_score):
        axis.set_xscale("log", base=2)
        axis.set_xticks([x_of(t) for t in ticks], [str(t) for t in ticks], fontsize=8)
        axis.minorticks_off()
        axis.set_xlabel("simulations per move")
        axis.grid(alpha=0.3)
    ax.set_ylabel("Elo over the raw policy")
    ax.legend(fontsize=8)
    fig.suptitle(title or "test-time compute")
    return save_figure(fig, out)
