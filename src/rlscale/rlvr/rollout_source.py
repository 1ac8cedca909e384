"""Where the trainer's batches come from: the `RolloutSource` the loop consumes.

    batch, stats = source.next_batch(step, policy_version)   # P scored groups of G
    ... one update ...
    source.publish(state_dict, new_version)                  # the weights as they stand

Two implementations:
- `InProcessRollouts` (runtime.mode sync): the static sampler on the trainer's own model
  object, so every token is on-policy (zero staleness) and `publish` has nothing to do;
- `fleet.FleetRollouts` (async / inflight): inference workers on Ray, admission by staleness,
  the ledger of every admitted group.
Dynamic sampling (drop groups whose G rewards are all equal) is one criterion,
`informative_groups`, which both apply: the in-process source over each draw, the fleet as
each group completes.
"""

from __future__ import annotations

import contextlib
import random
import time
from typing import Any, Protocol

import torch

from .config import RLVRConfig
from .curriculum import LearnabilityCurriculum
from .model import PromptFormatter
from .rewards import VerifierPool
from .rollout.decoder import DecodeWeightsCache
from .rollout.engine import generate_with_tools
from .rollout.groups import (
    RolloutGroup,
    concat_groups,
    rollout_from_completions,
    select_groups,
    step_seed,
)
from .rollout.sampler import Rollout, SamplingParams, decode_completions, generate
from .rollout.types import EngineSampling
from .tasks import Task
from .tool_turns import RunnerToolTurns


class RolloutSource(Protocol):
    def next_batch(self, step: int, policy_version: int) -> tuple[RolloutGroup, dict[str, float]]:
        """`prompts_per_step` scored groups for the update of weights `policy_version`."""
        ...

    def publish(self, state_dict: dict[str, Any], version: int) -> None:
        """The weights after an update, for whatever generates next."""
        ...

    def checkpoint_state(self) -> dict[str, Any] | None:
        """What a resumed run needs from the source (None: nothing)."""
        ...


def informative_groups(rewards: torch.Tensor, size: int) -> torch.Tensor:
    """[num_prompts] True where a group's G rewards are not all equal: a group with one
    reward everywhere has zero advantage and carries no gradient (DAPO's dynamic sampling)."""
    per_group = rewards.view(-1, size)
    return per_group.max(1).values > per_group.min(1).values


class InProcessRollouts:
    """The sync loop's source: draws prompts, generates G completions each with the trainer's
    model, scores them; with dynamic sampling, draws again (up to `max_extra_draws`) until
    P informative groups are there."""

    def __init__(self, model, tokenizer, task: Task, cfg: RLVRConfig, pool: VerifierPool, *,
                 dynamic_sampling: bool, compute=None,
                 tools: RunnerToolTurns | None = None,
                 curriculum: LearnabilityCurriculum | None = None) -> None:
        self.model, self.tokenizer, self.task, self.cfg = model, tokenizer, task, cfg
        self.curriculum = curriculum  # None: prompts drawn uniformly by the task
        self.pool, self.dynamic_sampling = pool, dynamic_sampling
        # With tools, completions come from the continuous-batching engine on the same model
        # object: a row that calls a tool leaves the batch while the call runs, the others
        # decode on (the static sampler would hold every row for the slowest call).
        self.tools = tools
        self._parked_s = self._request_s = 0.0  # the engines' time of this step's draws
        self._generate_s = 0.0                  # the sampler's time in this step's draws
        self.decode_weights = DecodeWeightsCache()  # fused once per policy version
        self.compute = compute or contextlib.nullcontext()  # the matmul dtype (train.compute_dtype)
        self.format = PromptFormatter(tokenizer, cfg.model.chat_template, cfg.model.system_prompt)
        r = cfg.rollout
        self.params = SamplingParams(r.max_new_tokens, r.temperature, r.top_p)
        self.decode_options = {"static_step": r.static_decode,
                               "eos_check_every": r.eos_check_every}

    def publish(self, state_dict: dict[str, Any], version: int) -> None:
        pass  # the sampler is the trainer's own model object

    def checkpoint_state(self) -> None:
        return None

    def next_batch(self, step: int, policy_version: int) -> tuple[RolloutGroup, dict[str, float]]:
        cfg, size = self.cfg, self.cfg.rollout.group_size
        want = cfg.rollout.prompts_per_step
        kept: list[RolloutGroup] = []
        have, drawn, dropped, generated = 0, 0, 0, 0
        draws = 1 + (cfg.rollout.max_extra_draws if self.dynamic_sampling else 0)
        figures: dict[str, float] = {}
        for draw in range(draws):
            group = self.draw(step, draw, policy_version)
            if self.curriculum is not None:  # dropped groups are evidence of their level too
                figures = self.curriculum.update(group.examples, group.rewards, size)
            drawn += len(group.examples)
            generated += int(group.rollout.lengths.sum())  # dropped groups' tokens too
            if self.dynamic_sampling:
                informative = informative_groups(group.rewards, size)
                dropped += int((~informative).sum())
                group = select_groups(group, informative, size)
            if len(group.examples):
                kept.append(group)
                have += len(group.examples)
            if have >= want:
                break
        if not kept:  # every group uniform: train on the last draw (zero advantage, no-op)
            kept = [self.draw(step, draws, policy_version)]
        batch = concat_groups(kept, self.tokenizer.pad_token_id)
        if len(batch.examples) > want:
            batch = select_groups(batch, torch.arange(len(batch.examples)) < want, size)
        stats = {"sampling/prompts_drawn": drawn, "sampling/generated_tokens": generated,
                 "sampling/dropped_group_share": dropped / max(drawn, 1),
                 "sampling/batch_prompts": len(batch.examples),
                 "time/generate_s": self._generate_s, **self._engine_stats(), **figures}
        self._generate_s = 0.0
        return batch, stats

    def _engine_stats(self) -> dict[str, float]:
        """With tools: how long requests waited on them, and the calls by cause (the run's)."""
        if self.tools is None:
            return {}
        parked, lifetime, self._parked_s, self._request_s = (self._parked_s, self._request_s,
                                                             0.0, 0.0)
        return {"tools/wait_share": parked / max(lifetime, 1e-9), **self.tools.metrics()}

    def draw(self, step: int, draw: int, policy_version: int) -> RolloutGroup:
        """One draw of P prompts x G completions, scored (seeded by step and draw)."""
        cfg = self.cfg
        rng = random.Random(step_seed(cfg.train.seed, step, f"prompts:{draw}"))
        n = cfg.rollout.prompts_per_step
        prompts = (self.curriculum.sample(rng, n) if self.curriculum is not None
                   else [self.task.sample("train", rng) for _ in range(n)])
        rows = [ex for ex in prompts for _ in range(cfg.rollout.group_size)]
        ids = [self.tokenizer(self.format(ex), add_special_tokens=False)["input_ids"]
               for ex in rows]
        generator = torch.Generator().manual_seed(step_seed(cfg.train.seed, step, f"sample:{draw}"))
        self.model.eval()
        t0 = time.perf_counter()
        with self.compute:
            if self.tools is None:
                rollout = generate(self.model, ids, self.params,
                                   eos_token_id=self.tokenizer.eos_token_id,
                                   pad_token_id=self.tokenizer.pad_token_id,
                                   generator=generator, policy_version=policy_version,
                                   decode_weights=self.decode_weights.get(self.model,
                                                                          policy_version),
                                   **self.decode_options)
            else:
                rollout = self._generate_with_tools(ids, step_seed(
                    cfg.train.seed, step, f"sample:{draw}") % 2**63, policy_version)
        self._generate_s += time.perf_counter() - t0  # generate ends on the host: synced
        texts = decode_completions(self.tokenizer, rollout)
        t0 = time.perf_counter()
        scored = self.pool.score(texts, rows)
        score_seconds = time.perf_counter() - t0
        return RolloutGroup.from_scores(prompts, rollout, texts, scored, score_seconds)

    def _generate_with_tools(self, ids: list[list[int]], seed: int,
                             policy_version: int) -> Rollout:
        r = self.cfg.rollout
        completions, stats = generate_with_tools(
            self.model, ids, EngineSampling(r.temperature, r.top_p), r.max_new_tokens,
            self.tools, eos_token_id=self.tokenizer.eos_token_id,
            pad_token_id=self.tokenizer.pad_token_id, seed=seed, policy_version=policy_version)
        self._parked_s += stats.parked_s
        self._request_s += stats.request_s
        return rollout_from_completions(completions, self.tokenizer.pad_token_id)
