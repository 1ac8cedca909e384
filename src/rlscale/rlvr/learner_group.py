"""The learner as the RLVR loop sees it: one process (`LocalLearner`, the trainer on the
loop's own model) or a group of `train.learner_processes` ranks (`LearnerGroup`), FSDP2
over gloo on CPU or NCCL on GPU (rlvr/sharding.py, rlvr/ranks.py).

A group's ranks are Ray actors in a placement group of one bundle each (the default), or
the processes `torchrun` started, rank 0 being the loop itself (`follow` is what the
others run). Either way the loop calls the same methods, each a collective every rank
runs: `step`, `update_stats`, `save`, `load`, the guard's `save_undo`/`restore_undo`; after
every change of weights the group writes the full weights into the loop's own model, which
samples, evaluates and publishes them exactly as a single process's would.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..config import ConfigError
from ..runtime.health import StepUndo, StepUndos
from . import sharding
from .batch import PolicyBatch
from .critic import make_critic
from .model import enable_activation_checkpointing, load_model
from .objectives import Objective
from .ranks import RankGroup
from .step_loss import StepLoss
from .trainer import PolicyTrainer, StepResult


def shuffle_generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class LocalLearner:
    """The single-process learner: the trainer on the loop's own model (no copies)."""

    def __init__(self, trainer: PolicyTrainer) -> None:
        self.trainer = trainer
        undo = StepUndo(trainer.model, trainer.optimizer, trainer.scheduler)
        critic = trainer.loss.critic
        # PPO: the critic trains in the same step, so an undone step puts it back too
        self.undo = undo if critic is None else \
            StepUndos(undo, StepUndo(critic.model, critic.optimizer))

    @property
    def version(self) -> int:
        return self.trainer.version

    def step(self, batch: PolicyBatch, seed: int) -> StepResult:
        return self.trainer.step(batch, shuffle_generator(seed))

    def update_stats(self, batch: PolicyBatch, before: StepResult) -> dict[str, float]:
        return self.trainer.update_stats(batch, before)

    def state(self) -> dict[str, Any]:
        """What trainer_state.pt keeps of the learner."""
        t = self.trainer
        critic = t.loss.critic
        return {"optimizer": t.optimizer.state_dict(), "scheduler": t.scheduler.state_dict(),
                "version": t.version, "critic": None if critic is None else critic.state()}

    def save(self, folder: Path) -> dict[str, Any]:
        return self.state()

    def load(self, folder: Path, state: dict[str, Any], lr: float, weight_decay: float) -> None:
        """The optimiser and schedule of a checkpoint (the loop loaded the weights), whether
        one process or a group (sharded optimiser state) saved it."""
        t = self.trainer
        if state.get("optimizer") is not None:
            t.optimizer.load_state_dict(state["optimizer"])
        else:
            sharding.load_optimizer(t.model, t.optimizer, folder)
        t.scheduler.load_state_dict(state["scheduler"])
        t.set_lr(lr, weight_decay)
        t.version = state["version"]
        critic = t.loss.critic
        if critic is not None:
            saved = saved_critic(state, folder)
            if saved["optimizer"] is not None:
                critic.load(saved)
            else:  # a group saved it: the weights whole, the optimiser sharded
                critic.model.load_state_dict(saved["model"])
                sharding.load_optimizer(critic.model, critic.optimizer, folder,
                                        sharding.CRITIC_OPTIMIZER_DIR)

    def close(self) -> None:
        return None


def saved_critic(state: dict[str, Any], folder: Path) -> dict[str, Any]:
    """A checkpoint's critic (weights, and the optimiser state of one process or None when
    a group saved it sharded beside it), or a one-line error naming the folder."""
    if state.get("critic") is None:
        raise ValueError(f"the checkpoint in {folder} has no critic: it was not saved by a "
                         "run with a learned critic (objective ppo)")
    return state["critic"]


@dataclass(frozen=True)
class LearnerSpec:
    """What every rank builds its part of the learner from (picklable)."""

    model_path: str
    model_dtype: str
    objective: Objective
    train: Any  # TrainConfig
    temperature: float
    compute_dtype: str
    with_reference: bool
    device: str  # cpu | cuda
    threads: int


class LearnerRank:
    """One rank of a learner group: its shards of the policy (and reference), its trainer."""

    def __init__(self) -> None:
        self.spec: LearnerSpec | None = None
        self.trainer: PolicyTrainer | None = None

    def address(self) -> tuple[str, int]:
        """Where rank 0 listens for the others: this host and a free port."""
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return socket.gethostbyname(socket.gethostname()), port

    def join(self, rank: int, size: int, device: str, init_method: str | None = None) -> int:
        """Join the group (`init_method`: tcp://host:port; None: torchrun's environment);
        returns the process id."""
        self.rank, self.size = rank, size
        if device == "cuda":  # Ray or torchrun made this rank's GPU its only one, or the local rank's
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        if not torch.distributed.is_initialized():
            torch.distributed.init_process_group(
                "nccl" if device == "cuda" else "gloo", init_method=init_method,
                rank=rank, world_size=size)
        return os.getpid()

    def build(self, spec: LearnerSpec) -> None:
        """This rank's shards of the policy (and reference), and its trainer."""
        self.spec = spec
        torch.set_num_threads(spec.threads)
        device = torch.device(spec.device)
        if device.type == "cuda":
            device = torch.device("cuda", torch.cuda.current_device())
        model, _ = load_model(spec.model_path, spec.model_dtype)
        ranks = RankGroup(self.rank, self.size)
        # PPO's value model copies the decoder before the policy's is sharded
        critic = make_critic(spec.objective, spec.train, model.to(device), spec.compute_dtype,
                             ranks=ranks)
        if spec.train.gradient_checkpointing:
            enable_activation_checkpointing(model)
        policy = sharding.shard_policy(model, device.type)
        reference = None
        if spec.with_reference:
            frozen, _ = load_model(spec.model_path, spec.model_dtype)
            reference = sharding.shard_policy(frozen.to(device), device.type)
            reference.eval().requires_grad_(False)
        self.trainer = PolicyTrainer(policy, reference, StepLoss(spec.objective, critic),
                                     spec.train, temperature=spec.temperature,
                                     compute_dtype=spec.compute_dtype, ranks=ranks)
        undo = StepUndo(policy, self.trainer.optimizer, self.trainer.scheduler)
        self.undo = undo if critic is None else \
            StepUndos(undo, StepUndo(critic.model, critic.optimizer))

    # -- the collectives the loop drives (every rank runs each) --------------------------
    def step(self, batch: PolicyBatch, seed: int) -> StepResult:
        return self.trainer.step(batch, shuffle_generator(seed))

    def update_stats(self, batch: PolicyBatch, before: StepResult) -> dict[str, float]:
        return self.trainer.update_stats(batch, before)

    def full_state(self) -> dict[str, torch.Tensor]:
        """The whole policy's weights on rank 0 (others: {})."""
        return sharding.full_state_dict(self.trainer.model.model)

    def save_undo(self) -> None:
        self.undo.save()

    def restore_undo(self) -> None:
        self.undo.restore()

    def save(self, folder: str) -> dict[str, Any]:
        """Each rank's optimiser shard into `folder`; rank 0's schedule and version (and
        PPO's critic: its whole weights, its optimiser's shards beside the policy's)."""
        t, critic = self.trainer, self.trainer.loss.critic
        sharding.save_optimizer(t.model.model, t.optimizer, Path(folder))
        kept = None
        if critic is not None:
            sharding.save_optimizer(critic.model, critic.optimizer, Path(folder),
                                    sharding.CRITIC_OPTIMIZER_DIR)
            kept = {"model": sharding.full_state_dict(critic.model), "optimizer": None}
        return {"optimizer": None, "scheduler": t.scheduler.state_dict(), "version": t.version,
                "critic": kept}

    def load(self, folder: str, state: dict[str, Any], lr: float, weight_decay: float) -> None:
        """A checkpoint's weights, optimiser (sharded or one process's) and schedule."""
        t, folder = self.trainer, Path(folder)
        model, _ = load_model(folder, self.spec.model_dtype)
        sharding.load_full_state_dict(t.model.model, model.state_dict())
        if state.get("optimizer") is not None:
            sharding.load_torch_optimizer_state(t.model.model, t.optimizer, state["optimizer"])
        else:
            sharding.load_optimizer(t.model.model, t.optimizer, folder)
        t.scheduler.load_state_dict(state["scheduler"])
        t.set_lr(lr, weight_decay)
        t.version = state["version"]
        critic = t.loss.critic
        if critic is not None:
            saved = saved_critic(state, folder)
            sharding.load_full_state_dict(critic.model, saved["model"])
            if saved["optimizer"] is not None:  # one process saved it
                sharding.load_torch_optimizer_state(critic.model, critic.optimizer,
                                                    saved["optimizer"])
            else:
                sharding.load_optimizer(critic.model, critic.optimizer, folder,
                                        sharding.CRITIC_OPTIMIZER_DIR)

    def close(self) -> None:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


class LearnerGroup:
    """The loop's side of a group of ranks: each call runs on every rank (`_call_all`, by
    Ray or by torchrun's broadcast); after every change of weights the full weights land in
    `model`, the loop's own copy that samples, evaluates and publishes."""

    def __init__(self, model: torch.nn.Module, spec: LearnerSpec) -> None:
        self.model, self.spec = model, spec
        self.version = 0
        self.undo = _GroupUndo(self)

    def _call_all(self, method: str, *args: Any) -> list[Any]:
        raise NotImplementedError

    def _call(self, method: str, *args: Any) -> Any:
        return self._call_all(method, *args)[0]  # rank 0's answer

    def _sync_weights(self) -> None:
        self.model.load_state_dict(self._call("full_state"))

    def step(self, batch: PolicyBatch, seed: int) -> StepResult:
        result = self._call("step", batch.to(torch.device("cpu")), seed)
        self.version += 1
        t0 = time.perf_counter()
        self._sync_weights()
        # rank 0 -> this process, fp32, whole (a share of time/update_s)
        result.metrics["time/learner_weights_s"] = time.perf_counter() - t0
        return result

    def update_stats(self, batch: PolicyBatch, before: StepResult) -> dict[str, float]:
        return self._call("update_stats", batch.to(torch.device("cpu")), before)

    def save(self, folder: Path) -> dict[str, Any]:
        """Every rank's optimiser shard into `folder` (the loop writes the weights)."""
        return self._call("save", str(folder))

    def load(self, folder: Path, state: dict[str, Any], lr: float, weight_decay: float) -> None:
        self._call("load", str(folder), state, lr, weight_decay)
        self.version = state["version"]
        self._sync_weights()


class _GroupUndo:
    """The guard's undo (runtime/health.StepUndo) on every rank, and the loop's copy again."""

    def __init__(self, group: LearnerGroup) -> None:
        self.group = group

    def save(self) -> None:
        self.group._call_all("save_undo")

    def restore(self) -> None:
        self.group._call_all("restore_undo")
        self.group._sync_weights()


class RayLearnerGroup(LearnerGroup):
    """The ranks as Ray actors, one bundle each of a placement group (`placement.learner`)."""

    def __init__(self, model: torch.nn.Module, spec: LearnerSpec, processes: int,
                 placement) -> None:
        super().__init__(model, spec)
        from ..runtime.fleet import import_ray
        from ..runtime.placement import actor_options, create_placement_group, ray_bundles

        ray = self._ray = import_ray()
        self.group = create_placement_group(ray_bundles(placement.learner, processes),
                                            placement.strategy, "rlscale-learner",
                                            placement.timeout_s)
        self.actors = [ray.remote(**actor_options(placement.learner, self.group, i))(
            LearnerRank).remote() for i in range(processes)]
        host, port = ray.get(self.actors[0].address.remote())
        ray.get([a.join.remote(i, processes, spec.device, f"tcp://{host}:{port}")
                 for i, a in enumerate(self.actors)])
        self._call_all("build", spec)
        self._sync_weights()

    def _call_all(self, method: str, *args: Any) -> list[Any]:
        ray = self._ray
        refs = [ray.put(a) if isinstance(a, PolicyBatch | StepResult | dict) else a for a in args]
        return ray.get([getattr(actor, method).remote(*refs) for actor in self.actors])

    def close(self) -> None:
        ray = self._ray
        try:
            ray.get([a.close.remote() for a in self.actors], timeout=60)
        finally:
            for actor in self.actors:
                ray.kill(actor)
            ray.util.remove_placement_group(self.group)


class TorchrunLearnerGroup(LearnerGroup):
    """Rank 0 of a `torchrun` launch: the loop runs here beside this process's rank, and
    every call is broadcast to the other processes, which run `follow`."""

    def __init__(self, model: torch.nn.Module, spec: LearnerSpec) -> None:
        super().__init__(model, spec)
        self.rank = LearnerRank()
        self.rank.join(0, int(os.environ["WORLD_SIZE"]), spec.device)
        self.commands = torch.distributed.new_group(backend="gloo")
        self._call_all("build", spec)
        self._sync_weights()

    def _call_all(self, method: str, *args: Any) -> list[Any]:
        torch.distributed.broadcast_object_list([(method, args)], src=0, group=self.commands)
        return [getattr(self.rank, method)(*args)]

    def close(self) -> None:
        self._call_all("close")


def launched_by_torchrun() -> bool:
    """Whether `torchrun` started this process (its ranks are then the learner group)."""
    return "TORCHELASTIC_RUN_ID" in os.environ


def torchrun_rank() -> int:
    """This process's rank when `torchrun` started it (0 otherwise)."""
    return int(os.environ.get("RANK", 0)) if launched_by_torchrun() else 0


def follow(device: str) -> None:
    """What ranks > 0 of a `torchrun` launch run: rank 0's calls, until it closes the group.
    `device`: the run's (cpu | cuda), resolved from the config as rank 0 resolves it, so
    every rank picks the same backend."""
    rank = LearnerRank()
    rank.join(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), device)
    commands = torch.distributed.new_group(backend="gloo")
    while True:
        message: list[Any] = [None]
        torch.distributed.broadcast_object_list(message, src=0, group=commands)
        method, args = message[0]
        getattr(rank, method)(*args)
        if method == "close":
            return


def learner_spec(cfg, objective: Objective, compute_dtype: str, device: torch.device,
                 with_reference: bool) -> LearnerSpec:
    """What every rank of `cfg`'s learner group builds (cfg: an RLVRConfig)."""
    launched = int(os.environ.get("WORLD_SIZE", 1))
    if launched_by_torchrun() and launched != cfg.train.learner_processes:
        raise ConfigError(f"torchrun started {launched} processes but "
                          f"train.learner_processes is {cfg.train.learner_processes}: make "
                          "them equal")
    return LearnerSpec(str(cfg.model.path), cfg.model.dtype, objective, cfg.train,
                       cfg.rollout.temperature, compute_dtype, with_reference, device.type,
                       threads=max(1, int(cfg.placement.learner.cpus)))


def start_learner_group(cfg, model: torch.nn.Module, spec: LearnerSpec) -> LearnerGroup:
    """`cfg`'s learner ranks, with `model` (the loop's copy) holding their weights: the
    processes torchrun started, else Ray actors (inside the run's Ray session)."""
    if launched_by_torchrun():
        return TorchrunLearnerGroup(model, spec)
    if spec.device == "cuda" and cfg.placement.learner.gpus < 1:
        raise ConfigError("device cuda with train.learner_processes > 1 needs "
                          "placement.learner.gpus: 1 (a GPU for each learner process)")
    return RayLearnerGroup(model, spec, cfg.train.learner_processes, cfg.placement)
