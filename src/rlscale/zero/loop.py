"""The AlphaZero training loop: self-play -> replay window -> learner -> new weights.

    for each iteration (runtime/run.py's skeleton drives it: guard, logging, checkpoints):
        samples = source.next_batch(G games)   # in-process or a fleet (zero/experience.py)
        replay.add(samples)
        learner trains on the window           # new_samples * sample_reuse / batch_size steps
        source.publish(net, version + 1)       # the one way new weights go out
        log the lenses (zero/lenses.py); checkpoint every K iterations

A checkpoint holds the network, optimiser, replay window, the actor's games in flight (with
their trees) and every RNG, so a resumed run continues exactly where the original stopped.

With `runtime.actors: M > 0` the source is a fleet of M Ray actors playing while the learner
trains (zero/actors.py): `learn` takes `games_per_iteration` finished games from it and
`finish` publishes the new weights to it. A resumed fleet run restarts its actors with the
checkpointed weights (consistent counters and game ids; not the same games).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..config import ConfigError, config_to_dict, dump_config
from ..runtime import rundir
from ..runtime.checkpoint import (
    NETWORKS_DIR,
    atomic_dir,
    checkpoint_path,
    checkpoint_step,
    load_latest_usable,
    prune_checkpoints,
    rng_state,
    set_rng_state,
)
from ..runtime.device import resolve_compute_dtype, resolve_device
from ..runtime.fleet import ray_session
from ..runtime.health import StepUndo
from ..runtime.metrics import Heartbeat, MetricsLogger, StepProgress
from ..runtime.run import Schedule, drive
from ..runtime.trackers import open_trackers
from ..runtime.versions import WeightStore, staleness
from .actors import FleetSelfPlay
from .config import RESUME_FREE_FIELDS, NetworkConfig, ZeroConfig, thread_check
from .experience import InProcessSelfPlay
from .games import make_game
from .games.base import Game
from .learner import Learner
from .lenses import Counters, lens_metrics, nonfinite_figures
from .model import model_folder
from .network import (
    PolicyValueNet,
    grow_network,
    load_network,
    network_for,
    precision_workload,
    save_network,
    selfplay_batch,
)
from .replay import ReplayWindow, Samples
from .resign import PlayedOut, false_resignations, tune_threshold
from .selfplay import Actor, PlayStats
from .training_state import recorded_config_dir, saved_iteration, training_state

# Search settings that only make sense in self-play are not saved with the model.
_SELFPLAY_ONLY = ("dirichlet_alpha", "dirichlet_fraction")


@dataclass
class IterationReport:
    """What one iteration's self-play and learning produced, before the guard's verdict."""

    start: float
    samples: Samples
    play: PlayStats
    source_metrics: dict[str, float]
    resign_metrics: dict[str, float]
    held_out: dict[str, float] | None
    losses: list[dict[str, float]] = field(default_factory=list)
    lag: dict[str, float] = field(default_factory=dict)
    lags: np.ndarray | None = None  # version lag of each sample trained on
    train_seconds: float = 0.0


@dataclass
class TrainResult:
    run_dir: Path
    counters: Counters
    final_dir: Path
    last_metrics: dict[str, Any]


class ZeroRun:
    """Everything a run holds; `learn` then `finish` is one round of the loop."""

    def __init__(self, cfg: ZeroConfig, stage: int = 1, warm_start: bool = True) -> None:
        """`warm_start`: start from `network.init_from` when set (False when a checkpoint's
        weights are loaded next)."""
        self.cfg = cfg
        self.run_dir = cfg.run_dir()
        self.game = make_game(cfg.game.name, **cfg.game.kwargs)
        torch.manual_seed(cfg.train.seed)
        self.rng = np.random.default_rng(cfg.train.seed)  # the learner's sampling
        self.device = resolve_device(cfg.device)
        if warm_start:
            net = initial_network(cfg, self.game)
        else:  # a checkpoint's weights are loaded next
            net = network_for(self.game, cfg.network)
        # At the learner's thread count (set by _start_run); actors probe at their own. The
        # probe times this network's self-play calls (its shapes, not the weights' values).
        self.precision = resolve_compute_dtype(cfg.compute_dtype, self.device, precision_workload(
            net.to(self.device),
            selfplay_batch(cfg.selfplay.concurrent_games, cfg.mcts.leaves_per_call)))
        self.learner = Learner(net, cfg.train, self.device)
        self.undo = StepUndo(self.learner.net, self.learner.optimizer)
        # Where games come from and new weights go: one actor in this process, or a fleet
        # started by start_actors().
        self.source: InProcessSelfPlay | FleetSelfPlay | None = None
        if not cfg.runtime.actors:
            store = WeightStore(self.learner.net.state_dict(), version=0)
            self.source = InProcessSelfPlay(Actor(
                self.game,
                network_for(self.game, cfg.network, self.precision.name).to(self.device),
                cfg.mcts, cfg.selfplay, store, np.random.default_rng([cfg.train.seed, 1])), store)
        self.fleet_state: dict[str, Any] | None = None  # the fleet's, from a checkpoint
        self.resign_threshold = cfg.selfplay.resign_threshold  # tuned when asked to
        self.played_out: list[PlayedOut] = []  # the newest played-out games, for the tuning
        self.replay = ReplayWindow(
            cfg.replay.capacity, self.game.plane_shape, self.game.num_actions,
            cfg.replay.window_start, cfg.replay.window_growth,
            final_targets=self.learner.net.learns_final_position,
        )
        self.counters = Counters()
        self.stage = stage  # first iteration of the config stage `cfg` holds the settings of

    def start_actors(self) -> None:
        """Start the self-play fleet (runtime.actors > 0; inside a Ray session) with the
        current weights; a no-op for in-process self-play."""
        if self.cfg.runtime.actors and self.source is None:
            fleet = FleetSelfPlay(self.cfg, resign_threshold=self.resign_threshold,
                                  resumed=self.fleet_state)
            fleet.start(self.learner.net.state_dict(), self.counters.version)
            self.source = fleet

    def close(self) -> None:
        if self.source is not None:
            self.source.close()

    def _tune_resignation(self, play: PlayStats) -> dict[str, float]:
        """AlphaGo Zero's v_resign: the most aggressive threshold that keeps false
        resignations in the played-out games under the target (zero/resign.py)."""
        sp = self.cfg.selfplay
        if self.resign_threshold is None:
            return {}
        m = {}
        if sp.resign_false_positive_target is not None:
            self.played_out = (self.played_out + play.played_out)[-sp.resign_tune_window:]
            tuned = tune_threshold(self.played_out, target=sp.resign_false_positive_target,
                                   min_moves=sp.resign_min_moves,
                                   min_games=sp.resign_tune_min_games)
            if tuned is not None:
                self.resign_threshold = tuned
                self.source.set_resign_threshold(tuned)
            false, would = false_resignations(self.played_out, self.resign_threshold,
                                              sp.resign_min_moves)
            m["selfplay/played_out_games"] = len(self.played_out)
            m["selfplay/tuned_false_resign_rate"] = false / max(would, 1)
        m["selfplay/resign_threshold"] = self.resign_threshold  # from the next iteration on
        return m

    # -- one iteration ------------------------------------------------------------------------
    def learn(self, beat: Callable[[str], None] = lambda text: None) -> IterationReport:
        """Self-play then learning; `beat(text)` is told where it is (signs of life)."""
        cfg, start = self.cfg, time.perf_counter()
        if self.source is None:
            raise RuntimeError("runtime.actors > 0: call start_actors() (in a Ray session) first")
        games, iteration = cfg.selfplay.games_per_iteration, self.counters.iteration + 1
        samples, play, source_metrics = self.source.next_batch(games, lambda stats: beat(
            f"iteration {iteration}: self-play, {stats.games}/{games} games, {stats.moves} moves"))
        report = IterationReport(start, samples, play, source_metrics,
                                 self._tune_resignation(play),
                                 # scored before they are trained on: the generalisation lens
                                 self.learner.held_out(samples))
        self.replay.add(samples)
        train_start = time.perf_counter()
        versions: list[np.ndarray] = []
        if len(self.replay) >= cfg.train.min_replay and not self.replay.refilling():
            self.learner.set_lr(self.learner.lr_at(iteration))
            steps = math.ceil(len(samples) * cfg.train.sample_reuse / cfg.train.batch_size)
            augment_with = self.game if cfg.replay.augment else None
            for step in range(steps):
                batch = self.replay.sample(cfg.train.batch_size, self.rng, augment_with)
                report.losses.append(self.learner.step(batch))
                versions.append(batch.policy_version)
                beat(f"iteration {iteration}: learning, step {step + 1}/{steps}")
        report.train_seconds = time.perf_counter() - train_start
        if versions:
            report.lag = staleness(self.counters.version, np.concatenate(versions))
            report.lags = self.counters.version - np.concatenate(versions)
        return report

    def nonfinite(self, report: IterationReport) -> list[str]:
        return nonfinite_figures(report.losses, self.learner.net)

    def finish(self, report: IterationReport, undone: bool = False,
               publish: bool = True) -> dict[str, Any]:
        """Count the iteration and, unless its updates were `undone` (the guard restored
        the weights), publish the new weights; the iteration's figures."""
        if report.losses and not undone and publish:
            self.counters.version += 1
            self.source.publish(self.learner.net.state_dict(), self.counters.version)
        c = self.counters
        c.iteration += 1
        c.games += report.play.games
        c.samples += len(report.samples)
        c.learner_steps = self.learner.steps
        seconds = time.perf_counter() - report.start
        c.seconds += seconds
        metrics = lens_metrics(report.play, report.losses, report.lag, report.samples,
                               self.replay, c, seconds, report.train_seconds,
                               self.learner.optimizer.param_groups[0]["lr"], report.held_out)
        return {**metrics, **report.resign_metrics, **report.source_metrics,
                **self.precision.metrics()}

    def iterate(self, beat: Callable[[str], None] = lambda text: None) -> dict[str, Any]:
        """One round without the guard (`train` runs them with it)."""
        return self.finish(self.learn(beat))

    # -- checkpoints ------------------------------------------------------------------------
    def model_extra(self) -> dict[str, Any]:
        mcts = self.cfg.mcts.model_dump()
        for key in _SELFPLAY_ONLY:
            mcts.pop(key)
        extra = {"mcts": mcts, "run": self.cfg.name, "counters": asdict(self.counters)}
        if self.cfg.play_mcts:
            extra["play_mcts"] = dict(self.cfg.play_mcts)
        return extra

    def save_network_snapshot(self) -> Path:
        """The learner's network alone at this iteration, in networks/ (never pruned)."""
        path = checkpoint_path(self.run_dir, self.counters.iteration, folder=NETWORKS_DIR)
        with atomic_dir(path) as tmp:
            save_network(self.learner.net, tmp, self.game.name, self.cfg.game.kwargs,
                         self.model_extra())
        return path

    def save_checkpoint(self) -> Path:
        path = checkpoint_path(self.run_dir, self.counters.iteration)
        with atomic_dir(path) as tmp:
            save_network(self.learner.net, tmp, self.game.name, self.cfg.game.kwargs,
                         self.model_extra())
            torch.save({
                "learner": self.learner.state_dict(),
                "counters": asdict(self.counters),
                "rng": rng_state(),
                "learner_rng": self.rng.bit_generator.state,
                "resign": {"threshold": self.resign_threshold, "played_out": self.played_out},
                "fleet": self.source.checkpoint_state(),
            }, tmp / "trainer.pt")
            self.replay.save(tmp / "replay.npz")
            self.source.save_games(tmp)
        prune_checkpoints(self.run_dir, self.cfg.checkpoint.keep)
        return path

    def load_checkpoint(self, path: Path, replay_required: bool = True) -> None:
        """Everything `save_checkpoint` wrote to `path`. Without `replay_required` a
        checkpoint slimmed to its training state (export_training_state: no replay.npz, no
        games in flight) loads too: the replay then refills from self-play, its window growing
        on from the run's sample count, and learning waits until it holds window_start."""
        net, _ = load_network(path, self.game.name, self.cfg.game.kwargs)
        grown = net.arch != self.learner.net.arch
        if grown:  # a stage grew the network: same function, more capacity
            net = _grown(net, self.cfg.network)
            if net.arch != self.learner.net.arch:
                raise ValueError(f"checkpoint {path} holds a {net.arch} network, the config "
                                 f"asks for {self.learner.net.arch}")
        self.learner.net.load_state_dict(net.state_dict())
        # CPU first, whatever device saved it; the optimizer's state follows its parameters.
        state = torch.load(path / "trainer.pt", map_location="cpu", weights_only=False)
        if grown:  # the optimizer state belongs to the old parameters: start it afresh
            self.learner.steps = state["learner"]["steps"]
        else:
            self.learner.load_state_dict(state["learner"])
        self.counters = Counters(**state["counters"])
        set_rng_state(state["rng"])
        self.rng.bit_generator.state = state["learner_rng"]
        if replay_required or (path / "replay.npz").is_file():
            self.replay.load(path / "replay.npz")
        else:  # refilled by self-play; learning waits for a window of window_start samples
            self.replay.earlier = self.counters.samples
        self.fleet_state = state.get("fleet")
        resign = state.get("resign")
        if (resign is not None and resign["threshold"] is not None
                and self.cfg.selfplay.resign_false_positive_target is not None):
            self.resign_threshold, self.played_out = resign["threshold"], resign["played_out"]
        if isinstance(self.source, InProcessSelfPlay):  # a fleet starts after the load
            self.source.reset_weights(self.learner.net.state_dict(), self.counters.version)
            self.source.set_resign_threshold(self.resign_threshold)
            self.source.load_games(path, self.cfg.selfplay.concurrent_games)

    def save_final(self) -> Path:
        final = self.run_dir / "final"
        with atomic_dir(final) as tmp:
            save_network(self.learner.net, tmp, self.game.name, self.cfg.game.kwargs,
                         self.model_extra())
        return final


def initial_network(cfg: ZeroConfig, game: Game) -> PolicyValueNet:
    """The network a run of `game` starts from: random with the config's sizes, or the
    weights of `network.init_from` (grown to the config's sizes when they are larger)."""
    fresh = network_for(game, cfg.network)
    if cfg.network.init_from is None:
        return fresh
    folder = model_folder(cfg.network.init_from)
    try:
        net, _ = load_network(folder, cfg.game.name, cfg.game.kwargs)
    except (FileNotFoundError, ValueError) as err:
        raise type(err)(f"network.init_from: {err}") from None
    grows = all(fresh.arch[k] >= net.arch[k] for k in ("blocks", "value_channels"))
    same = all(fresh.arch.get(k) == net.arch.get(k)
               for k in ("channels", "value_hidden", "global_pooling"))
    if not (grows and same):
        raise ValueError(f"network.init_from: {folder} holds a {net.arch} network, the config "
                         f"asks for {fresh.arch} (only blocks and value_channels may grow, "
                         "and heads be added)")
    if net.arch != fresh.arch:
        net = _grown(net, cfg.network)
    net.train()
    return net


def _grown(net: PolicyValueNet, cfg: NetworkConfig) -> PolicyValueNet:
    """`net` grown to the sizes and auxiliary heads of `cfg` (network.grow_network)."""
    return grow_network(net, cfg.blocks, cfg.value_channels,
                        ownership_head=cfg.ownership_head, score_head=cfg.score_head)


class ZeroLoop:
    """A Zero run as the run skeleton (runtime/run.py) drives it: the ZeroRun of the current
    stage, replaced by the next stage's at its first iteration (checkpointed and resumed, so
    a staged run and one stopped and resumed by hand agree)."""

    def __init__(self, cfg: ZeroConfig, run: ZeroRun) -> None:
        self.cfg, self.run = cfg, run

    @property
    def done(self) -> int:
        return self.run.counters.iteration

    @property
    def undo(self) -> StepUndo:
        return self.run.undo

    @property
    def checkpoint_every(self) -> int:
        return self.run.cfg.checkpoint.every

    @property
    def max_minutes(self) -> float | None:
        return self.run.cfg.train.max_minutes

    def begin_step(self) -> None:
        upcoming = self.done + 1
        if self.cfg.stage_start(upcoming) != self.run.stage:
            path = checkpoint_path(self.run.run_dir, self.done)
            if not path.is_dir():
                path = self.run.save_checkpoint()
            self.run.close()  # a fleet restarts with the new stage's settings, as on a resume
            self.run = _start_run(self.cfg, upcoming, path)
            self.run.start_actors()

    def learn(self, beat: Callable[[str], None]) -> IterationReport:
        return self.run.learn(beat)

    def nonfinite(self, report: IterationReport) -> list[str]:
        return self.run.nonfinite(report)

    def finish(self, report: IterationReport, undone: bool, publish: bool = True
               ) -> dict[str, Any]:
        return self.run.finish(report, undone, publish)

    def after_step(self, metrics: dict[str, Any]) -> None:
        return None

    def histograms(self, report: IterationReport) -> dict[str, np.ndarray]:
        return {} if report.lags is None else {"staleness/lag": report.lags}

    def progress_fields(self, metrics: dict[str, Any]) -> dict[str, Any]:
        return {"games": self.run.counters.games, "vloss": metrics.get("credit/value_loss"),
                "ploss": metrics.get("bias_variance/policy_loss")}

    def save_checkpoint(self) -> Path:
        return self.run.save_checkpoint()

    def save_snapshot(self) -> None:
        every = self.run.cfg.checkpoint.networks_every
        if every and self.done % every == 0:
            self.run.save_network_snapshot()


def _start_run(cfg: ZeroConfig, iteration: int, checkpoint: Path | None,
               replay_required: bool = True) -> ZeroRun:
    """A ZeroRun with the settings of the stage `iteration` is in, from `checkpoint` if any."""
    stage = cfg.at_iteration(iteration)
    torch.set_num_threads(stage.train.threads)
    run = ZeroRun(stage, cfg.stage_start(iteration), warm_start=checkpoint is None)
    if checkpoint is not None:
        run.load_checkpoint(checkpoint, replay_required)
    return run


def train(cfg: ZeroConfig, resume: bool = False, progress: bool = True, *,
          overwrite: bool = False, allow_config_change: bool = False,
          resume_from: str | Path | None = None, resume_needs_run: bool = False) -> TrainResult:
    """Run `rlscale zero train`: iterate until cfg.train.iterations (or max_minutes).

    At the first iteration of each of `cfg.stages` the run checkpoints and resumes itself with
    that stage's settings, so a staged run and one stopped and resumed by hand agree.

    `resume_from`: continue another run's checkpoint (training_state) in the new directory
    cfg.run_dir(): its network, optimiser, counters, RNGs and resignation state; the replay
    window refills from self-play when the checkpoint has none (no updates until it holds
    replay.window_start samples, ReplayWindow.refilling). Its recorded config is
    checked as by `resume`.

    `resume_needs_run`: `--resume` must find a run to continue in cfg.run_dir() (the
    command's flag); without it a resume of a folder with no run starts one there."""
    if resume and resume_from is not None:
        raise ConfigError("--resume continues the run in its own directory and --resume-from "
                          "starts a new directory from another run's checkpoint: pass one")
    resolve_device(cfg.device)  # a missing GPU: one line, before the run directory
    _check_threads(cfg)  # one-line config errors before the run directory is touched
    source = None
    if resume_from is not None:
        try:
            source = training_state(resume_from)
        except FileNotFoundError as err:
            raise FileNotFoundError(f"--resume-from: {err}") from None
    if cfg.network.init_from is not None and not resume and source is None:
        initial_network(cfg, make_game(cfg.game.name, **cfg.game.kwargs))
    run_dir = cfg.run_dir()
    lock = rundir.prepare_run_dir(run_dir, resume=resume, overwrite=overwrite,
                                  extra_entries=(NETWORKS_DIR,), resume_needs_run=resume_needs_run)
    try:
        return _train(cfg, run_dir, resume, progress, allow_config_change, source)
    finally:
        lock.release()


def _stage_configs(cfg: ZeroConfig) -> list[ZeroConfig]:
    return [cfg.at_iteration(start) for start in [1, *sorted(cfg.stages)]]


def _check_threads(cfg: ZeroConfig) -> None:
    """Refuse (or warn about) a fleet that oversubscribes this machine's cores; a cluster
    by address places its actors itself."""
    if cfg.runtime.address is not None:
        return
    for stage in _stage_configs(cfg):
        rt = stage.runtime
        if not rt.actors:
            continue
        found = thread_check(rt.actors, rt.actor_threads, stage.train.threads, os.cpu_count() or 1)
        if found and found[0] == "error":
            raise ConfigError(found[1])
        if found:
            print(f"warning: {found[1]}")
            return


def _ray_if_needed(cfg: ZeroConfig) -> contextlib.AbstractContextManager[Any]:
    """A Ray session when any stage plays self-play on actors, else nothing."""
    actors = [s.runtime for s in _stage_configs(cfg) if s.runtime.actors]
    if not actors:
        return contextlib.nullcontext()
    cpus = max(rt.actors * rt.actor_threads for rt in actors)
    return ray_session(cfg.runtime.address, num_cpus=max(os.cpu_count() or 1, cpus),
                       connect_timeout_s=cfg.runtime.connect_timeout_s)


def _resume_point(cfg: ZeroConfig, run_dir: Path) -> tuple[Path, ZeroRun] | None:
    """The newest usable checkpoint, loaded; a torn one falls back to the one before."""

    def load(path: Path) -> ZeroRun:
        return _start_run(cfg, checkpoint_step(path) + 1, path)

    return load_latest_usable(run_dir, load)


def _train(cfg: ZeroConfig, run_dir: Path, resume: bool, progress: bool,
           allow_config_change: bool, source: Path | None = None) -> TrainResult:
    if source is not None:  # checked before loading: a refused config costs no work
        done = saved_iteration(source)
        rundir.check_resume_config(run_dir, cfg, done=done, length_key="train.iterations",
                                   free_fields=RESUME_FREE_FIELDS,
                                   allow_change=allow_config_change,
                                   recorded_in=recorded_config_dir(source))
        found = source, _start_run(cfg, done + 1, source, replay_required=False)
    else:
        found = _resume_point(cfg, run_dir) if resume else None
    resumed_from, run = found if found is not None else (None, _start_run(cfg, 1, None))
    if resume:
        rundir.check_resume_config(run_dir, cfg, done=run.counters.iteration,
                                   length_key="train.iterations", free_fields=RESUME_FREE_FIELDS,
                                   allow_change=allow_config_change)
    final = run_dir / "final"
    if resumed_from is not None and run.counters.iteration >= cfg.train.iterations \
            and (final / "model.json").is_file():
        print(f"the run in {run_dir} is already at iteration {run.counters.iteration}; "
              "nothing to do")
        return TrainResult(run_dir, run.counters, final, {})
    dump_config(cfg, run_dir / "config.yaml")
    resume_step = run.counters.iteration if resumed_from is not None else None
    logger = MetricsLogger(run_dir, resume_step=resume_step, trackers=open_trackers(
        cfg.logging, run_dir, config_to_dict(cfg), resume_step))
    bar = StepProgress(cfg.train.iterations, f"zero {cfg.name}", enabled=progress,
                       completed=run.counters.iteration, fields=("games", "vloss", "ploss"))
    loop = ZeroLoop(cfg, run)
    try:
        with _ray_if_needed(cfg):
            run.start_actors()
            try:
                outcome = drive(loop, Schedule(cfg.train.iterations, cfg.health, run_dir,
                                               what="iteration"),
                                logger, bar, Heartbeat(f"zero {cfg.name}", enabled=progress))
            finally:
                loop.run.close()
    finally:
        bar.close()
        logger.close()
    final = loop.run.save_final()
    return TrainResult(run_dir, loop.run.counters, final, outcome.metrics)
