"""Self-play actors on the fleet runtime (`runtime.actors` = M > 0).

Roles:
- `SelfPlayWorker` (a Ray actor): one `Actor` -- `selfplay.concurrent_games` games moved by
  one batched search per move -- driven in short calls: take new weights and the resignation
  threshold if given, move every game for about `runtime.call_budget_s`, hand back the games
  that finished.
- `FleetSelfPlay` (an orchestrator thread in the learner's process): keeps every worker busy,
  sends a worker the newest weights (one `ray.put` per version) with its next call, so
  weights change between moves and one game may span versions (each sample carries its
  own), and puts every finished game into a `VersionedQueue`. The learner takes
  `games_per_iteration` games per iteration, oldest first (`take`). Workers pause while
  `runtime.max_queued_games` games wait, so self-play runs about one iteration ahead.

Accounting (`SelfPlayAccounting`). A game's id is (actor index, actor-local sequence
number), and only finished games leave a worker, so no partial game is ever added. A
finished game is counted when it reaches the orchestrator, once by its id. A worker that
dies (SIGKILL, a lost node) is restarted by the `ActorFleet`; its games in flight are lost
and the new worker plays new games from scratch (`fleet/games_redone` counts the lost ones).
The new worker's sequence numbers go on after every one the orchestrator has seen from that
index (finished or reported in flight), so ids never repeat. The learner's counters (games,
samples) are sums over the distinct games it took.

Resume. A checkpoint holds where each actor's sequence goes on (`checkpoint_state`); a
resumed run starts fresh workers with the checkpointed weights. Games in flight or queued at
the checkpoint are not in it (those queued are counted as `fleet/discarded_on_resume`), nor
are the workers' RNG streams: a fleet run resumes to consistent counters and ids, not to the
same games (in-process self-play, `runtime.actors: 0`, resumes exactly).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..runtime.device import resolve_compute_dtype, resolve_device
from ..runtime.fleet import ActorDied, import_ray
from ..runtime.orchestrator import Orchestrator
from ..runtime.versions import WeightStore
from .config import MCTSConfig, NetworkConfig, SelfPlayConfig, ZeroConfig
from .games import make_game
from .network import network_for, precision_workload, selfplay_batch
from .replay import Samples
from .selfplay import Actor, FinishedGame, PlayStats, game_samples

GameId = tuple[int, int]  # (actor index, actor-local sequence number)


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs to build its `Actor` (picklable, sent to the Ray actor)."""

    index: int
    game: str
    game_kwargs: dict[str, Any]
    network: NetworkConfig
    mcts: MCTSConfig
    selfplay: SelfPlayConfig
    threads: int
    seed: int
    first_game: int  # the sequence number of its first game
    device: str = "cpu"  # where its network evaluates: cpu, or cuda on a GPU share
    compute_dtype: str = "auto"  # the config's; resolved in the actor, at its own threads


@dataclass(frozen=True)
class WorkerReport:
    games: list[FinishedGame]  # finished in this call
    in_flight: list[int]  # sequence numbers of the games it is playing now
    moves: int
    simulations: int
    kl_sum: float
    busy_s: float


class SelfPlayWorker:
    """The body of a self-play actor (wrapped with `ray.remote` by `FleetSelfPlay`)."""

    def __init__(self, spec: WorkerSpec) -> None:
        torch.set_num_threads(spec.threads)
        device = resolve_device(spec.device)  # the GPU Ray gave it, or a one-line error
        game = make_game(spec.game, **spec.game_kwargs)
        net = network_for(game, spec.network).to(device)
        net.compute_dtype = resolve_compute_dtype(spec.compute_dtype, device, precision_workload(
            net, selfplay_batch(spec.selfplay.concurrent_games, spec.mcts.leaves_per_call))).name
        self.actor = Actor(game, net, spec.mcts,
                           spec.selfplay, WeightStore(), np.random.default_rng(spec.seed),
                           first_game=spec.first_game)

    def pid(self) -> int:
        return os.getpid()

    def advance(self, weights: dict[str, Any] | None, version: int,
                resign_threshold: float | None, budget_s: float) -> WorkerReport:
        """New weights first (Ray resolved the published object: the pull), then moves of
        every game until the budget is spent (at least one)."""
        if weights is not None:
            self.actor.load_weights(weights, version)
        self.actor.resign_threshold = resign_threshold
        stats, games = PlayStats(), []
        start = time.perf_counter()
        while True:
            games += self.actor.step(stats)
            if time.perf_counter() - start >= budget_s:
                break
        return WorkerReport(games, self.actor.in_flight(), stats.moves, stats.simulations,
                            stats.kl_sum, time.perf_counter() - start)


@dataclass
class SelfPlayAccounting:
    """Where every finished game went: delivered to the orchestrator once, taken by the
    learner, or waiting in the queue."""

    delivered: dict[GameId, int] = field(default_factory=dict)  # id -> its samples
    taken: list[GameId] = field(default_factory=list)  # by the learner, in order
    duplicates: int = 0  # an id delivered twice (never expected; the copy is dropped)
    games_redone: int = 0  # games in flight on workers that died, played anew
    actor_restarts: int = 0
    discarded_on_resume: int = 0  # queued when the checkpoint this run resumed from was saved
    reports: list[int] = field(default_factory=list)  # calls answered, per actor
    first_games: list[list[int]] = field(default_factory=list)  # per actor, per incarnation


class FleetSelfPlay(Orchestrator[tuple[GameId, FinishedGame]]):
    """M self-play workers and the thread that feeds their games to the learner."""

    def __init__(self, cfg: ZeroConfig, *, resign_threshold: float | None,
                 resumed: dict[str, Any] | None = None) -> None:
        super().__init__(name="self-play fleet", size=cfg.runtime.actors,
                         max_restarts=cfg.runtime.max_actor_restarts)
        self.cfg = cfg
        self.game = make_game(cfg.game.name, **cfg.game.kwargs)
        self.max_queued = cfg.runtime.max_queued_games or cfg.selfplay.games_per_iteration
        self.accounting = SelfPlayAccounting(reports=[0] * self.size,
                                             first_games=[[] for _ in range(self.size)])
        next_game = list((resumed or {}).get("next_game", []))[:self.size]
        self._next_game = next_game + [0] * (self.size - len(next_game))
        self.accounting.discarded_on_resume = int((resumed or {}).get("queued", 0))
        self._resign_threshold = resign_threshold
        self._worker_version = [-1] * self.size
        self._incarnations = [0] * self.size
        self._moves = self._simulations = 0
        self._kl_sum = self._busy_s = 0.0
        self._window_start = time.perf_counter()
        # On a GPU learner the actors evaluate on GPUs too: an even share of one GPU each
        # beside the learner's, for Ray's placement (the batched search's calls are small; one
        # GPU serves them all). On a CPU learner they stay on CPUs.
        self._on_gpu = resolve_device(cfg.device).type == "cuda"

    def _make_worker(self, index: int):
        cfg = self.cfg
        incarnation, self._incarnations[index] = (self._incarnations[index],
                                                  self._incarnations[index] + 1)
        first = self._next_game[index]
        self.accounting.first_games[index].append(first)
        seed = np.random.SeedSequence([cfg.train.seed, 2, index, incarnation, first])
        spec = WorkerSpec(index, cfg.game.name, dict(cfg.game.kwargs), cfg.network,
                          cfg.mcts, cfg.selfplay, cfg.runtime.actor_threads,
                          int(seed.generate_state(1)[0]), first,
                          "cuda" if self._on_gpu else "cpu", cfg.compute_dtype)
        remote = import_ray().remote(num_cpus=cfg.runtime.actor_threads,
                                     num_gpus=1 / (self.size + 1) if self._on_gpu else 0)
        return remote(SelfPlayWorker).remote(spec)

    def _started(self) -> None:
        self._window_start = time.perf_counter()

    def checkpoint_state(self) -> dict[str, Any]:
        """Where each actor's sequence goes on, and how many finished games are queued."""
        with self._cv:
            return {"next_game": list(self._next_game), "queued": len(self.queue)}

    # -- the learner's side --------------------------------------------------------------
    def set_resign_threshold(self, threshold: float | None) -> None:
        with self._cv:
            self._resign_threshold = threshold

    def save_games(self, folder: Path) -> None:
        """Nothing: a fleet's games in flight are not saved (a resume starts fresh ones)."""

    def load_games(self, folder: Path, concurrent_games: int) -> None:
        """Nothing: see save_games."""

    def next_batch(self, n: int, on_step: Callable[[PlayStats], None] | None = None
                   ) -> tuple[Samples, PlayStats, dict[str, float]]:
        """The n oldest finished games (blocks until they are there), their statistics, and
        the work of every worker since the last call (moves, simulations, search KL).
        `on_step` is not called: the games were played elsewhere."""
        t0 = time.perf_counter()
        items = self._take(n)
        wait = time.perf_counter() - t0
        games = [game for _, (_, game) in items]
        stats = PlayStats()
        for game in games:
            stats.record(game)
        with self._cv:
            acc = self.accounting
            acc.taken += [game_id for _, (game_id, _) in items]
            stats.moves, stats.simulations, stats.kl_sum = (self._moves, self._simulations,
                                                            self._kl_sum)
            now = time.perf_counter()
            stats.seconds = now - self._window_start
            metrics = {
                "fleet/learner_wait_s": wait,
                "fleet/actor_busy_share": self._busy_s / max(stats.seconds * self.size, 1e-9),
                "fleet/queued_games": float(len(self.queue)),
                # delivered = taken + queued at every step: no game lost or taken twice
                "fleet/games_delivered": float(len(acc.delivered)),
                "fleet/games_taken": float(len(acc.taken)),
                "fleet/duplicate_games": float(acc.duplicates),
                "fleet/games_redone": float(acc.games_redone),
                "fleet/actor_restarts": float(acc.actor_restarts),
                "fleet/discarded_on_resume": float(acc.discarded_on_resume),
            }
            self._moves = self._simulations = 0
            self._kl_sum = self._busy_s = 0.0
            self._window_start = now
        return game_samples(games, self.game), stats, metrics

    # -- the orchestrator thread ---------------------------------------------------------
    def _prepare(self) -> bool:
        """Workers pause while `max_queued` games wait: self-play stays about one
        iteration ahead of the learner."""
        return len(self.queue) < self.max_queued

    def _dispatch(self, index: int) -> bool:
        with self._cv:
            newest, ref = self._publisher.latest()
            threshold = self._resign_threshold
        weights = ref if newest > self._worker_version[index] else None
        self._worker_version[index] = newest
        self._fleet.submit(index, "advance", weights, newest, threshold,
                           self.cfg.runtime.call_budget_s)
        return True

    def _on_report(self, index: int, report: WorkerReport) -> None:
        acc = self.accounting
        with self._cv:
            acc.reports[index] += 1
            self._moves += report.moves
            self._simulations += report.simulations
            self._kl_sum += report.kl_sum
            self._busy_s += report.busy_s
            for game in report.games:
                game_id = (index, game.game)
                if game_id in acc.delivered:
                    acc.duplicates += 1
                    continue
                acc.delivered[game_id] = len(game.samples)
                versions = game.samples.policy_version
                oldest = int(versions.min()) if len(versions) else self._worker_version[index]
                self.queue.put((game_id, game), oldest)
            seen = [g.game for g in report.games] + report.in_flight
            if seen:
                self._next_game[index] = max(self._next_game[index], max(seen) + 1)
        self._fleet.hold(index, set(report.in_flight))

    def _on_death(self, died: ActorDied) -> None:
        self._worker_version[died.index] = -1
        with self._cv:
            self.accounting.actor_restarts += 1
            self.accounting.games_redone += len(died.items)
        print(f"warning: self-play actor {died.index} died ({died.reason}); restarted, "
              f"{len(died.items)} games in flight played anew")
