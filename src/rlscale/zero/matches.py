"""Matches between agents (`play_match`).

Games come in pairs that share an opening of `opening_plies` uniformly random moves (distinct
openings while there are enough of them), once with each agent moving first. Without this,
two deterministic agents (a network with no noise, the solver) would replay one game `games`
times. The openings are drawn from `seed` alone, so matches with the same seed (the points of
a compute curve) are played from the same openings.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .agents import Agent, act_many, game_over
from .games.base import Game
from .games.go import Go, result_string
from .ratings import EloEstimate, elo_difference
from .sgf import write_sgf

DEFAULT_OPENING_PLIES = 2


@dataclass
class GameRecord:
    opening: list[int]
    moves: list[int]  # all actions, opening included
    a_first: bool  # agent A moved first (after the opening, colours are by player number)
    outcome: float  # player 0's view
    number: int = 0  # the game's place in the match, from 1 (games 2k-1 and 2k share an opening)

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
    plan = [(i + 1, openings[i // 2], i % 2 == 0) for i in range(games)]
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
            number, opening, a_first = item
            state = game.initial_state()
            for action in opening:
                state = game.apply(state, action)
            live.append({"state": state, "moves": list(opening), "opening": opening,
                         "a_first": a_first, "number": number})

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
            for agent in (agent_a, agent_b):
                game_over(agent, game, g["state"])
            record = GameRecord(g["opening"], g["moves"], g["a_first"], game.outcome(g["state"]),
                                g["number"])
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


def check_new_sgf_dir(folder: Path) -> None:
    """Refuse a folder that already holds game records (they would be replaced)."""
    if folder.is_dir() and any(folder.glob("game_*.sgf")):
        raise ValueError(f"{folder} already holds game records (game_*.sgf): choose another "
                         "folder, or move them away")


def write_match_sgfs(game: Go, result: MatchResult, folder: Path) -> list[Path]:
    """Every game of a Go match as `folder/game_0001.sgf` on, numbered by their place in
    the match (games 1 and 2 share a random opening, with the colours swapped):
    the moves (the random opening included), who played black and white, and the
    Tromp-Taylor result of the final position (e.g. `B+3`)."""
    if not isinstance(game, Go):
        raise ValueError(f"SGF records are for Go; the game is {game!r}")
    check_new_sgf_dir(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for record in sorted(result.records, key=lambda r: r.number):
        state = game.initial_state()
        for action in record.moves:
            state = game.apply(state, action)
        black, white = ((result.agent_a, result.agent_b) if record.a_first
                        else (result.agent_b, result.agent_a))
        path = folder / f"game_{record.number:04d}.sgf"
        write_sgf(path, game.size, game.komi, record.moves,
                  result=result_string(game.score(state)), black=black, white=white,
                  comment=f"random opening of {len(record.opening)} moves")
        paths.append(path)
    return paths
