"""The typed configs of `rlscale rlvr train`, `rlscale sft` and `rlscale rlvr eval`, read top
to bottom.

Every field is documented here; docs/config.md is generated from these configs
(`make docs-config`, rlscale/config_docs.py). Unknown or ill-typed fields are errors (see
rlscale.config).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import pydantic
from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from ..config import (
    COMPUTE_DTYPE_HELP,
    DEVICE_HELP,
    MAX_LR,
    ComputeDtypeName,
    ConfigError,
    Device,
    LoggingConfig,
    M,
    NonFiniteGuardConfig,
    StrictModel,
    load_config,
    read_yaml,
)
from ..runtime.placement import PlacementConfig
from .objectives import PRESETS, Objective
from .tools import ToolsConfig


class LoraSettings(StrictModel):
    """`model.lora`: train low-rank adapters (peft) instead of every weight."""

    r: int = Field(8, ge=1, description="the adapters' rank")
    alpha: float = Field(16.0, gt=0, description="scale alpha / r")
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: str | list[str] = Field(
        "all-linear", description="module names to adapt, or all-linear (every linear layer "
        "but the output layer)")
    save: Literal["merged", "adapter"] = Field(
        "merged", description="the final model: merged into the base weights (a plain model "
        "folder) or the adapter folder alone")


class ModelConfig(StrictModel):
    path: str = Field(description="local Hugging Face model folder (config.json, weights, tokenizer)")
    dtype: Literal["float32", "bfloat16"] = "float32"
    lora: LoraSettings | None = Field(None, description="train LoRA adapters (needs rlscale[lora])")
    chat_template: bool = Field(False, description="wrap prompts in the tokenizer's chat template")
    system_prompt: str | None = Field(
        None, description="a system message before every prompt (chat); plain models: a prefix line")


class TeacherConfig(StrictModel):
    """The teacher of on-policy distillation (`objective: opd`) and of SFT on teacher samples
    (`rlscale sft data.source=teacher`): a local model with the student's tokenizer."""

    path: str = Field(description="local Hugging Face causal LM folder, same tokenizer as the student")
    dtype: Literal["float32", "bfloat16"] = "float32"


class RewardTermConfig(StrictModel):
    fn: str = Field(description="verifier (the task's own), format (the answer in the task's "
                    "tags), or package.module:function called as (completion, example) -> float")
    weight: float = 1.0
    name: str | None = Field(None, description="logged as reward/<name>; default from fn")


class TaskConfig(StrictModel):
    name: str = Field("arithmetic", description="arithmetic, countdown, reasoning_gym:<dataset>, "
                      "jsonl:<path>, parquet:<path> or hf:<folder> (docs/tasks.md)")
    options: dict[str, Any] = Field(default_factory=dict, description="task constructor options")
    reward: str | None = Field(
        None, description="the training reward, one function: package.module:function (or "
        "verifier / format); default: the task's verifier")
    rewards: list[RewardTermConfig] = Field(
        default_factory=list, description="the training reward as a weighted sum of terms")
    verifier_timeout_s: float = Field(2.0, gt=0, description="a slower verifier scores 0")
    verifier_workers: int = Field(
        1, ge=1, description="verifier worker processes; each uses a core while it scores")
    # = rlscale.runtime.workpool.DEFAULT_MEMORY_MB (a test keeps them equal): a ready worker
    # holds ~100 MB of address space, ~720 MB if its verifier imports torch.
    verifier_memory_mb: int = Field(
        2048, ge=128, description="address-space limit of each verifier worker; an allocation "
        "past it raises MemoryError in the verifier (scored 0, counted as an error)")

    @model_validator(mode="after")
    def _one_reward_spec(self) -> TaskConfig:
        if self.reward is not None and self.rewards:
            raise ValueError("give task.reward or task.rewards, not both")
        return self


class RolloutConfig(StrictModel):
    prompts_per_step: int = Field(32, ge=1)
    group_size: int = Field(8, ge=1, description="completions per prompt (G); 1 only with a "
                            "learned critic (objective ppo): a group of one has no baseline")
    max_new_tokens: int = Field(8, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_extra_draws: int = Field(
        4, ge=0, description="dynamic sampling: extra prompt batches drawn per step at most")
    curriculum: Literal["uniform", "learnability"] = Field(
        "uniform", description="which prompts a step draws: uniform (the task's sampler) or "
        "learnability (difficulty levels weighted by p(1-p) of their running group success "
        "rate; a task with difficulty levels; the fleets fold every P finished groups in "
        "as one step): rlvr/curriculum.py")
    curriculum_ema: float = Field(
        0.3, gt=0, le=1, description="curriculum learnability: the newest step's weight in "
        "each level's running success rate")
    # The inference engine of the asynchronous fleets (runtime.mode async / inflight).
    engine: Literal["native", "vllm"] = Field(
        "native", description="native: rlscale's continuous-batching engine; vllm: vLLM")
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="the engine's dtype (a bf16 engine beside an fp32 trainer)")
    slots: int = Field(64, ge=1, description="concurrent requests per inference worker")
    vllm_enforce_eager: bool | None = Field(
        None, description="engine vllm: true = no torch.compile (start in seconds, decode "
        "slower), false = compile (15-45 s more start-up on 2 CPU cores, then faster); null = "
        "decide by the run's length (eager below 300 k tokens per worker)")
    recompute_cache_on_update: bool = Field(
        True, description="in-flight update: recompute running rows' KV cache with new weights")
    static_decode: bool = Field(
        False, description="the in-process sampler's decode step at static shapes per batch "
        "bucket: a CUDA graph per bucket on a GPU (off until a GPU check measures it), eager "
        "on a CPU (slower there: docs/performance.md)")
    eos_check_every: int | None = Field(
        None, ge=1, description="token steps between the sampler's checks for finished rows "
        "(a host sync on a GPU); null: 1 on a CPU, 8 on a GPU")
    tools: ToolsConfig = Field(
        default_factory=ToolsConfig, description="tools the policy may call while it "
        "generates (none by default): docs/tools.md")


# Descriptions of `loss.*` keys beyond config_docs.NOTES (the doc's wording for the others).
LOSS_HELP = {
    "norm_length": "None: rollout.max_new_tokens",
    "kl_coef": "beta, KL to the frozen reference",
    "reward_weight": "weight of the verifier's advantage (opd: 0; > 0 mixes it in)",
    "teacher_weight": "weight of the teacher's per-token advantage (needs teacher.path)",
    "critic": "PPO: per-token advantages by GAE from a learned value model (objective ppo)",
    "gae_gamma": "GAE's discount (with loss.critic); 1: the terminal reward reaches every token",
    "gae_lambda": "GAE's lambda (with loss.critic); 1: A_t = R - V(s_t) under a terminal reward",
    "value_clip": "the critic's value clipping range around its values before the step (0: off)",
    "critic_lr": "the critic's learning rate (null: train.lr)",
    "whiten_advantages": "standardise the critic's advantages over the batch's tokens",
    "length_penalty_start": "the training step from which the length penalties apply",
}


def _loss_field(spec: dataclasses.Field, kind: Any) -> tuple[Any, Any]:
    """`loss.<name>`: the `Objective` field's type (a name field: its registry's keys, in
    registration order) or None, with the field's bounds."""
    choices = spec.metadata.get("choices")
    if choices is not None:
        kind = Literal[tuple(choices)]
    return (kind | None, Field(None, description=LOSS_HELP.get(spec.name),
                               **spec.metadata.get("bounds", {})))


def _loss_config() -> type[StrictModel]:
    kinds = typing.get_type_hints(Objective)
    specs = dataclasses.fields(Objective)
    unknown = set(LOSS_HELP) - {spec.name for spec in specs}
    if unknown:
        raise TypeError(f"LOSS_HELP names no Objective field: {sorted(unknown)}")
    return pydantic.create_model(
        "LossConfig", __base__=StrictModel, __module__=__name__,
        __doc__="""The objective: a preset (rlscale.rlvr.objectives.PRESETS, each an `Objective`) and
    overrides of its fields: one key here per field there, built from that record (its
    fields, their registries' names and their bounds).

    A field left at None takes the preset's value; config.yaml of a run shows them resolved.
    """,
        **{spec.name: _loss_field(spec, kinds[spec.name]) for spec in specs})


LossConfig = _loss_config()


class TrainConfig(StrictModel):
    steps: int = Field(100, ge=1)
    lr: float = Field(1e-4, gt=0, le=MAX_LR)
    warmup_steps: int = Field(0, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    minibatches: int = Field(1, ge=1, description="optimiser updates per step per epoch")
    epochs: int = Field(1, ge=1, description="passes over each collected batch")
    micro_batch_size: int = Field(0, ge=0, description="memory limit only; 0 = whole minibatch")
    micro_batch_tokens: int = Field(
        0, ge=0, description="memory limit by tokens: a micro-batch holds at most this many "
        "prompt + completion tokens (a longer sequence alone); 0 = by micro_batch_size only")
    pack: bool = Field(
        True, description="pack several sequences per row (no padding) in the update's forward; "
        "false: one padded row per sequence")
    compute_dtype: ComputeDtypeName = Field(
        "auto", description=f"the matmuls of sampling and the update: {COMPUTE_DTYPE_HELP}")
    gradient_checkpointing: bool = Field(
        False, description="recompute activations in the backward pass: less memory, ~1/3 more compute")
    seed: int = 0
    threads: int = Field(0, ge=0, description="torch CPU threads; 0 = all cores")
    compile: bool = Field(
        False, description="torch.compile the update's forward and backward (the decoder, "
        "dynamic shapes; needs a C++ compiler on CPU): 1.15-1.20x per update measured on 2 "
        "CPU cores after about a minute of compiling, so it pays on runs of several hundred "
        "steps (docs/performance.md)")
    post_update_stats: bool = Field(
        True, description="an extra forward after a step: KL(new||old), where the update landed")
    post_update_stats_every: int = Field(
        10, ge=1, description="the post-update statistics on every N-th step (they cost a forward)")
    learner_processes: int = Field(
        1, ge=1, description="learner processes (ranks) training one model sharded over them "
        "(FSDP2: gloo on CPU, NCCL on GPU), started as a Ray placement group of "
        "placement.learner bundles, or by torchrun (docs/scale.md); each computes its share of "
        "every minibatch and the math equals one process's")
    reference_kl: bool = Field(
        True, description="with post_update_stats: also KL(pi_old || reference) per token on "
        "the step's samples (kl/reference), even when loss.kl_coef is 0; at kl_coef 0 this keeps "
        "a frozen copy of the starting model (with LoRA: the adapters off, no copy)")


class HeldOutEvalConfig(StrictModel):
    """What a held-out pass@k evaluation samples: the keys of `rlscale rlvr eval`'s `eval`
    section, and of a training run's `eval:` section (TrainEvalConfig) with its own defaults."""

    prompts: int = Field(500, ge=1, description="held-out prompts to evaluate")
    samples: int = Field(0, ge=0, description="samples per prompt (n); 0: the largest k")
    temperature: float = Field(
        1.0, ge=0, description="sampling temperature; 0: greedy (argmax) decoding, one sample "
        "per prompt")
    seed: int = Field(0, description="the evaluation's prompt and sampling seed")
    compute_dtype: Literal["float32", "bfloat16", "auto"] = Field(
        "float32", description="generation precision: float32, bfloat16 (autocast, fp32 "
        "weights) or auto (bfloat16 where this machine multiplies it faster; "
        "train.compute_dtype's rule)")


class TrainEvalConfig(HeldOutEvalConfig):
    """`eval`: a training run's held-out pass@1 on the test split, sampled (at least one sample
    per prompt, a temperature above 0) at the run's own rollout.max_new_tokens."""

    prompts: int = Field(200, ge=1, description="held-out prompts per evaluation")
    samples: int = Field(1, ge=1, description="samples per prompt (pass@1 is their mean)")
    temperature: float = Field(1.0, gt=0, description="sampling temperature of the evaluation")
    every: int = Field(0, ge=0, description="held-out eval every N steps; 0 = never during training")


class CheckpointConfig(StrictModel):
    every: int = Field(25, ge=0, description="checkpoint every N steps; 0 = only final")
    keep: int = Field(2, ge=1)


class SFTCheckpointConfig(CheckpointConfig):
    """SFT steps are ~100x cheaper than GRPO's: a checkpoint every 250 of them."""

    every: int = Field(250, ge=0, description="a resumable checkpoint every N steps; 0 = none "
                       "(a killed run starts over)")


class HealthConfig(NonFiniteGuardConfig):
    """The non-finite guard (the same keys as `zero train`'s) and the watch for a run that
    learns nothing."""

    zero_reward_steps: int = Field(
        20, ge=0, description="steps in a row on which every sample's reward was 0 that make "
        "the run warn (once, and again in its end summary): it is learning nothing; 0: never")


# Fields a `--resume` may change without --allow-config-change: they change speed or logging,
# never the math of a step (train.steps may only grow; the loop checks that). The compute
# dtype changes rounding only (fp32 master weights either way), and `auto` may decide
# otherwise on the machine a run resumes on.
RESUME_FREE_FIELDS = ("run_dir", "device", "train.steps", "train.threads", "train.compute_dtype",
                      "train.post_update_stats",
                      "train.post_update_stats_every", "train.reference_kl",
                      "train.learner_processes",
                      "train.micro_batch_size",
                      "train.micro_batch_tokens", "train.pack", "train.gradient_checkpointing",
                      "train.compile",
                      "eval.*", "checkpoint.*", "health.*", "tensorboard", "progress", "logging.*",
                      "runtime.address", "runtime.connect_timeout_s", "runtime.worker_threads",
                      "placement.*")


class RuntimeConfig(StrictModel):
    """Where the rollouts come from. `sync`: the trainer's own model samples each step's
    batch, then trains on it (no overlap, exactly on-policy). `async`: inference workers
    (Ray actors) generate ahead of the trainer by at most `max_staleness` versions and take
    new weights when their slots have drained. `inflight`: the same, but workers take new
    weights between any two decode steps, so one completion may span several versions."""

    mode: Literal["sync", "async", "inflight"] = "sync"
    inference_workers: int = Field(2, ge=1, description="Ray actors, each with an engine")
    max_staleness: int = Field(
        1, ge=0, description="no token trained on is more than k versions older than the weights")
    address: str | None = Field(
        None, description="a Ray cluster to join (host:port or ray://...); None: embedded Ray")
    connect_timeout_s: float = Field(
        30.0, gt=0, description="how long to wait for the cluster at `address` to answer")
    worker_threads: int = Field(1, ge=1, description="torch threads per inference worker")
    call_budget_s: float = Field(
        0.05, gt=0, description="decode time per worker call (how often weights/requests flow)")
    max_worker_restarts: int = Field(10, ge=0)


# Tokens a vLLM worker must generate before torch.compile's start-up pays for itself on this
# project's 2-core machines: the tiny model decodes ~3,200 tokens/s eager and ~4,600 compiled
# (docs/async.md), i.e. compiled saves ~95 us per token; compiling cost 15 s more start-up
# on an AVX-512 machine and ~45 s on another (docs/async.md), so it pays after ~160-470 k
# tokens per worker: the middle of that.
VLLM_COMPILE_PAYS_TOKENS = 300_000

# Keys that only the asynchronous fleets read (runtime.mode async / inflight).
FLEET_ONLY_FIELDS = {"rollout": ("engine", "dtype", "slots", "recompute_cache_on_update",
                                 "vllm_enforce_eager"),
                     "runtime": ("inference_workers", "max_staleness", "address",
                                 "connect_timeout_s", "worker_threads", "call_budget_s",
                                 "max_worker_restarts"),
                     "placement": ("inference",)}


class RLVRConfig(StrictModel):
    run_dir: str = "runs/rlvr"
    device: Device = Field("auto", description=DEVICE_HELP)
    model: ModelConfig
    task: TaskConfig = Field(default_factory=TaskConfig)
    objective: str = Field("grpo", description="a preset name from objectives.PRESETS")
    loss: LossConfig = Field(default_factory=LossConfig)
    teacher: TeacherConfig | None = Field(
        None, description="the teacher of objective opd (or any objective with loss.teacher_weight > 0)")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: TrainEvalConfig = Field(default_factory=TrainEvalConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    placement: PlacementConfig = Field(
        PlacementConfig(), description="what each learner process and inference "
        "worker asks Ray for (CPUs, GPUs, vLLM's tensor parallel size and memory share)")
    health: HealthConfig = Field(default_factory=HealthConfig)
    tensorboard: bool = True
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    progress: bool = True

    @model_validator(mode="after")
    def _lora_in_the_sync_loop(self) -> RLVRConfig:
        """The fleets send LoRA adapters only and the native engine merges them
        (runtime/weight_sync.py); vLLM's adapter path is not built."""
        if (self.model.lora is not None and self.runtime.mode != "sync"
                and self.rollout.engine == "vllm"):
            raise ValueError("model.lora with rollout.engine vllm is not built (the fleets "
                             "send LoRA adapters to the native engine only): use "
                             "rollout.engine native or runtime.mode sync")
        return self

    @model_validator(mode="after")
    def _a_baseline_for_every_completion(self) -> RLVRConfig:
        if (self.rollout.group_size == 1 and self.objective in PRESETS
                and not self.resolved_objective().critic):
            raise ValueError(f"rollout.group_size 1 leaves objective '{self.objective}' no "
                             "baseline (every advantage 0): use group_size >= 2, or a learned "
                             "critic (objective ppo)")
        return self

    @model_validator(mode="after")
    def _what_a_learner_group_trains(self) -> RLVRConfig:
        """What the sharded learner (train.learner_processes > 1) is not built for, by name."""
        if self.train.learner_processes == 1:
            return self
        unbuilt = [name for name, asked in (
            ("model.lora", self.model.lora is not None),
            ("train.compile", self.train.compile),
            ("a teacher (objective opd / loss.teacher_weight)", self.teacher is not None))
            if asked]
        if unbuilt:
            raise ValueError(f"train.learner_processes > 1 with {', '.join(unbuilt)} is not "
                             "built; use train.learner_processes: 1")
        return self

    @model_validator(mode="after")
    def _known_objective(self) -> RLVRConfig:
        if self.objective not in PRESETS:
            raise ValueError(f"unknown objective '{self.objective}' (known: {', '.join(PRESETS)})")
        uses_teacher = self.resolved_objective().uses_teacher
        if uses_teacher and self.teacher is None:
            raise ValueError(f"objective '{self.objective}' distils from a teacher: set teacher.path")
        if self.teacher is not None and not uses_teacher:
            raise ValueError(f"teacher.path is set but objective '{self.objective}' does not use "
                             "a teacher (use objective opd, or loss.teacher_weight > 0)")
        return self

    def inert_fleet_fields(self) -> list[str]:
        """Keys set away from their defaults that only the asynchronous fleets read, when
        this run is synchronous (they would do nothing: a warning names them)."""
        if self.runtime.mode != "sync":
            return []
        inert = []
        for section, names in FLEET_ONLY_FIELDS.items():
            part = getattr(self, section)
            for name in names:
                if getattr(part, name) != type(part).model_fields[name].default:
                    inert.append(f"{section}.{name}={getattr(part, name)}")
        return inert

    def vllm_eager(self) -> bool:
        """rollout.vllm_enforce_eager, or by the run's length when unset: eager when a
        worker's share of the run's tokens (at most max_new_tokens each) is too small for
        compilation to pay (VLLM_COMPILE_PAYS_TOKENS)."""
        if self.rollout.vllm_enforce_eager is not None:
            return self.rollout.vllm_enforce_eager
        r = self.rollout
        tokens = self.train.steps * r.prompts_per_step * r.group_size * r.max_new_tokens
        return tokens / self.runtime.inference_workers < VLLM_COMPILE_PAYS_TOKENS

    def resolved_objective(self) -> Objective:
        """The preset with this config's `loss.*` overrides; `norm_length` None becomes
        `rollout.max_new_tokens`."""
        objective = replace(PRESETS[self.objective], **self.loss.model_dump(exclude_none=True))
        if objective.norm_length is None:
            objective = replace(objective, norm_length=self.rollout.max_new_tokens)
        if objective.critic_lr is None:
            objective = replace(objective, critic_lr=self.train.lr)
        return objective


class SFTDataConfig(StrictModel):
    source: Literal["task", "teacher"] = Field(
        "task", description="task: the task's demonstrations; teacher: one completion sampled "
        "from teacher.path per prompt (SFT on teacher samples, off-policy distillation)")
    examples: int = Field(20000, ge=1, description="demonstrations drawn from the train split")
    wrong_share: float = Field(0.0, ge=0, le=1, description="share of demonstrations corrupted")
    answer_only: bool = Field(
        False, description="the answer alone as the demonstration (the task's "
        "direct_demonstration: no reasoning trace), the baseline a trace task is measured against")
    documents: dict[str, float] = Field(
        default_factory=dict, description="shares of data.examples that are stand-alone "
        "documents of the task's kinds instead of demonstrations (long_arithmetic: facts, "
        "primers; docs/emergence.md), trained on every token after BOS: a pretraining corpus "
        "with the skills of a solution and no solution")
    max_new_tokens: int = Field(8, ge=1, description="source teacher: the sampling budget")
    temperature: float = Field(1.0, gt=0, description="source teacher: the sampling temperature")
    seed: int = 0


class SFTConfig(StrictModel):
    """`rlscale sft`: supervised fine-tuning on task demonstrations (completion tokens only)."""

    out: str = "runs/sft/model"
    run_dir: str = "runs/sft"
    device: Device = Field("auto", description=DEVICE_HELP)
    model: ModelConfig | None = None
    init_preset: str | None = Field(
        None, description="start from a freshly built preset (e.g. tiny) instead of model.path")
    task: TaskConfig = Field(default_factory=TaskConfig)
    data: SFTDataConfig = Field(default_factory=SFTDataConfig)
    teacher: TeacherConfig | None = Field(None, description="the teacher of data.source=teacher")
    loss: Literal["sft", "dft"] = Field(
        "sft", description="sft: -log pi(y*_t) per token; dft: -sg(p) * log pi(y*_t), Dynamic "
        "Fine-Tuning (Wu et al. 2025); see docs/objectives.md")
    dft_weight: Literal["token", "sequence"] = Field(
        "token", description="dft's p: the token's probability pi(y*_t | ...) or the whole "
        "target's pi(y* | x)")
    steps: int = Field(1000, ge=1)
    batch_size: int = Field(128, ge=1)
    pack: bool = Field(
        False, description="pack several demonstrations per row (no padding): for traces of "
        "very different lengths; off keeps the arithmetic quickstart's base bit-exact")
    # float32 by default: the arithmetic quickstart's SFT is chaotic in float rounding and its
    # documented base model is the fp32 one (see distill.target_logprobs).
    compute_dtype: ComputeDtypeName = Field(
        "float32", description=f"the matmuls of the SFT forward and backward: {COMPUTE_DTYPE_HELP}")
    lr: float = Field(3e-3, gt=0, le=MAX_LR)
    warmup_steps: int = Field(50, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    save_every: int = Field(
        0, ge=0, description="also save the model every N steps as run_dir/checkpoints/step_N "
        "(all kept; e.g. to measure along the way); 0: only `out`")
    checkpoint: SFTCheckpointConfig = Field(
        default_factory=SFTCheckpointConfig,
        description="resumable checkpoints (`rlscale sft --resume`): the model, optimiser, "
        "schedule and data order every `every` steps in run_dir/checkpoints, the newest `keep` "
        "kept besides the save_every snapshots; every 0: none (a killed run starts over)")
    seed: int = 0
    threads: int = Field(0, ge=0)
    tensorboard: bool = True
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    progress: bool = True

    @model_validator(mode="after")
    def _one_start(self) -> SFTConfig:
        if (self.model is None) == (self.init_preset is None):
            raise ValueError("give exactly one of model.path or init_preset")
        if (self.data.source == "teacher") != (self.teacher is not None):
            raise ValueError("data.source=teacher and teacher.path go together (give both or neither)")
        if self.data.source == "teacher" and self.data.wrong_share > 0:
            raise ValueError("data.wrong_share corrupts the task's demonstrations; it does not "
                             "apply to data.source=teacher")
        return self


# Fields an `sft --resume` may change without --allow-config-change (speed, logging, length).
SFT_RESUME_FREE_FIELDS = ("run_dir", "device", "steps", "threads", "compute_dtype", "save_every",
                          "checkpoint.*", "tensorboard", "logging.*", "progress")


class EvalConfig(StrictModel):
    """The config of `rlscale rlvr eval`, built from its options; a `key=value` argument
    overrides an option's key (`eval.prompts=50 ks=1,8`)."""

    model: str = Field(
        description="a local HF model folder, or a `rlvr train` run directory: its final/ model, "
        "else its newest checkpoint (and its config.yaml when neither task nor config)")
    task: str | None = Field(None, description="task name, e.g. arithmetic")
    config: str | None = Field(
        None, description="a train config: its task (name, options), prompt format, "
        "max_new_tokens and rollout.tools")
    split: Literal["test", "train", "ood"] = Field(
        "test", description="test (held out by hash), train, or ood (arithmetic: one digit more "
        "than training; countdown: one number more; long_arithmetic: a term with the digit 7, "
        "which no training prompt has)")
    ks: list[int] = Field(
        [1], min_length=1, description="k of pass@k: positive, each at most the samples per "
        "prompt (`ks=1,8` on the command line)")
    max_new_tokens: int | None = Field(
        None, ge=1, description="None: the config's rollout.max_new_tokens, else the task's own "
        "budget (arithmetic 8, countdown 16, long_arithmetic 256; other tasks 8)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling's probability mass")
    chat_template: bool = Field(
        False, description="wrap prompts in the tokenizer's chat template (also when the train "
        "config says so)")
    output: Literal["text", "json"] = Field(
        "text", description="text: a line per k and a summary; json: one JSON object")
    plot: str | None = Field(None, description="also write a pass@k plot here (PNG)")
    eval: HeldOutEvalConfig = Field(default_factory=HeldOutEvalConfig)

    @field_validator("ks", mode="before")
    @classmethod
    def _ks_from_text(cls, value: Any) -> Any:
        # `ks=1,8` on the command line reads as the text "1,8", `ks=8` as one number
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return [value] if isinstance(value, int) else value

    @field_validator("ks")
    @classmethod
    def _distinct_positive_ks(cls, ks: list[int]) -> list[int]:
        if min(ks) < 1:  # a custom error: its message reads without pydantic's "Value error, "
            raise PydanticCustomError("positive_k", "k of pass@k must be positive, got {k}",
                                      {"k": min(ks)})
        return sorted(set(ks))

    @property
    def samples(self) -> int:
        """Samples per prompt: eval.samples, else (0) the largest k."""
        return self.eval.samples or max(self.ks)


# The command that runs each kind of config: a file given to the other command is named as
# what it is, not reported as the other kind's unknown or missing fields.
CONFIG_COMMANDS: dict[type[StrictModel], tuple[str, str]] = {
    RLVRConfig: ("an RL config", "rlscale rlvr train"),
    SFTConfig: ("an SFT config", "rlscale sft"),
}


def config_kind(data: dict[str, Any]) -> type[StrictModel] | None:
    """The one config class (of CONFIG_COMMANDS) whose fields hold every top-level key of
    `data`; None when none does or several do (keys both kinds have, e.g. task)."""
    fits = [kind for kind in CONFIG_COMMANDS if set(data) <= set(kind.model_fields)]
    return fits[0] if len(fits) == 1 else None


def load_command_config(model_cls: type[M], path: str | Path, overrides: list[str]) -> M:
    """`load_config`, where a file that is the other command's config says so in one line."""
    try:
        return load_config(model_cls, path, overrides)
    except ConfigError:
        kind = config_kind(read_yaml(path))
        if kind is not None and kind is not model_cls:
            what, command = CONFIG_COMMANDS[kind]
            raise ConfigError(f"{path} is {what}: run `{command} {path}`") from None
        raise
