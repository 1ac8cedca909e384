"""The asynchronous RLVR fleets: inference workers on Ray and the orchestrator that feeds
the trainer.

Roles (runtime.mode async / inflight):
- `InferenceWorker` (a Ray actor): one engine (continuous batching, or vLLM), driven in
  short calls: take new weights if given, queue new requests, decode for `call_budget_s`,
  hand back what finished.
- `FleetRollouts` (the runtime's `Orchestrator` specialised; its thread runs in the
  trainer's process): admits prompt groups (G requests each, which may land on different
  workers), keeps every worker busy, sends weights, gathers complete groups, scores them in
  the verifier pool and queues them by group id; the trainer takes P groups per step.

Bounded staleness. A group admitted as the j-th live group is meant for training step
floor(j / P). It is admitted only while that step is at most `max_staleness` versions ahead
of the newest published weights, and a request goes to a worker only if the worker's weights
are at most k versions behind the group's step: workers wait rather than run ahead. A group
that still arrives too late (others overtook it) is dropped and counted
(`staleness/dropped_group_share`), so no trained token is ever more than k versions older
than the weights being trained. In `async` mode a worker takes new weights only when its
slots have drained; in `inflight` mode between any two decode steps.

Faults. A worker that dies is restarted and its unfinished requests are re-issued; a
completion is recorded once per request, so no group is lost or trained on twice
(`FleetAccounting`).
"""

from __future__ import annotations

import collections
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ..config import ConfigError
from ..runtime.fleet import ActorDied, import_ray
from ..runtime.orchestrator import Orchestrator
from ..runtime.placement import (
    InferenceResources,
    actor_options,
    create_placement_group,
    ray_bundles,
    release_placement_group,
    worker_device,
)
from ..runtime.weight_sync import (
    LoraMerger,
    WeightLoad,
    WeightPacker,
    WeightPacket,
    unpack_weights,
)
from .config import RLVRConfig
from .curriculum import LearnabilityCurriculum
from .model import PromptFormatter
from .rewards import VerifierPool
from .rollout.groups import RolloutGroup, concat_groups, rollout_from_completions, step_seed
from .rollout.sampler import decode_completions
from .rollout.types import Completion, EngineSampling, GenerationRequest
from .rollout_source import informative_groups
from .tasks import Example, Task
from .tool_turns import RunnerToolTurns
from .tools import ToolsConfig


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs to build its engine (picklable, sent to the actor)."""

    model_path: str
    dtype: str
    engine: str
    sampling: EngineSampling
    slots: int
    threads: int
    recompute_cache_on_update: bool
    seed: int
    vllm_eager: bool = True  # engine vllm: skip torch.compile (RLVRConfig.vllm_eager)
    tools: ToolsConfig | None = None  # rollout.tools, when it lists any
    # placement.inference: the worker's GPUs (its engine runs on them when it has any) and
    # vLLM's tensor parallel size and memory share.
    resources: InferenceResources = field(default_factory=InferenceResources)


@dataclass
class WorkerReport:
    completions: list[Completion]
    outstanding: int        # requests queued or running in the engine after this call
    busy_s: float           # time spent decoding in this call
    row_steps: int          # decode steps x rows holding a request
    slot_steps: int         # decode steps x slots
    loaded: WeightLoad | None = None  # the version this call loaded: how long, when done


def build_engine(spec: WorkerSpec):
    if spec.engine == "vllm":
        from .model import load_tokenizer
        from .rollout.vllm_engine import VLLMEngine

        tools = (RunnerToolTurns.from_config(spec.tools, load_tokenizer(spec.model_path))
                 if spec.tools else None)
        gpu = spec.resources.gpus > 0  # on the CPU vLLM sizes its cache by its own setting
        return VLLMEngine(spec.model_path, spec.sampling, max_slots=spec.slots, seed=spec.seed,
                          version=-1, dtype=spec.dtype,
                          recompute_cache_on_update=spec.recompute_cache_on_update,
                          engine_kwargs={"enforce_eager": spec.vllm_eager}, tools=tools,
                          tensor_parallel_size=spec.resources.tensor_parallel_size,
                          gpu_memory_utilization=(spec.resources.gpu_memory_utilization
                                                  if gpu else None))
    from .model import load_model
    from .rollout.engine import ContinuousBatchingEngine

    model, tokenizer = load_model(spec.model_path, spec.dtype)
    model = model.to(worker_device(spec.resources))  # the engine decodes where its model is
    tools = RunnerToolTurns.from_config(spec.tools, tokenizer) if spec.tools else None
    return ContinuousBatchingEngine(
        model, spec.sampling, slots=spec.slots, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, seed=spec.seed, version=-1,
        recompute_cache_on_update=spec.recompute_cache_on_update, tools=tools)


class InferenceWorker:
    """The body of an inference actor (wrapped with `ray.remote` by the orchestrator)."""

    def __init__(self, spec: WorkerSpec) -> None:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # the driver's progress is the output
        torch.set_num_threads(spec.threads)
        self.engine = build_engine(spec)
        self.outstanding = 0  # counted here, so any engine behind the protocol will do
        self._lora: LoraMerger | None = None  # the base weights LoRA adapters merge into

    def pid(self) -> int:
        return os.getpid()

    def advance(self, requests: list[GenerationRequest], weights, version: int,
                budget_s: float) -> WorkerReport:
        # Ray resolved the published object for us (the pull): a packet mapped from the
        # node's shared memory, or a state dict.
        loaded = self.load_weights(weights, version) if weights is not None else None
        for request in requests:
            self.engine.add_request(request)
        self.outstanding += len(requests)
        done: list[Completion] = []
        start = time.perf_counter()
        before = self._utilisation()
        while self.engine.has_unfinished() and time.perf_counter() - start < budget_s:
            done += self.engine.step()
        after = self._utilisation()
        self.outstanding -= len(done)
        return WorkerReport(done, self.outstanding, time.perf_counter() - start,
                            after[0] - before[0], after[1] - before[1], loaded)

    def load_weights(self, weights: WeightPacket | dict[str, Any], version: int) -> WeightLoad:
        """Serve new weights: a packet as it is (the engine maps or copies it), LoRA adapters
        merged into the base weights first; when it was done is when serving began."""
        start = time.perf_counter()
        if isinstance(weights, WeightPacket):
            version = weights.version  # the packet says which policy it is
            if weights.lora_scale is not None:
                weights = self._merged(unpack_weights(weights), weights.lora_scale)
        self.engine.load_weights(weights, version)
        return WeightLoad(version, time.perf_counter() - start, time.time())

    def _merged(self, adapters: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
        """W0 + scale B A for each adapted layer. Merged here rather than loaded as a peft
        adapter: decode and prefill then run on plain weights (the fused decoder, no
        per-layer adapter matmuls), at the cost of one kept copy of the adapted W0."""
        model = getattr(self.engine, "model", None)
        if model is None:
            raise RuntimeError("LoRA adapters reach the native engine only (rollout.engine "
                               "native); vLLM's adapter path is not built")
        if self._lora is None:
            self._lora = LoraMerger()
        return self._lora.merged(dict(model.named_parameters()), adapters, scale)

    def _utilisation(self) -> tuple[int, int]:
        stats = getattr(self.engine, "stats", None)
        return (stats.active_row_steps, stats.slot_steps) if stats else (0, 0)

    def close(self) -> None:
        for part in (self.engine, getattr(self.engine, "tools", None)):
            close = getattr(part, "close", None)
            if close:
                close()


@dataclass
class FleetAccounting:
    """Where every admitted prompt group went, over the whole run and its resumes: trained
    once, dropped (counted by cause), discarded by a resume (in flight when the run died), or
    in flight now. `in_flight` is counted from the orchestrator's own records (groups being
    generated or scored, and complete groups waiting for the trainer), not taken as the rest,
    so `balanced()` is a real check: nothing lost, nothing counted twice."""

    admitted: int = 0
    trained: int = 0
    dropped_stale: int = 0
    dropped_uniform: int = 0          # dynamic sampling: all G rewards equal
    discarded_on_resume: int = 0
    reissued_requests: int = 0
    worker_restarts: int = 0
    trained_group_ids: list[int] = field(default_factory=list)

    def settled(self) -> int:
        return self.trained + self.dropped_stale + self.dropped_uniform + self.discarded_on_resume

    def balanced(self, in_flight: int) -> bool:
        return self.admitted == self.settled() + in_flight

    def ledger(self, in_flight: int) -> dict[str, int]:
        """The counts a checkpoint keeps and every step logs (`fleet/ledger_*`)."""
        return {"admitted": self.admitted, "trained": self.trained,
                "dropped_stale": self.dropped_stale, "dropped_uniform": self.dropped_uniform,
                "discarded_on_resume": self.discarded_on_resume, "in_flight": in_flight}


@dataclass(frozen=True)
class FleetResume:
    """Where a resumed fleet goes on: the next group id and the accounting so far."""

    next_group: int
    accounting: FleetAccounting


def fleet_resume(saved: dict[str, Any], logged_admitted: int, trained: int) -> FleetResume:
    """The fleet a resumed run starts from `saved` (a checkpoint's `checkpoint_state`). The
    killed run may have admitted groups after that checkpoint (`logged_admitted`, from its
    metrics, is a lower bound): their ids are not reused, and they, with the groups in
    flight at the checkpoint, count as discarded; everything else carries on. `trained`
    (the checkpoint's step x P) rebuilds the ledger of a checkpoint written before it kept one."""
    ledger = saved.get("ledger") or {  # older checkpoints: the drops were not kept apart
        "admitted": saved["next_group"], "trained": trained, "dropped_stale": saved[
            "next_group"] - trained - saved["in_flight"], "dropped_uniform": 0,
        "discarded_on_resume": 0, "in_flight": saved["in_flight"]}
    next_group = max(logged_admitted, saved["next_group"])
    lost = ledger["in_flight"] + next_group - saved["next_group"]
    return FleetResume(next_group, FleetAccounting(
        admitted=ledger["admitted"] + next_group - saved["next_group"],
        trained=ledger["trained"], dropped_stale=ledger["dropped_stale"],
        dropped_uniform=ledger["dropped_uniform"],
        discarded_on_resume=ledger["discarded_on_resume"] + lost))


@dataclass
class _Group:
    group_id: int
    example: Example
    prompt_ids: tuple[int, ...]
    target_step: int
    completions: dict[int, Completion] = field(default_factory=dict)


@dataclass
class _Ready:
    group_id: int
    group: RolloutGroup


@dataclass
class _WorkerState:
    version: int = -1
    outstanding: int = 0      # requests queued or running on the worker


class FleetRollouts(Orchestrator[_Ready]):
    """The orchestrator: runs in a thread beside the trainer; `next_batch` blocks until P
    complete, scored, fresh-enough groups are ready (the queue hands out the oldest group
    ids first)."""

    def __init__(self, cfg: RLVRConfig, task: Task, tokenizer, pool: VerifierPool, *,
                 start_version: int, dynamic_sampling: bool,
                 resumed: FleetResume | None = None,
                 curriculum: LearnabilityCurriculum | None = None) -> None:
        lora = cfg.model.lora
        super().__init__(name="rollout fleet", size=cfg.runtime.inference_workers,
                         max_restarts=cfg.runtime.max_worker_restarts,
                         order=lambda ready: ready.group_id, cleanup_method="close",
                         packer=WeightPacker(cfg.rollout.dtype, lora_scale=(
                             lora.alpha / lora.r if lora is not None else None)))
        self.cfg, self.task, self.tokenizer, self.pool = cfg, task, tokenizer, pool
        self.mode, self.k = cfg.runtime.mode, cfg.runtime.max_staleness
        self.group_size, self.per_step = cfg.rollout.group_size, cfg.rollout.prompts_per_step
        self.dynamic_sampling = dynamic_sampling
        # rollout.curriculum: a prompt per admitted group; every P finished groups (dropped
        # ones too: evidence of their level) folded in as one step
        self.curriculum = curriculum
        self._finished: list[RolloutGroup] = []
        self._curriculum_figures: dict[str, float] = {}
        self.format = PromptFormatter(tokenizer, cfg.model.chat_template, cfg.model.system_prompt)
        self.accounting = resumed.accounting if resumed else FleetAccounting()
        self._groups: dict[int, _Group] = {}
        self._pending: collections.deque[GenerationRequest] = collections.deque()
        # Groups admitted and not dropped; the trainer has consumed start_version * P of them.
        self._live = start_version * self.per_step
        self._next_group = resumed.next_group if resumed else start_version * self.per_step
        self._busy_s = 0.0
        self._row_steps = self._slot_steps = self._tokens = 0
        self._window_start = time.perf_counter()
        self._workers = [_WorkerState() for _ in range(self.size)]
        self._placement_group = None  # the workers' GPUs, reserved at the first worker

    def _make_worker(self, index: int):
        """Worker `index` in bundle `index` of the fleet's placement group (made once, when
        the workers ask for GPUs; a restarted worker takes its predecessor's bundle). CPU-only
        workers are plain actors: a group would only add a start-up wait."""
        r, rt, placement = self.cfg.rollout, self.cfg.runtime, self.cfg.placement
        resources = placement.inference
        if resources.tensor_parallel_size > 1 and r.engine != "vllm":
            raise ConfigError("placement.inference.tensor_parallel_size > 1 needs "
                              "rollout.engine=vllm (the native engine runs on one device)")
        spec = WorkerSpec(
            self.cfg.model.path, r.dtype, r.engine, EngineSampling(r.temperature, r.top_p),
            r.slots, rt.worker_threads, r.recompute_cache_on_update,
            step_seed(self.cfg.train.seed, index, f"worker:{self.accounting.worker_restarts}")
            % 2**31, self.cfg.vllm_eager(), r.tools if r.tools.tools else None, resources)
        if resources.gpus > 0 and self._placement_group is None:
            self._placement_group = create_placement_group(
                ray_bundles(resources, self.size), placement.strategy,
                f"rlscale-inference-{os.getpid()}-{id(self):x}", placement.timeout_s)
        options = actor_options(resources, self._placement_group,
                                index if self._placement_group is not None else None)
        return import_ray().remote(**options)(InferenceWorker).remote(spec)

    def _closed(self) -> None:
        release_placement_group(self._placement_group)
        self._placement_group = None

    def checkpoint_state(self) -> dict[str, Any]:
        """What a resumed run needs: where group ids go on, and the accounting so far."""
        with self._cv:
            in_flight = self._in_flight()
            return {"next_group": self._next_group, "in_flight": in_flight,
                    "ledger": self.accounting.ledger(in_flight)}

    def _in_flight(self) -> int:
        """Admitted groups not yet trained or dropped, counted where they are (call with
        the lock held): being generated or scored, or complete and queued."""
        return len(self._groups) + len(self.queue)

    # -- the trainer's side --------------------------------------------------------------
    def next_batch(self, step: int, trainer_version: int) -> tuple[RolloutGroup, dict[str, float]]:
        """P groups for the step that trains weights `trainer_version`: the oldest first,
        every token at most k versions behind (`step` plays no part: group ids seed the
        prompts)."""
        t0 = time.perf_counter()
        with self._cv:  # what is taken or dropped is counted in the same breath
            taken = [ready for _, ready in self._take(
                self.per_step, min_version=trainer_version - self.k, on_stale=self._dropped)]
            self.accounting.trained += len(taken)
            self.accounting.trained_group_ids += [g.group_id for g in taken]
            stats = {"fleet/trainer_wait_s": time.perf_counter() - t0, **self._window_stats()}
        return concat_groups([g.group for g in taken], self.tokenizer.pad_token_id), stats

    def _dropped(self, stale: list[tuple[int, _Ready]]) -> None:
        self.accounting.dropped_stale += len(stale)
        self._live -= len(stale)

    def _window_stats(self) -> dict[str, float]:
        """The fleet's work since the last step, and the ledger (call with the lock held)."""
        window = time.perf_counter() - self._window_start
        acc = self.accounting
        stats = {
            "fleet/inference_busy_share": self._busy_s / max(window * self.size, 1e-9),
            "fleet/slot_utilisation": self._row_steps / max(self._slot_steps, 1),
            "fleet/generated_tokens_per_s": self._tokens / max(window, 1e-9),
            "fleet/groups_admitted": self._next_group,  # over the whole run
            "fleet/discarded_on_resume": acc.discarded_on_resume,
            **{f"fleet/ledger_{k}": v for k, v in acc.ledger(self._in_flight()).items()},
            "fleet/reissued_requests": acc.reissued_requests,
            "fleet/worker_restarts": acc.worker_restarts,
            "staleness/dropped_group_share": acc.dropped_stale / max(
                acc.trained + acc.dropped_stale, 1),
            "sampling/dropped_group_share": acc.dropped_uniform / max(acc.admitted, 1),
            **self.sync_clock.window(),  # time/publish_s: learner -> a worker serving
            **self._curriculum_figures,  # the newest fold: weights and success rates
        }
        self._busy_s, self._row_steps, self._slot_steps, self._tokens = 0.0, 0, 0, 0
        self._window_start = time.perf_counter()
        return stats

    # -- the orchestrator thread ---------------------------------------------------------
    def _prepare(self) -> bool:
        """Admit groups while their training step is within k of the newest weights."""
        newest, _ = self.latest()
        while True:
            with self._cv:  # admitted and recorded at once: the ledger balances at any time
                target = self._live // self.per_step
                if target >= self.cfg.train.steps or target - newest > self.k:
                    return True
                group_id = self._next_group
                rng = random.Random(step_seed(self.cfg.train.seed, group_id, "fleet-prompt"))
                example = (self.curriculum.sample(rng, 1)[0] if self.curriculum is not None
                           else self.task.sample("train", rng))
                ids = tuple(self.tokenizer(self.format(example),
                                           add_special_tokens=False)["input_ids"])
                self._groups[group_id] = _Group(group_id, example, ids, target)
                self._next_group += 1
                self._live += 1
                self.accounting.admitted += 1
            for r in range(self.group_size):
                self._pending.append(self._request(group_id * self.group_size + r))

    def _dispatch(self, index: int) -> bool:
        """One call to an idle worker: newer weights when it may take them, and requests up
        to twice its slots (a backlog, so a freed slot is refilled inside the call)."""
        worker = self._workers[index]
        newest, ref = self.latest()
        weights = None
        if newest > worker.version and (self.mode == "inflight" or worker.outstanding == 0):
            weights, worker.version = ref, newest
        requests: list[GenerationRequest] = []
        room = 2 * self.cfg.rollout.slots - worker.outstanding
        while room > 0 and self._pending:
            group = self._groups[self._pending[0].request_id // self.group_size]
            if group.target_step - worker.version > self.k:
                break  # too stale for this worker's weights: it drains, then updates
            requests.append(self._pending.popleft())
            room -= 1
        if weights is None and not requests and worker.outstanding == 0:
            return False
        worker.outstanding += len(requests)
        self._fleet.submit(index, "advance", requests, weights, worker.version,
                           self.cfg.runtime.call_budget_s,
                           items={r.request_id for r in requests})
        return True

    def _request(self, request_id: int) -> GenerationRequest:
        """Request `request_id`: row `request_id % G` of group `request_id // G`."""
        group = self._groups[request_id // self.group_size]
        return GenerationRequest(request_id, group.prompt_ids, self.cfg.rollout.max_new_tokens)

    def _on_report(self, index: int, report: WorkerReport) -> None:
        worker = self._workers[index]
        worker.outstanding = report.outstanding
        self._fleet.done(index, {c.request_id for c in report.completions})
        with self._cv:
            self._busy_s += report.busy_s
            self._row_steps += report.row_steps
            self._slot_steps += report.slot_steps
            self._tokens += sum(len(c) for c in report.completions)
            if report.loaded is not None:
                self.sync_clock.on_load(report.loaded)
        for completion in report.completions:
            group_id, row = divmod(completion.request_id, self.group_size)
            group = self._groups.get(group_id)
            if group is None or row in group.completions:
                continue  # a late copy of a re-issued request: recorded once only
            group.completions[row] = completion
            if len(group.completions) == self.group_size:
                self._finish(group)  # it leaves `_groups` when it is queued or dropped

    def _on_death(self, died: ActorDied) -> None:
        self._workers[died.index] = _WorkerState()
        lost = [r for r in sorted(died.items)
                if r // self.group_size in self._groups
                and r % self.group_size not in self._groups[r // self.group_size].completions]
        for request_id in reversed(lost):  # to the front: they are the oldest work
            self._pending.appendleft(self._request(request_id))
        with self._cv:
            self.accounting.reissued_requests += len(lost)
            self.accounting.worker_restarts += 1
        print(f"warning: inference worker {died.index} died ({died.reason}); restarted, "
              f"{len(lost)} requests re-issued")

    def _fold_into_curriculum(self, scored: RolloutGroup) -> None:
        """Every P finished groups, one update of the curriculum (its step's worth)."""
        if self.curriculum is None:
            return
        self._finished.append(scored)
        if len(self._finished) < self.per_step:
            return
        batch, self._finished = self._finished, []
        figures = self.curriculum.update([g.examples[0] for g in batch],
                                         torch.cat([g.rewards for g in batch]), self.group_size)
        with self._cv:
            self._curriculum_figures = figures

    def _finish(self, group: _Group) -> None:
        """Score a complete group and queue it for the trainer (or drop it, counted)."""
        completions = [group.completions[r] for r in range(self.group_size)]
        rollout = rollout_from_completions(completions, self.tokenizer.pad_token_id)
        texts = decode_completions(self.tokenizer, rollout)
        t0 = time.perf_counter()
        scored = self.pool.score(texts, [group.example] * self.group_size)
        scored_group = RolloutGroup.from_scores([group.example], rollout, texts, scored,
                                                time.perf_counter() - t0)
        uniform = not bool(informative_groups(scored_group.rewards, self.group_size)[0])
        self._fold_into_curriculum(scored_group)
        with self._cv:
            del self._groups[group.group_id]
            if self.dynamic_sampling and uniform:
                self.accounting.dropped_uniform += 1
                self._live -= 1
                return
            oldest = int(rollout.versions()[rollout.sampled_mask() > 0].min())
            self.queue.put(_Ready(group.group_id, scored_group), oldest)
