"""Self-play actors.

An `Actor` keeps `concurrent_games` games in flight and moves all of them with one batched
search per move (one network call per simulation step across every tree). It pulls weights
from a `WeightStore` between batches of games (or takes them from a caller between moves,
`load_weights`) and stamps every sample with the version that produced it. It only talks to
the learner through the weights and the finished games it returns, so a fleet of actors in
other processes can replace it (zero/actors.py).

Every game has an actor-local sequence number; with the actor's index it is the game's id,
by which a fleet counts each finished game exactly once. Only finished games leave the actor.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..runtime.versions import WeightStore
from .config import MCTSConfig, SelfPlayConfig
from .forest import Forest
from .games.base import Game
from .network import PolicyValueNet
from .replay import Samples
from .resign import PlayedOut
from .search import search


@dataclass
class _Slot:
    """One game in flight: its recorded positions, and resignation bookkeeping."""

    planes: list[np.ndarray] = field(default_factory=list)
    policy: list[np.ndarray] = field(default_factory=list)
    player: list[int] = field(default_factory=list)
    root_value: list[float] = field(default_factory=list)
    version: list[int] = field(default_factory=list)
    moves: list[int] = field(default_factory=list)  # every move of the game, openings included
    ply: int = 0
    may_resign: bool = True  # False in the share of games played out to check resignations
    would_resign: int | None = None  # who would have resigned, in a played-out game
    game: int = 0  # the actor-local sequence number of the game
    # In a played-out game while resignation is on: (ply, player, root value) of every searched
    # move, what the threshold tuning (zero/resign.py) replays other thresholds on.
    checks: list[tuple[int, int, float]] | None = None


@dataclass(frozen=True)
class FinishedGame:
    """A finished game as the actor hands it over: its samples and what the lenses need."""

    game: int  # actor-local sequence number
    samples: Samples  # its recorded positions (none when every move was a fast search)
    outcome: float  # from player 0's view
    length: int  # plies, openings included
    moves: tuple[int, ...]
    resigned: bool
    would_resign: int | None  # in a played-out game: who would have resigned first
    played_out: PlayedOut | None  # a played-out game while resignation is on


@dataclass
class PlayStats:
    """What self-play did: per-game figures (`record`) and the work of the moves (counted
    over every game in flight, finished or not); the loop turns it into lens metrics."""

    games: int = 0
    positions: int = 0  # recorded training samples
    moves: int = 0
    simulations: int = 0
    seconds: float = 0.0
    lengths: list[int] = field(default_factory=list)
    outcomes: list[float] = field(default_factory=list)  # from player 0's view
    sequences: set[tuple[int, ...]] = field(default_factory=set)  # finished games' moves
    kl_sum: float = 0.0  # KL(search policy || network prior) summed over recorded moves
    resigned: int = 0
    playout_would_resign: int = 0  # played-out games in which someone would have resigned
    false_resignations: int = 0  # ... and that player did not lose
    played_out: list[PlayedOut] = field(default_factory=list)  # for the threshold tuning

    def record(self, game: FinishedGame) -> None:
        self.games += 1
        self.positions += len(game.samples)
        self.lengths.append(game.length)
        self.outcomes.append(game.outcome)
        self.sequences.add(game.moves)
        self.resigned += game.resigned
        if game.would_resign is not None:
            self.playout_would_resign += 1
            loser_view = game.outcome if game.would_resign == 0 else -game.outcome
            self.false_resignations += int(loser_view >= 0)
        if game.played_out is not None:
            self.played_out.append(game.played_out)


def policy_kl(target: np.ndarray, prior: np.ndarray) -> np.ndarray:
    """KL(target || prior) per row, with 0 log 0 = 0."""
    t = np.maximum(target, 1e-12)
    return np.where(target > 0, target * (np.log(t) - np.log(np.maximum(prior, 1e-12))), 0.0).sum(-1)


def final_targets(game: Game, final: Any, players: np.ndarray) -> dict[str, np.ndarray]:
    """The final-position fields of a game's samples (replay.FINAL_FIELDS), each from the view
    of the player to move at the sample (`players` [n]): who owns each point at the end and
    the score. `final` None (a resigned game): unknown, zeros."""
    n = len(players)
    if final is None:
        return {"ownership": np.zeros((n, *game.plane_shape[1:]), np.int8),
                "score": np.zeros(n, np.float32), "final_known": np.zeros(n, bool)}
    sign = np.where(players == 0, 1, -1)
    return {"ownership": (sign[:, None, None] * game.ownership(final)).astype(np.int8),
            "score": (sign * game.score(final)).astype(np.float32),
            "final_known": np.ones(n, bool)}


def game_samples(games: list[FinishedGame], game: Game) -> Samples:
    """The samples of `games`, in order, as one batch."""
    parts = [g.samples for g in games if len(g.samples)]
    return Samples.concat(parts) if parts else Samples.empty(game.plane_shape, game.num_actions)


class Actor:
    def __init__(
        self,
        game: Game,
        net: PolicyValueNet,
        mcts: MCTSConfig,
        selfplay: SelfPlayConfig,
        weights: WeightStore,
        rng: np.random.Generator,
        first_game: int = 0,
    ) -> None:
        self.game, self.net, self.mcts, self.config = game, net, mcts, selfplay
        self.weights = weights
        self.rng = rng
        self.version = -1
        self.resign_threshold = selfplay.resign_threshold  # the loop may tune it between calls
        self.next_game = first_game  # the sequence number of the next game started
        # A network with an ownership or score head learns from the final position (Go).
        self.records_final = net.learns_final_position
        n = selfplay.concurrent_games
        self.forest = Forest(game, n, capacity=2 * mcts.simulations + 2)
        self.slots = [self._new_game(i) for i in range(n)]

    def _new_game(self, i: int) -> _Slot:
        game, cfg = self.game, self.config
        state, moves = game.initial_state(), []
        # The RNG is drawn from only when random openings are on, so runs without them replay
        # exactly as before the option existed.
        if cfg.random_opening_plies > 0 and cfg.random_opening_share > 0:
            if self.rng.random() < cfg.random_opening_share:
                for _ in range(int(self.rng.integers(1, cfg.random_opening_plies + 1))):
                    action = int(self.rng.choice(np.flatnonzero(game.legal_mask(state))))
                    after = game.apply(state, action)
                    if game.is_terminal(after):  # an opening never ends the game
                        break
                    state = after
                    moves.append(action)
        self.forest.reset(i, state)
        self.next_game += 1
        return _Slot(moves=moves, ply=len(moves), game=self.next_game - 1,
                     may_resign=self.rng.random() >= cfg.resign_playout_share)

    def in_flight(self) -> list[int]:
        """The sequence numbers of the games being played."""
        return [slot.game for slot in self.slots]

    def load_weights(self, state: dict[str, Any], version: int) -> None:
        self.net.load_state_dict(state)
        self.net.eval()
        self.version = version

    def sync(self) -> int:
        """Pull the newest weights if the store has a newer version."""
        version, state = self.weights.latest()
        if version != self.version and state is not None:
            self.load_weights(state, version)
        return self.version

    def play(self, num_games: int, on_step: Callable[[PlayStats], None] | None = None
             ) -> tuple[Samples, PlayStats]:
        """Move all games until `num_games` have finished; return their samples.
        `on_step(stats so far)` after every move of the games in flight."""
        start = time.perf_counter()
        stats = PlayStats()
        games: list[FinishedGame] = []
        while stats.games < num_games:
            games += self.step(stats)
            if on_step is not None:
                on_step(stats)
        stats.seconds = time.perf_counter() - start
        return game_samples(games, self.game), stats

    def step(self, stats: PlayStats) -> list[FinishedGame]:
        """One move of every game in flight (one batched search); the games that finished,
        each recorded in `stats`, and a new game started in its slot."""
        cfg, game, n = self.config, self.game, len(self.slots)
        if cfg.fast_simulations is None:
            full = np.ones(n, bool)
        else:
            full = self.rng.random(n) < cfg.full_search_prob
        budget = np.where(full, self.mcts.simulations, cfg.fast_simulations or 0)
        exploring = np.array([s.ply for s in self.slots]) < cfg.temperature_moves
        # PUCT: Dirichlet noise on every full search, moves sampled (tau=1) while exploring.
        # Gumbel: the Gumbel noise *is* the move sampling, so it is on only while exploring.
        noise = full & exploring if self.mcts.gumbel else full
        result = search(
            self.forest, self.net.evaluate, self.mcts, self.rng,
            simulations=budget, add_noise=noise, temperature=np.where(exploring, 1.0, 0.0),
        )
        stats.simulations += int(budget.sum())
        stats.moves += n
        recorded = np.flatnonzero(full)
        stats.kl_sum += float(policy_kl(result.policy[recorded], result.prior[recorded]).sum())
        threshold = self.resign_threshold
        finished: list[FinishedGame] = []
        for i, slot in enumerate(self.slots):
            state = self.forest.root_state(i)
            player = game.to_play(state)
            value = float(result.root_value[i])
            if full[i]:
                slot.planes.append(game.planes(state))
                slot.policy.append(result.policy[i])
                slot.player.append(player)
                slot.root_value.append(value)
                slot.version.append(self.version)
            if threshold is not None and not slot.may_resign:
                if slot.checks is None:
                    slot.checks = []
                slot.checks.append((slot.ply, player, value))
            if threshold is not None and slot.ply >= cfg.resign_min_moves and value < threshold:
                if slot.may_resign:
                    finished.append(self._finish(i, -1.0 if player == 0 else 1.0, None))
                    continue
                if slot.would_resign is None:
                    slot.would_resign = player
            state = self.forest.advance(i, int(result.chosen[i]), reuse=self.mcts.reuse_tree)
            slot.moves.append(int(result.chosen[i]))
            slot.ply += 1
            if game.is_terminal(state):
                finished.append(self._finish(i, game.outcome(state), state))
        for done in finished:
            stats.record(done)
        return finished

    def _finish(self, i: int, outcome: float, final: Any) -> FinishedGame:
        """Hand over game `i`, ended in the position `final` (None: resigned)."""
        slot = self.slots[i]
        if slot.planes:
            players = np.array(slot.player)
            samples = Samples(
                planes=np.stack(slot.planes),
                policy=np.stack(slot.policy).astype(np.float32),
                outcome=np.where(players == 0, outcome, -outcome).astype(np.float32),
                root_value=np.array(slot.root_value, np.float32),
                policy_version=np.array(slot.version, np.int64),
                **(final_targets(self.game, final, players) if self.records_final else {}),
            )
        else:
            samples = Samples.empty(self.game.plane_shape, self.game.num_actions)
        done = FinishedGame(
            slot.game, samples, outcome, slot.ply, tuple(slot.moves), final is None,
            slot.would_resign,
            PlayedOut.from_checks(slot.checks, outcome) if slot.checks is not None else None)
        self.slots[i] = self._new_game(i)
        return done

    # -- checkpointing: games in flight, their trees and the RNG, for exact resume ----------
    def state_dict(self) -> dict[str, Any]:
        return {"forest": self.forest, "slots": self.slots, "rng": self.rng.bit_generator.state,
                "version": self.version, "next_game": self.next_game}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.forest, self.slots = state["forest"], state["slots"]
        for slot in self.slots:  # checkpoints from before moves were kept: unknown so far
            if not hasattr(slot, "moves"):
                slot.moves = []
        self.rng.bit_generator.state = state["rng"]
        self.next_game = state.get("next_game", self.next_game)
        self.version = -1  # reload weights from the store on the next sync
