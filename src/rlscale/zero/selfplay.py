"""Self-play actors.

An `Actor` keeps `concurrent_games` games in flight and moves all of them with one batched
search per move (one network call per simulation step across every tree). It pulls weights
from a `WeightStore` between batches of games and stamps every sample with the version that
produced it. It only talks to the learner through the store and the samples it returns, so a
fleet of actors in other processes can replace it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlscale.runtime.versions import WeightStore
from rlscale.zero.agent import Agent, load_agent  # noqa: F401  (moved to agent.py; re-exported)
from rlscale.zero.config import MCTSConfig, SelfPlayConfig
from rlscale.zero.games.base import Game
from rlscale.zero.mcts import Forest, search
from rlscale.zero.network import PolicyValueNet
from rlscale.zero.replay import Samples


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


@dataclass
class PlayStats:
    """What one `Actor.play` call did; the loop turns it into lens metrics."""

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


def policy_kl(target: np.ndarray, prior: np.ndarray) -> np.ndarray:
    """KL(target || prior) per row, with 0 log 0 = 0."""
    t = np.maximum(target, 1e-12)
    return np.where(target > 0, target * (np.log(t) - np.log(np.maximum(prior, 1e-12))), 0.0).sum(-1)


class Actor:
    def __init__(
        self,
        game: Game,
        net: PolicyValueNet,
        mcts: MCTSConfig,
        selfplay: SelfPlayConfig,
        weights: WeightStore,
        rng: np.random.Generator,
    ) -> None:
        self.game, self.net, self.mcts, self.config = game, net, mcts, selfplay
        self.weights = weights
        self.rng = rng
        self.version = -1
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
        return _Slot(moves=moves, ply=len(moves),
                     may_resign=self.rng.random() >= cfg.resign_playout_share)

    def sync(self) -> int:
        """Pull the newest weights if the store has a newer version."""
        version, state = self.weights.latest()
        if version != self.version and state is not None:
            self.net.load_state_dict(state)
            self.net.eval()
            self.version = version
        return self.version

    def play(self, num_games: int) -> tuple[Samples, PlayStats]:
        """Move all games until `num_games` have finished; return their samples."""
        start = time.perf_counter()
        stats = PlayStats()
        parts: list[Samples] = []
        while stats.games < num_games:
            self._step(parts, stats)
        stats.seconds = time.perf_counter() - start
        samples = Samples.concat(parts) if parts else _empty(self.game)
        stats.positions = len(samples)
        return samples, stats

    def _step(self, parts: list[Samples], stats: PlayStats) -> None:
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
            if (
                cfg.resign_threshold is not None
                and slot.ply >= cfg.resign_min_moves
                and value < cfg.resign_threshold
            ):
                if slot.may_resign:
                    stats.resigned += 1
                    self._finish(i, -1.0 if player == 0 else 1.0, parts, stats)
                    continue
                if slot.would_resign is None:
                    slot.would_resign = player
            state = self.forest.advance(i, int(result.chosen[i]), reuse=self.mcts.reuse_tree)
            slot.moves.append(int(result.chosen[i]))
            slot.ply += 1
            if game.is_terminal(state):
                self._finish(i, game.outcome(state), parts, stats)

    def _finish(self, i: int, outcome: float, parts: list[Samples], stats: PlayStats) -> None:
        slot = self.slots[i]
        stats.games += 1
        stats.lengths.append(slot.ply)
        stats.outcomes.append(outcome)
        stats.sequences.add(tuple(slot.moves))
        if slot.would_resign is not None:
            stats.playout_would_resign += 1
            loser_view = outcome if slot.would_resign == 0 else -outcome
            stats.false_resignations += int(loser_view >= 0)
        if slot.planes:
            players = np.array(slot.player)
            parts.append(Samples(
                planes=np.stack(slot.planes),
                policy=np.stack(slot.policy).astype(np.float32),
                outcome=np.where(players == 0, outcome, -outcome).astype(np.float32),
                root_value=np.array(slot.root_value, np.float32),
                policy_version=np.array(slot.version, np.int64),
            ))
        self.slots[i] = self._new_game(i)

    # -- checkpointing: games in flight, their trees and the RNG, for exact resume ----------
    def state_dict(self) -> dict[str, Any]:
        return {"forest": self.forest, "slots": self.slots, "rng": self.rng.bit_generator.state,
                "version": self.version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.forest, self.slots = state["forest"], state["slots"]
        for slot in self.slots:  # checkpoints from before moves were kept: unknown so far
            if not hasattr(slot, "moves"):
                slot.moves = []
        self.rng.bit_generator.state = state["rng"]
        self.version = -1  # reload weights from the store on the next sync


def _empty(game: Game) -> Samples:
    a = game.num_actions
    return Samples(
        np.zeros((0, *game.plane_shape), np.float32), np.zeros((0, a), np.float32),
        np.zeros(0, np.float32), np.zeros(0, np.float32), np.zeros(0, np.int64),
    )
