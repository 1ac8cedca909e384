"""The RLVR loop: collect -> reward -> advantages -> update -> log -> eval -> checkpoint.

The trainer takes its batches from a `RolloutSource` (rollout_source.py) and publishes its
weights back to it: in sync mode the sampler on the trainer's own model object (every
rollout exactly on-policy), in async / inflight mode the fleet of inference workers
(fleet.py); the learner side is the same for both.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ..config import config_to_dict, dump_config
from ..runtime import checkpoint as ckpt
from ..runtime import rundir
from ..runtime.device import (
    compute_context,
    peak_memory_gib,
    resolve_compute_dtype,
    resolve_device,
)
from ..runtime.fleet import check_reachable, import_ray, ray_session
from ..runtime.health import (
    ZeroRewardWatch,
    all_zero_reward,
    non_finite_keys,
    parameters_finite,
)
from ..runtime.metrics import Heartbeat, MetricsLogger, StepProgress, read_metrics
from ..runtime.run import Schedule, drive
from ..runtime.trackers import open_trackers
from ..runtime.versions import staleness
from . import lora, objectives, shaping
from .advantages import ADVANTAGE_ESTIMATORS
from .batch import build_policy_batch
from .config import RESUME_FREE_FIELDS, LossConfig, RLVRConfig
from .critic import make_critic
from .curriculum import make_curriculum
from .evaluate import evaluate
from .fleet import FleetResume, FleetRollouts, fleet_resume
from .learner_group import (
    LearnerGroup,
    LocalLearner,
    launched_by_torchrun,
    learner_spec,
    start_learner_group,
)
from .model import (
    enable_activation_checkpointing,
    load_model,
    load_teacher,
    precision_workload,
)
from .rewards import VerifierPool
from .rollout.groups import RolloutGroup, step_seed
from .rollout_source import InProcessRollouts, RolloutSource
from .step_loss import StepLoss
from .tasks import make_task
from .token_math import masked_mean
from .tool_turns import RunnerToolTurns
from .trace_stats import behaviour_means, length_by_outcome, mean_by_difficulty
from .trainer import PolicyTrainer

# A step with any of these not finite is undone and counted (see runtime/health.py). The
# trainer drops non-finite loss terms from its averages, so a NaN loss shows as a NaN
# gradient norm; a NaN produced by the update itself shows in the KL or the weights.
GUARDED_METRICS = ("loss/loss", "policy/grad_norm", "policy/grad_norm_max", "policy/kl_new_old",
                   "kl/mean")


def shaped_rewards(group: RolloutGroup, objective: objectives.Objective,
                   cfg: RLVRConfig, step: int = 0) -> tuple[torch.Tensor, dict[str, float]]:
    """Verifier reward plus the objective's shaping terms (shaping.SHAPING_TERMS), and their
    statistics with the completion length per difficulty bucket."""
    lengths = group.rollout.lengths.float()
    size = cfg.rollout.group_size
    rewards, stats = shaping.shape_rewards(
        shaping.ShapingInputs(group.rewards, lengths, size, cfg.rollout.max_new_tokens, step),
        objective)
    success = group.rewards.view(-1, size).gt(0.5).float().mean(1)
    group_lengths = lengths.view(-1, size)
    for bucket in ("easy", "medium", "hard"):
        chosen = [i for i, b in enumerate(shaping.difficulty_buckets(success.tolist())) if b == bucket]
        if chosen:
            stats[f"length/{bucket}_mean"] = float(group_lengths[chosen].mean())
            stats[f"length/{bucket}_share"] = len(chosen) / len(success)
    return rewards, stats


def cxx_compiler() -> str | None:
    """The C++ compiler torch.compile's inductor would build CPU kernels with ($CXX, g++,
    c++ or clang++), or None."""
    candidates = [os.environ["CXX"]] if os.environ.get("CXX") else []
    return next((path for name in (*candidates, "g++", "c++", "clang++")
                 if (path := shutil.which(name))), None)


def preflight(cfg: RLVRConfig) -> None:
    """What a run needs that is not there, as one line before anything is written or Ray
    starts: the fleets' packages; and a warning for keys that do nothing in this mode."""
    inert = cfg.inert_fleet_fields()
    if inert:
        print(f"warning: runtime.mode is sync; {', '.join(inert)} only apply to runtime.mode "
              "async or inflight and do nothing here", file=sys.stderr, flush=True)
    if cfg.train.compile and cfg.device != "cuda" and cxx_compiler() is None:
        raise ValueError("train.compile needs a C++ compiler on CPU (torch.compile's inductor "
                         "builds its kernels with one) and none was found (g++, c++, clang++ "
                         "or $CXX); install one, or set train.compile=false")
    if cfg.runtime.mode == "sync":
        return
    import_ray()  # a FleetUnavailable naming the extra to install
    if cfg.rollout.engine == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ValueError("rollout.engine=vllm needs the vllm package, which this Python "
                         f"({sys.executable}) does not have; vLLM lives in its own venv "
                         "(docs/async.md), or use rollout.engine=native")
    if cfg.runtime.address:
        check_reachable(cfg.runtime.address, cfg.runtime.connect_timeout_s)


@dataclass(frozen=True)
class StepRecord:
    """What one training step hands the loop: its metrics (logged) and the version lag of
    every trained token (logged as a histogram)."""

    metrics: dict[str, Any]
    token_lags: torch.Tensor


class RLVRRun:
    """One training run in `cfg.run_dir`, fresh or resumed from its last checkpoint."""

    def __init__(self, cfg: RLVRConfig, *, resume: bool = False, overwrite: bool = False,
                 allow_config_change: bool = False, resume_needs_run: bool = True) -> None:
        """`resume_needs_run`: `rlvr train --resume` must find a run to continue, not start
        one in an empty or missing folder (`train()` below, the library's "continue or
        start" call, lets a resume start one)."""
        self.cfg = cfg
        self.run_dir = Path(cfg.run_dir)
        self.device = resolve_device(cfg.device)  # before the run directory: a bad one costs nothing
        preflight(cfg)
        if cfg.train.threads:  # before the precision probe: it measures at this thread count
            torch.set_num_threads(cfg.train.threads)
        # Refuses a folder that is not ours, a started run without --resume/--overwrite, and a
        # second concurrent run; released at the end of train() (or at exit).
        self.lock = rundir.prepare_run_dir(self.run_dir, resume=resume, overwrite=overwrite,
                                           resume_needs_run=resume_needs_run)
        self.objective = cfg.resolved_objective()
        self.task = make_task(cfg.task.name, **cfg.task.options)
        self._load_policy(cfg)
        t = cfg.train
        self.reference = None  # with LoRA: the base model, by disabling the adapters
        wants_reference = self.objective.kl_coef > 0 or (t.post_update_stats and t.reference_kl)
        self.sharded = t.learner_processes > 1  # the ranks hold the learner (and reference)
        if wants_reference and cfg.model.lora is None and not self.sharded:
            self.reference, _ = load_model(cfg.model.path, cfg.model.dtype)
            self.reference.to(self.device).eval().requires_grad_(False)
        # On-policy distillation's teacher scores the student's samples (checked: same tokenizer).
        self.teacher = (load_teacher(cfg.teacher.path, cfg.teacher.dtype, self.tokenizer
                                     ).to(self.device)
                        if self.objective.uses_teacher else None)
        # PPO's critic: here, or (a learner group) on the ranks only, where it trains; this
        # trainer then only scores for the teacher and counts versions until the group starts.
        critic = None if self.sharded else make_critic(self.objective, cfg.train, self.model,
                                                       self.compute_dtype)
        self.trainer = PolicyTrainer(self.model, self.reference,
                                     StepLoss(self.objective, critic), cfg.train,
                                     temperature=cfg.rollout.temperature,
                                     compute_dtype=self.compute_dtype)
        # The learner: this trainer, or (train.learner_processes > 1) the group of ranks
        # started in train(), where a checkpoint's learner state waits for it.
        self.learner: LocalLearner | LearnerGroup = LocalLearner(self.trainer)
        self.learner_spec = learner_spec(cfg, self.objective, self.compute_dtype, self.device,
                                         with_reference=wants_reference)
        self.pending_learner_state: tuple[Path, dict[str, Any]] | None = None
        # Verifiers never run in the trainer's process (a hang or a crash must not stop it).
        self.pool = VerifierPool.from_config(self.task, cfg.task)
        # Where batches come from: the sampler on this model, or the fleet (set in train()).
        # Tool calls (rollout.tools) run in worker processes too; the fleet's workers run
        # their own.
        self.tools = RunnerToolTurns.from_config(cfg.rollout.tools, self.tokenizer) \
            if cfg.rollout.tools.tools and cfg.runtime.mode == "sync" else None
        self.curriculum = make_curriculum(cfg.rollout.curriculum, self.task,
                                          ema=cfg.rollout.curriculum_ema, seed=cfg.train.seed)
        self.rollouts: RolloutSource = InProcessRollouts(
            self.model, self.tokenizer, self.task, cfg, self.pool,
            dynamic_sampling=self.objective.dynamic_sampling,
            compute=compute_context(self.device, self.compute_dtype), tools=self.tools,
            curriculum=self.curriculum)
        self.fleet: FleetRollouts | None = None  # runtime.mode async / inflight, in train()
        self.step = 0
        self.last_eval: dict[str, float] = {}
        self.teacher_eval: float | None = None  # the teacher's held-out pass@1, once
        self.saved_fleet: dict[str, Any] | None = None  # the fleet's, from a checkpoint
        self.fleet_resume: FleetResume | None = None
        self.start_step = 0
        # What the run skeleton (runtime/run.py) drives: the guard's undo, and this session's
        # reward per step, warnings and zero-reward run (for the summary).
        self.rewards: list[float] = []
        self.warned: set[str] = set()
        self.zero_reward = ZeroRewardWatch(cfg.health.zero_reward_steps)
        # config.yaml shows the objective as it runs: the preset's values filled in.
        resolved = cfg.model_copy(update={
            "loss": LossConfig(**asdict(self.objective)),
            "train": cfg.train.model_copy(update={"compute_dtype": self.compute_dtype})})
        if resume:
            self._restore()
            rundir.check_resume_config(self.run_dir, resolved, done=self.step,
                                       length_key="train.steps", free_fields=RESUME_FREE_FIELDS,
                                       allow_change=allow_config_change)
        dump_config(resolved, self.run_dir / "config.yaml")

    def _load_policy(self, cfg: RLVRConfig) -> None:
        """The trained model and tokenizer, on the run's device, with its compute dtype
        resolved, activation checkpointing and LoRA as the config asks."""
        self.model, self.tokenizer = load_model(cfg.model.path, cfg.model.dtype)
        self.model.to(self.device)
        # `auto` times this model's own passes in both precisions (before LoRA and
        # checkpointing change what a pass costs; cached per machine and model shape).
        self.precision = resolve_compute_dtype(cfg.train.compute_dtype, self.device,
                                               precision_workload(self.model))
        self.compute_dtype = self.precision.name
        print(self.precision.describe())
        if cfg.train.gradient_checkpointing:  # in train mode only: sampling keeps its cache
            enable_activation_checkpointing(self.model)
        if cfg.model.lora is not None:
            self.model = lora.apply_lora(self.model, cfg.model.lora, cfg.train.seed)

    # -- checkpoints ---------------------------------------------------------------------
    def _restore(self) -> None:
        # The newest checkpoint that verifies and loads; a torn one falls back to the one before.
        found = ckpt.load_latest_usable(self.run_dir, self._load_checkpoint)
        if found is None:
            return  # nothing saved yet: --resume on a fresh directory starts from step 0
        self.start_step = self.step
        if self.saved_fleet is not None:
            # What the killed run had in flight after its checkpoint is gone: count it (at
            # least: admissions after its last logged step are unknown) and never reuse ids.
            logged = max([0] + [r.get("fleet/groups_admitted", 0)
                                for r in read_metrics(self.run_dir)])
            self.fleet_resume = fleet_resume(self.saved_fleet, logged,
                                             self.step * self.cfg.rollout.prompts_per_step)

    def _load_checkpoint(self, path: Path) -> None:
        state = torch.load(path / "trainer_state.pt", weights_only=False)
        if lora.is_lora(self.model):
            lora.load_adapter(self.model, path)
        else:
            model, _ = load_model(path, self.cfg.model.dtype)
            self.model.load_state_dict(model.state_dict())
        if self.sharded:  # loaded when the group has started (train())
            self.pending_learner_state = (path, state)
            self.trainer.version = state["version"]
        else:
            self.learner.load(path, state, self.cfg.train.lr, self.cfg.train.weight_decay)
        self.step = state["step"]
        if self.curriculum is not None and state.get("curriculum") is not None:
            self.curriculum.load(state["curriculum"])
        self.last_eval = state.get("last_eval", {})
        self.saved_fleet = state.get("fleet")
        ckpt.set_rng_state(state["rng"])

    def save_checkpoint(self) -> Path:
        path = ckpt.checkpoint_path(self.run_dir, self.step)
        with ckpt.atomic_dir(path) as tmp:
            lora.save_weights(self.model, self.tokenizer, tmp)
            torch.save({**self.learner.save(tmp), "step": self.step,
                        "last_eval": self.last_eval, "rng": ckpt.rng_state(),
                        "fleet": self.rollouts.checkpoint_state(),
                        "curriculum": None if self.curriculum is None else self.curriculum.state()},
                       tmp / "trainer_state.pt")
        ckpt.prune_checkpoints(self.run_dir, self.cfg.checkpoint.keep)
        return path

    # -- one step ------------------------------------------------------------------------
    def train_step(self) -> StepRecord:
        cfg, size = self.cfg, self.cfg.rollout.group_size
        t0 = time.perf_counter()
        group, metrics = self.rollouts.next_batch(self.step, self.learner.version)
        t_collect = time.perf_counter() - t0
        rewards, length_stats = shaped_rewards(group, self.objective, cfg, self.step)
        advantages = ADVANTAGE_ESTIMATORS[self.objective.advantage_estimator](rewards, size)
        r = group.rollout
        batch = build_policy_batch(r.prompt_ids, r.completion_ids, r.mask, advantages,
                                   r.sampler_logprobs, self.tokenizer.pad_token_id,
                                   r.policy_version, r.versions(), r.tool_mask)
        self._score_teacher(batch, metrics)
        token_versions = r.versions()[r.sampled_mask() > 0]
        token_lags = self.learner.version - token_versions
        lag_stats = staleness(self.learner.version, token_versions.tolist())
        t1 = time.perf_counter()
        update = self.learner.step(batch, step_seed(cfg.train.seed, self.step, "shuffle"))
        metrics.update(update.metrics)
        metrics["time/update_s"] = time.perf_counter() - t1
        if cfg.train.post_update_stats and (self.step + 1) % cfg.train.post_update_stats_every == 0:
            t2 = time.perf_counter()
            metrics.update(self.learner.update_stats(batch, update))
            metrics["time/post_update_stats_s"] = time.perf_counter() - t2
        t_train = time.perf_counter() - t1
        metrics.update(peak_memory_gib(self.device))
        metrics.update(self.precision.metrics())  # what chose the precision (auto)
        per_group = group.rewards.view(-1, size)
        tokens = int(r.lengths.sum())
        metrics.update({
            "reward/mean": float(group.rewards.mean()),
            "reward/std": float(group.rewards.std()) if len(group.rewards) > 1 else 0.0,
            "reward/shaped_mean": float(rewards.mean()),
            "reward/zero_advantage_group_share": float(
                (per_group.max(1).values == per_group.min(1).values).float().mean()),
            "reward/verifier_errors": group.verifier_errors,
            "reward/verifier_timeouts": group.verifier_timeouts,
            "reward/verifier_crashes": group.verifier_crashes,
            "length/mean": float(r.lengths.float().mean()),
            "length/max": int(r.lengths.max()),
            "length/truncated_share": r.finish_reasons.count("length") / len(r.finish_reasons),
            "time/collect_s": t_collect, "time/train_s": t_train,
            "time/score_s": group.score_seconds,  # within collect_s (sync); off the path (fleets)
            "time/step_s": time.perf_counter() - t0,
            # generation speed: of this step's sampling, or of the fleet since the last step
            "throughput/tokens_per_s": metrics.get("fleet/generated_tokens_per_s",
                                                   tokens / max(t_collect, 1e-9)),
            **lag_stats, **length_stats,
            **{f"reward/{name}": float(values.mean()) for name, values in group.reward_terms.items()},
        })
        # What the completions did: right vs wrong length, the task's behaviour counters.
        right = (group.rewards > 0.5).tolist()
        metrics.update(length_by_outcome(r.lengths.tolist(), right))
        rows = [ex for ex in group.examples for _ in range(size)]
        metrics.update(behaviour_means(self.task, group.texts, rows))
        if self.cfg.rollout.tools.tools:  # where the calls went
            calls = r.tool_calls().tolist()
            metrics["tools/calls_per_rollout"] = sum(calls) / len(calls)
            metrics.update(mean_by_difficulty(self.task, rows, calls, "tool_calls"))
        if group.first_error:
            metrics["reward/first_error"] = group.first_error
        return StepRecord(metrics, token_lags)

    def _score_teacher(self, batch, metrics: dict[str, float]) -> None:
        """With a teacher: its log-probs of every sampled token, into the batch (the trainer
        turns them into per-token advantages against pi_old, advantages.teacher_advantages)."""
        if self.teacher is None:
            return
        t0 = time.perf_counter()
        batch.teacher_logprobs = self.trainer.score_logprobs(self.teacher, batch)
        metrics["opd/teacher_logp_mean"] = float(
            masked_mean(batch.teacher_logprobs, batch.mask))
        metrics["time/teacher_s"] = time.perf_counter() - t0

    def _evaluate(self, model) -> dict[str, float]:
        e = self.cfg.eval
        result = evaluate(model, self.tokenizer, self.task, split="test", seed=e.seed,
                          prompts=e.prompts, samples=e.samples, ks=(1,),
                          max_new_tokens=self.cfg.rollout.max_new_tokens,
                          temperature=e.temperature, chat_template=self.cfg.model.chat_template,
                          system_prompt=self.cfg.model.system_prompt, tools=self.tools,
                          compute_dtype=e.compute_dtype)
        out = {"eval/pass@1": result.pass_at[1], "eval/mean_length": result.mean_length}
        if "tools/calls_per_rollout" in result.details:
            out["eval/tool_calls_per_rollout"] = result.details["tools/calls_per_rollout"]
        return out

    def run_eval(self) -> dict[str, float]:
        self.last_eval = self._evaluate(self.model)
        if self.teacher is not None:  # the teacher does not change: measured once per run
            if self.teacher_eval is None:
                self.teacher_eval = self._evaluate(self.teacher)["eval/pass@1"]
            self.last_eval["eval/teacher_pass@1"] = self.teacher_eval
        return self.last_eval

    def train(self) -> Path:
        try:
            if not self.sharded:
                return self._train_with_rollouts()
            with learner_session(self.cfg):
                self.learner = start_learner_group(self.cfg, self.model, self.learner_spec)
                try:
                    if self.pending_learner_state is not None:
                        path, state = self.pending_learner_state
                        self.learner.load(path, state, self.cfg.train.lr,
                                          self.cfg.train.weight_decay)
                    return self._train_with_rollouts()
                finally:
                    self.learner.close()
        finally:
            self.pool.close()
            if self.tools is not None:
                self.tools.close()
            self.lock.release()

    def _train_with_rollouts(self) -> Path:
        if self.cfg.runtime.mode == "sync":
            return self._train()
        with fleet_session(self.cfg):
            self.fleet = FleetRollouts(self.cfg, self.task, self.tokenizer, self.pool,
                                       start_version=self.learner.version,
                                       resumed=self.fleet_resume,
                                       dynamic_sampling=self.objective.dynamic_sampling,
                                       curriculum=self.curriculum)
            self.rollouts = self.fleet
            try:
                self.fleet.start(self.model.state_dict(), self.learner.version)
                return self._train()
            finally:
                self.fleet.close()

    def _train(self) -> Path:
        cfg = self.cfg
        final = self.run_dir / "final"
        if self.start_step >= cfg.train.steps and (final / "config.json").is_file():
            print(f"the run in {self.run_dir} is already at step {self.step}; nothing to do")
            return final
        if self.start_step:  # a run of zero-reward steps goes on across a resume
            for row in read_metrics(self.run_dir):
                if row.get("step", 0) <= self.step:
                    self.zero_reward.observe(row["step"], all_zero_reward(row))
        resume_step = self.step if self.start_step else None
        logger = MetricsLogger(self.run_dir, tensorboard=cfg.tensorboard, resume_step=resume_step,
                               trackers=open_trackers(cfg.logging, self.run_dir,
                                                      config_to_dict(cfg), resume_step))
        progress = StepProgress(cfg.train.steps, f"{cfg.objective} {cfg.task.name}",
                                enabled=cfg.progress, completed=self.step,
                                fields=("reward", "pass@1", "entropy", "kl", "tok/s"))
        try:
            outcome = drive(self, Schedule(cfg.train.steps, cfg.health, self.run_dir), logger,
                            progress, Heartbeat("rlvr", enabled=False))
        finally:
            progress.close()
            logger.close()
        with ckpt.atomic_dir(final) as tmp:
            lora.save_trained(self.model, self.tokenizer, tmp, self.cfg.model.lora)
        self._print_summary(self.rewards, outcome.skipped, self.zero_reward)
        return final

    # -- the run skeleton's hooks (runtime/run.py) ---------------------------------------
    @property
    def done(self) -> int:
        return self.step

    @property
    def undo(self):
        """The guard's undo of a step: the trainer's state, or every rank's."""
        return self.learner.undo

    @property
    def checkpoint_every(self) -> int:
        return self.cfg.checkpoint.every

    @property
    def max_minutes(self) -> None:
        return None

    def begin_step(self) -> None:
        return None

    def learn(self, beat) -> StepRecord:
        return self.train_step()

    def nonfinite(self, record: StepRecord) -> list[str]:
        bad = non_finite_keys(record.metrics, GUARDED_METRICS)
        return bad if parameters_finite(self.model.parameters()) else [*bad, "weights"]

    def finish(self, record: StepRecord, undone: bool, publish: bool = True) -> dict[str, Any]:
        self.step += 1
        if publish:  # the weights as they stand after the guard (in-process: nothing to send)
            self.rollouts.publish(self.model.state_dict(), self.learner.version)
        return record.metrics

    def after_step(self, metrics: dict[str, Any]) -> None:
        """The held-out eval when due; a verifier's first error of each kind, and a run of
        zero-reward steps, as warnings."""
        if self.cfg.eval.every and self.step % self.cfg.eval.every == 0:
            metrics.update(self.run_eval())
        error = metrics.pop("reward/first_error", None)
        if error and error not in self.warned:
            self.warned.add(error)
            print(f"warning: step {self.step}: {error} (scored 0, training goes on)")
        self.rewards.append(metrics["reward/mean"])
        warning = self.zero_reward.observe(self.step, all_zero_reward(metrics))
        if warning:
            print(f"warning: {warning}", file=sys.stderr, flush=True)

    def histograms(self, record: StepRecord) -> dict[str, torch.Tensor]:
        return {"staleness/token_lag": record.token_lags} if len(record.token_lags) else {}

    def progress_fields(self, metrics: dict[str, Any]) -> dict[str, Any]:
        return {"reward": metrics["reward/mean"], "pass@1": self.last_eval.get("eval/pass@1"),
                "entropy": metrics["policy/entropy"], "kl": metrics.get("policy/kl_new_old"),
                "tok/s": metrics["throughput/tokens_per_s"]}

    def save_snapshot(self) -> None:
        return None

    def _print_summary(self, rewards: list[float], skipped: int,
                       zero_reward: ZeroRewardWatch) -> None:
        """One line at the end of a run: what it did and, loudly, what went wrong."""
        parts = [f"{len(rewards)} steps (to step {self.step}) in {self.run_dir}"]
        if rewards:
            parts.append(f"mean reward {sum(rewards) / len(rewards):.3f} "
                         f"(last step {rewards[-1]:.3f})")
        if "eval/pass@1" in self.last_eval:
            parts.append(f"last eval pass@1 {self.last_eval['eval/pass@1']:.3f}")
        if skipped:
            parts.append(f"{skipped} non-finite steps skipped")
        problem = zero_reward.summary()
        if problem is None:
            print("run summary: " + "; ".join(parts), flush=True)
        else:
            print("warning: run summary: " + "; ".join([*parts, problem]), file=sys.stderr,
                  flush=True)


def fleet_session(cfg: RLVRConfig):
    """The Ray session a fleets run (`runtime.mode` not sync) or a learner group trains in:
    joins one that is already open (an experiment's arms share one), else starts and ends
    its own, offering the cores or as many CPUs as the fleet and the ranks ask for."""
    p = cfg.placement
    asked = cfg.runtime.inference_workers * p.inference.cpus if cfg.runtime.mode != "sync" else 0
    if cfg.train.learner_processes > 1 and not launched_by_torchrun():
        asked += cfg.train.learner_processes * p.learner.cpus
    return ray_session(cfg.runtime.address, connect_timeout_s=cfg.runtime.connect_timeout_s,
                       num_cpus=max(os.cpu_count() or 1, math.ceil(asked)))


def learner_session(cfg: RLVRConfig):
    """The session a learner group starts in: Ray's (a fleet's joins it), or none when
    torchrun started the ranks."""
    if launched_by_torchrun():
        return contextlib.nullcontext()
    return fleet_session(cfg)


def train(cfg: RLVRConfig, *, resume: bool = False, overwrite: bool = False,
          allow_config_change: bool = False, resume_needs_run: bool = False) -> Path:
    """Train `cfg`; with `resume`, continue the run in its run_dir, or start it there when
    the folder holds none (unless `resume_needs_run`)."""
    return RLVRRun(cfg, resume=resume, overwrite=overwrite,
                   allow_config_change=allow_config_change,
                   resume_needs_run=resume_needs_run).train()
