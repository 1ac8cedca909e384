"""The AlphaZero training loop: self-play -> replay window -> learner -> new weights.

    for each iteration:
        actor.sync()                      # newest weights from the publisher
        samples = actor.play(G games)     # batched search, samples stamped with the version
        replay.add(samples)
        learner trains on the window      # new_samples * sample_reuse / batch_size steps
        weights.publish(net, version + 1) # the one publisher: in-process or the fleet
        log the lenses; checkpoint every K iterations

A checkpoint holds the network, optimiser, replay window, the actor's games in flight (with
their trees) and every RNG, so a resumed run continues exactly where the original stopped.

With `runtime.actors: M > 0` the actor is a fleet of M Ray actors playing while the learner
trains (zero/actors.py): `iterate` takes `games_per_iteration` finished games from it and
publishes the new weights to it. A resumed fleet run restarts its actors with the
checkpointed weights (consistent counters and game ids; not the same games).
"""

from __future__ import annotations

import contextlib
import math
import os
import pickle
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlscale.config import ConfigError, config_to_dict, dump_config
from rlscale.runtime import rundir
from rlscale.runtime.checkpoint import (
    NETWORKS_DIR,
    atomic_dir,
    checkpoint_path,
    checkpoint_step,
    latest_checkpoint,
    load_latest_usable,
    prune_checkpoints,
    rng_state,
    set_rng_state,
)
from rlscale.runtime.device import resolve_compute_dtype, resolve_device
from rlscale.runtime.fleet import ray_session
from rlscale.runtime.health import (
    NonFiniteError,
    NonFiniteGuard,
    StepUndo,
    parameters_finite,
    unrecoverable_message,
)
from rlscale.runtime.metrics import Heartbeat, MetricsLogger, StepProgress
from rlscale.runtime.trackers import open_trackers
from rlscale.runtime.versions import WeightPublisher, WeightStore, staleness
from rlscale.zero.actors import FleetSelfPlay
from rlscale.zero.agent import model_folder
from rlscale.zero.config import RESUME_FREE_FIELDS, NetworkConfig, ZeroConfig, thread_check
from rlscale.zero.games import make_game
from rlscale.zero.games.base import Game
from rlscale.zero.learner import Learner
from rlscale.zero.network import (
    PolicyValueNet,
    grow_network,
    load_network,
    network_for,
    precision_workload,
    save_network,
    selfplay_batch,
)
from rlscale.zero.replay import ReplayWindow, Samples
from rlscale.zero.resign import PlayedOut, false_resignations, tune_threshold
from rlscale.zero.selfplay import Actor, PlayStats

# Search settings that only make sense in self-play are not saved with the model.
_SELFPLAY_ONLY = ("dirichlet_alpha", "dirichlet_fraction")


@dataclass
class Counters:
    iteration: int = 0
    games: int = 0
    samples: int = 0
    learner_steps: int = 0
    version: int = 0
    seconds: float = 0.0  # wall time spent in iterations, summed over resumes


@dataclass
class TrainResult:
    run_dir: Path
    counters: Counters
    final_dir: Path
    last_metrics: dict[str, Any]


class ZeroRun:
    """Everything a run holds; `iterate()` is one round of the loop."""

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
        # The one place new weights go: this in-process store, or the fleet (start_actors).
        self.weights: WeightPublisher = WeightStore(self.learner.net.state_dict(), version=0)
        # In-process self-play (runtime.actors 0), or a fleet started by start_actors().
        self.actor = None if cfg.runtime.actors else Actor(
            self.game, network_for(self.game, cfg.network, self.precision.name).to(self.device),
            cfg.mcts,
            cfg.selfplay, self.weights, np.random.default_rng([cfg.train.seed, 1]),
        )
        self.fleet: FleetSelfPlay | None = None
        self.fleet_state: dict[str, Any] | None = None  # the fleet's, from a checkpoint
        self.resign_threshold = cfg.selfplay.resign_threshold  # tuned when asked to
        self.played_out: list[PlayedOut] = []  # the newest played-out games, for the tuning
        self.replay = ReplayWindow(
            cfg.replay.capacity, self.game.plane_shape, self.game.num_actions,
            cfg.replay.window_start, cfg.replay.window_growth,
            final_targets=self.learner.net.learns_final_position,
        )
        self.counters = Counters()
        self.last_lags: np.ndarray | None = None  # version lag of each sample trained on
        self.stage = stage  # first iteration of the config stage `cfg` holds the settings of

    # -- self-play: in-process, or the fleet ------------------------------------------------
    def start_actors(self) -> None:
        """Start the self-play fleet (runtime.actors > 0; inside a Ray session) with the
        current weights; a no-op for in-process self-play."""
        if self.cfg.runtime.actors and self.fleet is None:
            self.fleet = FleetSelfPlay(self.cfg, resign_threshold=self.resign_threshold,
                                       resumed=self.fleet_state)
            self.fleet.start(self.learner.net.state_dict(), self.counters.version)
            self.weights = self.fleet

    def close(self) -> None:
        if self.fleet is not None:
            self.fleet.close()

    def _self_play(self, games: int, beat: Callable[[str], None]
                   ) -> tuple[Samples, PlayStats, dict[str, float]]:
        if self.fleet is not None:
            return self.fleet.take(games)
        if self.actor is None:
            raise RuntimeError("runtime.actors > 0: call start_actors() (in a Ray session) first")
        self.actor.sync()
        iteration = self.counters.iteration + 1
        return *self.actor.play(games, on_step=lambda stats: beat(
            f"iteration {iteration}: self-play, {stats.games}/{games} games, "
            f"{stats.moves} moves")), {}

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
                if self.actor is not None:
                    self.actor.resign_threshold = tuned
                if self.fleet is not None:
                    self.fleet.set_resign_threshold(tuned)
            false, would = false_resignations(self.played_out, self.resign_threshold,
                                              sp.resign_min_moves)
            m["selfplay/played_out_games"] = len(self.played_out)
            m["selfplay/tuned_false_resign_rate"] = false / max(would, 1)
        m["selfplay/resign_threshold"] = self.resign_threshold  # from the next iteration on
        return m

    # -- one iteration ------------------------------------------------------------------------
    def iterate(self, beat: Callable[[str], None] = lambda text: None) -> dict[str, Any]:
        """One round; `beat(text)` is told where it is (Heartbeat: signs of life)."""
        cfg = self.cfg
        start = time.perf_counter()
        samples, play, fleet_metrics = self._self_play(cfg.selfplay.games_per_iteration, beat)
        resign_metrics = self._tune_resignation(play)
        # Scored before they are trained on: the generalisation lens (see Learner.held_out).
        held_out = self.learner.held_out(samples)
        self.replay.add(samples)

        train_start = time.perf_counter()
        losses: list[dict[str, float]] = []
        versions: list[np.ndarray] = []
        self.nonfinite = []
        guard_mode = cfg.health.nonfinite_guard
        if guard_mode == "snapshot":
            self.undo.save()
        if len(self.replay) >= cfg.train.min_replay and not self.replay.refilling():
            self.learner.set_lr(self.learner.lr_at(self.counters.iteration + 1))
            steps = math.ceil(len(samples) * cfg.train.sample_reuse / cfg.train.batch_size)
            augment_with = self.game if cfg.replay.augment else None
            for step in range(steps):
                batch = self.replay.sample(cfg.train.batch_size, self.rng, augment_with)
                losses.append(self.learner.step(batch))
                versions.append(batch.policy_version)
                beat(f"iteration {self.counters.iteration + 1}: learning, step {step + 1}/{steps}")
        train_seconds = time.perf_counter() - train_start
        lag = staleness(self.counters.version, np.concatenate(versions)) if versions else {}
        self.last_lags = self.counters.version - np.concatenate(versions) if versions else None
        self.nonfinite = [] if guard_mode == "off" else _nonfinite(losses, self.learner.net)
        if self.nonfinite and guard_mode == "check" and "weights" in self.nonfinite:
            raise NonFiniteError(unrecoverable_message(
                "iteration", self.counters.iteration + 1, str(self.run_dir)))
        if self.nonfinite and guard_mode == "snapshot":
            # undo the iteration's updates; the self-play games stay in replay
            self.undo.restore()
        elif losses:
            self.counters.version += 1
            self.weights.publish(self.learner.net.state_dict(), self.counters.version)

        c = self.counters
        c.iteration += 1
        c.games += play.games
        c.samples += len(samples)
        c.learner_steps = self.learner.steps
        seconds = time.perf_counter() - start
        c.seconds += seconds
        metrics = _lens_metrics(play, losses, lag, samples, self.replay, c, seconds,
                                train_seconds, self.learner.optimizer.param_groups[0]["lr"],
                                held_out)
        return {**metrics, **resign_metrics, **fleet_metrics, **self.precision.metrics()}

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
                "fleet": self.fleet.checkpoint_state() if self.fleet is not None else None,
            }, tmp / "trainer.pt")
            self.replay.save(tmp / "replay.npz")
            if self.actor is not None:  # a fleet's games in flight are not saved
                with open(tmp / "actor.pkl", "wb") as f:
                    pickle.dump(self.actor.state_dict(), f)
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
        self.weights = WeightStore(self.learner.net.state_dict(), version=self.counters.version)
        if replay_required or (path / "replay.npz").is_file():
            self.replay.load(path / "replay.npz")
        else:  # refilled by self-play; learning waits for a window of window_start samples
            self.replay.earlier = self.counters.samples
        self.fleet_state = state.get("fleet")
        resign = state.get("resign")
        if (resign is not None and resign["threshold"] is not None
                and self.cfg.selfplay.resign_false_positive_target is not None):
            self.resign_threshold, self.played_out = resign["threshold"], resign["played_out"]
        if self.actor is None:
            return
        self.actor.weights = self.weights
        self.actor.resign_threshold = self.resign_threshold
        if not (path / "actor.pkl").is_file():  # saved by a fleet run: fresh games
            return
        with open(path / "actor.pkl", "rb") as f:
            actor_state = pickle.load(f)
        # Games in flight carry over unless the resumed config asks for another number.
        if len(actor_state["slots"]) == self.cfg.selfplay.concurrent_games:
            self.actor.load_state_dict(actor_state)

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


def _nonfinite(losses: list[dict[str, float]], net: torch.nn.Module) -> list[str]:
    """The non-finite figures of an iteration's updates: a loss, or the weights themselves."""
    bad = sorted({k for x in losses for k, v in x.items() if not math.isfinite(v)})
    if not parameters_finite(net.parameters()):
        bad.append("weights")
    return bad


def _lens_metrics(
    play: PlayStats,
    losses: list[dict[str, float]],
    lag: dict[str, float],
    samples: Any,
    replay: ReplayWindow,
    c: Counters,
    seconds: float,
    train_seconds: float,
    lr: float,
    held_out: dict[str, float] | None = None,
) -> dict[str, Any]:
    outcomes = np.array(play.outcomes)
    m: dict[str, Any] = {}
    # credit assignment: is the value learnable and are outcomes balanced?
    if losses:
        m["credit/value_loss"] = float(np.mean([x["value_loss"] for x in losses]))
    if held_out:
        # the same losses on the new games, before training on them (value against z alone)
        m["credit/held_out_value_loss"] = held_out["value_loss"]
        m["bias_variance/held_out_policy_loss"] = held_out["policy_loss"]
    m["credit/outcome_p0_win"] = float((outcomes > 0).mean())
    m["credit/outcome_draw"] = float((outcomes == 0).mean())
    m["credit/outcome_p1_win"] = float((outcomes < 0).mean())
    # bias-variance: how far the search moves from the prior, how well the net follows it
    if losses:
        m["bias_variance/policy_loss"] = float(np.mean([x["policy_loss"] for x in losses]))
    m["bias_variance/search_prior_kl"] = play.kl_sum / max(len(samples), 1)
    # KataGo's auxiliary targets, over the batches that had a played-out game
    for key, name in (("ownership_loss", "loss/ownership"), ("score_loss", "loss/score")):
        values = [x[key] for x in losses if key in x]
        if values:
            m[name] = float(np.mean(values))
    # moving distribution: the policy's entropy and the games it plays
    if losses:
        m["moving/policy_entropy"] = float(np.mean([x["policy_entropy"] for x in losses]))
    m["moving/game_length"] = float(np.mean(play.lengths))
    # share of this iteration's games that differ from each other (1 = all distinct); near
    # 1/games means self-play has collapsed onto one line (see selfplay.random_opening_share)
    m["moving/distinct_games"] = len(play.sequences) / max(play.games, 1)
    # staleness: version lag of the replay samples trained on
    m.update(lag)
    # resignation
    if play.resigned or play.playout_would_resign:
        m["selfplay/resigned_share"] = play.resigned / max(play.games, 1)
        m["selfplay/false_resign_rate"] = play.false_resignations / max(play.playout_would_resign, 1)
    # speed and counters
    m["train/lr"] = lr
    m["speed/games_per_hour"] = play.games / seconds * 3600.0
    m["speed/simulations_per_second"] = play.simulations / max(play.seconds, 1e-9)
    m["speed/selfplay_seconds"] = play.seconds
    m["speed/train_seconds"] = train_seconds
    m["replay/size"] = len(replay)
    m["replay/window"] = replay.window()
    if replay.earlier:  # resumed without its replay: 1 while learning waits for the refill
        m["replay/refilling"] = float(replay.refilling())
    m["counters/games"] = c.games
    m["counters/samples"] = c.samples
    m["counters/learner_steps"] = c.learner_steps
    m["counters/version"] = c.version
    m["counters/seconds"] = c.seconds
    return m


def _start_run(cfg: ZeroConfig, iteration: int, checkpoint: Path | None,
               replay_required: bool = True) -> ZeroRun:
    """A ZeroRun with the settings of the stage `iteration` is in, from `checkpoint` if any."""
    stage = cfg.at_iteration(iteration)
    torch.set_num_threads(stage.train.threads)
    run = ZeroRun(stage, cfg.stage_start(iteration), warm_start=checkpoint is None)
    if checkpoint is not None:
        run.load_checkpoint(checkpoint, replay_required)
    return run


# What a run needs to go on learning where it stopped, without the replay window and the games
# in flight (megabytes instead of tens): small enough to commit beside the code, so a run
# longer than one sitting survives a fresh clone. The model files also make it a playable
# model folder.
TRAINING_STATE_FILES = ("model.json", "model.safetensors", "trainer.pt")


def training_state(path: str | Path) -> Path:
    """The checkpoint `path` names for `--resume-from`: a folder holding trainer.pt (a
    checkpoint, or one export_training_state wrote), or a run directory's newest checkpoint."""
    path = Path(path)
    found = path if (path / "trainer.pt").is_file() else latest_checkpoint(path)
    if found is None or not all((found / name).is_file() for name in TRAINING_STATE_FILES):
        raise FileNotFoundError(f"{path} holds no checkpoint (a folder with "
                                f"{', '.join(TRAINING_STATE_FILES)}, or a run directory)")
    return found


def _recorded_config_dir(checkpoint: Path) -> Path:
    """Where the config of the run that wrote `checkpoint` lies: beside it (an exported
    state) or in its run directory (run/checkpoints/step_N)."""
    return checkpoint if (checkpoint / "config.yaml").is_file() else checkpoint.parent.parent


def export_training_state(path: str | Path, out: str | Path) -> Path:
    """Copy the training state of the checkpoint `path` names (TRAINING_STATE_FILES and its
    run's config.yaml) into the new folder `out`; `rlscale zero train --resume-from out`
    continues that run. Refuses an `out` that exists: nothing of the user's is replaced."""
    import shutil

    source, out = training_state(path), Path(out)
    if out.exists():
        raise FileExistsError(f"{out} already exists; export the training state to a new folder")
    config = _recorded_config_dir(source) / "config.yaml"
    with atomic_dir(out) as tmp:
        for name in TRAINING_STATE_FILES:
            shutil.copy2(source / name, tmp / name)
        if config.is_file():
            shutil.copy2(config, tmp / "config.yaml")
    return out


def _saved_iteration(checkpoint: Path) -> int:
    """The iteration a checkpoint was saved at (its model.json's counters)."""
    import json

    return int(json.loads((checkpoint / "model.json").read_text())["extra"]["counters"]["iteration"])


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
        done = _saved_iteration(source)
        rundir.check_resume_config(run_dir, cfg, done=done, length_key="train.iterations",
                                   free_fields=RESUME_FREE_FIELDS,
                                   allow_change=allow_config_change,
                                   recorded_in=_recorded_config_dir(source))
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
    try:
        with _ray_if_needed(cfg):
            run.start_actors()
            try:
                run, metrics = _iterate(cfg, run, logger, bar,
                                        Heartbeat(f"zero {cfg.name}", enabled=progress))
            finally:
                run.close()
    finally:
        bar.close()
        logger.close()
    final = run.save_final()
    return TrainResult(run_dir, run.counters, final, metrics)


def _iterate(cfg: ZeroConfig, run: ZeroRun, logger: MetricsLogger, bar: StepProgress,
             heartbeat: Heartbeat) -> tuple[ZeroRun, dict[str, Any]]:
    """Iterate, log and checkpoint until train.iterations (or max_minutes); the run of the
    last stage and the last metrics."""
    run_dir = cfg.run_dir()
    guard = NonFiniteGuard(cfg.health.max_nonfinite_steps, what="iteration")
    started = time.perf_counter()
    metrics: dict[str, Any] = {}
    while run.counters.iteration < cfg.train.iterations:
        upcoming = run.counters.iteration + 1
        if cfg.stage_start(upcoming) != run.stage:
            path = checkpoint_path(run_dir, run.counters.iteration)
            if not path.is_dir():
                path = run.save_checkpoint()
            run.close()  # a fleet restarts with the new stage's settings, as on a resume
            run = _start_run(cfg, upcoming, path)
            run.start_actors()
        values = run.iterate(heartbeat.beat)
        guard.observe(run.counters.iteration, run.nonfinite)
        values["health/skipped_steps"] = guard.skipped
        metrics = logger.log(run.counters.iteration, values)
        if guard.should_stop:
            # The weights are the last good ones again: a checkpoint to resume from.
            path = run.save_checkpoint()
            raise NonFiniteError(guard.stop_message(run.counters.iteration, run.nonfinite,
                                                    str(path)))
        if run.last_lags is not None:
            logger.log_histogram(run.counters.iteration, "staleness/lag", run.last_lags)
        bar.update(run.counters.iteration, {
            "games": run.counters.games, "vloss": metrics.get("credit/value_loss"),
            "ploss": metrics.get("bias_variance/policy_loss")})
        last = run.counters.iteration >= cfg.train.iterations
        budget = run.cfg.train.max_minutes
        out_of_time = budget is not None and time.perf_counter() - started > 60 * budget
        networks_every = run.cfg.checkpoint.networks_every
        if networks_every and run.counters.iteration % networks_every == 0:
            run.save_network_snapshot()
        if run.counters.iteration % run.cfg.checkpoint.every == 0 or last or out_of_time:
            run.save_checkpoint()
        if out_of_time:
            break
    return run, metrics
