"""Scored prompt groups: the unit that travels from the samplers to the trainer.

A `RolloutGroup` holds P prompts x G completions with their rewards, rows of one prompt
consecutive. The synchronous sampler makes one for a whole step; the fleet makes one per
prompt (its G completions may come from different workers) and joins P of them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..tasks import Example
from .sampler import Rollout
from .types import Completion

if TYPE_CHECKING:
    from ..rewards import ScoredBatch


@dataclass
class RolloutGroup:
    """`len(examples)` prompts x G completions, with rewards: the unit the queue carries."""

    examples: list[Example]            # one per prompt
    rollout: Rollout                   # B = prompts x G rows, groups consecutive
    texts: list[str]
    rewards: torch.Tensor              # [B] rewards (the weighted sum of the reward terms)
    verifier_errors: int = 0
    verifier_timeouts: int = 0
    verifier_crashes: int = 0
    first_error: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    reward_terms: dict[str, torch.Tensor] = field(default_factory=dict)  # [B] each, unweighted
    score_seconds: float = 0.0         # wall time spent waiting for the verifier pool


    @classmethod
    def from_scores(cls, examples: list[Example], rollout: Rollout, texts: list[str],
                    scored: ScoredBatch, score_seconds: float) -> RolloutGroup:
        """The group of `rollout` scored by the verifier pool (weighted sum and each term)."""
        return cls(examples, rollout, texts, torch.tensor(scored.rewards), scored.errors,
                   scored.timeouts, scored.crashes, scored.first_error,
                   reward_terms={k: torch.tensor(v) for k, v in scored.terms.items()},
                   score_seconds=score_seconds)


def step_seed(seed: int, step: int, salt: str) -> int:
    """A per-step seed: a resumed run draws the same prompts and samples as an unbroken one."""
    return random.Random(f"{seed}:{step}:{salt}").getrandbits(63)


def rollout_from_completions(completions: list[Completion], pad_token_id: int) -> Rollout:
    """Right-padded tensors of engine completions, in the given order."""
    width = max(max(len(c) for c in completions), 1)
    rows = len(completions)
    tokens = torch.full((rows, width), pad_token_id, dtype=torch.long)
    logprobs = torch.zeros((rows, width), dtype=torch.float32)
    versions = torch.zeros((rows, width), dtype=torch.long)
    tools = torch.zeros((rows, width), dtype=torch.float32)
    for i, c in enumerate(completions):
        n = len(c)
        tokens[i, :n] = torch.tensor(c.token_ids)
        logprobs[i, :n] = torch.tensor(c.logprobs)
        versions[i, :n] = torch.tensor(c.versions)
        if c.tool_mask:
            tools[i, :n] = torch.tensor(c.tool_mask, dtype=torch.float32)
    lengths = torch.tensor([len(c) for c in completions], dtype=torch.long)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
    sampled = [v for c in completions for v, t in zip(c.versions, c.tool_mask or [0] * len(c),
                                                      strict=True) if not t]
    return Rollout(prompt_ids=[list(c.prompt_ids) for c in completions], completion_ids=tokens,
                   sampler_logprobs=logprobs, mask=mask, lengths=lengths,
                   finish_reasons=[c.finish_reason for c in completions],
                   policy_version=min(sampled, default=0), token_versions=versions,
                   tool_mask=tools if any(c.tool_mask for c in completions) else None)


def concat_groups(parts: list[RolloutGroup], pad_token_id: int) -> RolloutGroup:
    if len(parts) == 1:
        return parts[0]
    width = max(p.rollout.completion_ids.shape[1] for p in parts)

    def pad(t: torch.Tensor, value: float) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value)

    rollout = Rollout(
        prompt_ids=[p for g in parts for p in g.rollout.prompt_ids],
        completion_ids=torch.cat([pad(g.rollout.completion_ids, pad_token_id) for g in parts]),
        sampler_logprobs=torch.cat([pad(g.rollout.sampler_logprobs, 0.0) for g in parts]),
        mask=torch.cat([pad(g.rollout.mask, 0.0) for g in parts]),
        lengths=torch.cat([g.rollout.lengths for g in parts]),
        finish_reasons=[f for g in parts for f in g.rollout.finish_reasons],
        policy_version=min(g.rollout.policy_version for g in parts),
        token_versions=torch.cat([pad(g.rollout.versions(), 0) for g in parts]),
        tool_mask=torch.cat([pad(g.rollout.tools(), 0.0) for g in parts])
        if any(g.rollout.tool_mask is not None for g in parts) else None)
    return RolloutGroup(
        examples=[e for g in parts for e in g.examples], rollout=rollout,
        texts=[t for g in parts for t in g.texts], rewards=torch.cat([g.rewards for g in parts]),
        verifier_errors=sum(g.verifier_errors for g in parts),
        verifier_timeouts=sum(g.verifier_timeouts for g in parts),
        verifier_crashes=sum(g.verifier_crashes for g in parts),
        first_error=next((g.first_error for g in parts if g.first_error), None),
        meta={k: v for g in parts for k, v in g.meta.items()},
        reward_terms={name: torch.cat([g.reward_terms[name] for g in parts])
                      for name in parts[0].reward_terms},
        score_seconds=sum(g.score_seconds for g in parts))


def select_groups(group: RolloutGroup, keep: torch.Tensor, size: int) -> RolloutGroup:
    """Keep the prompts where `keep` [num_prompts] is True (their G rows each)."""
    prompts = keep.nonzero().squeeze(-1)
    rows = (prompts[:, None] * size + torch.arange(size)).reshape(-1)
    r = group.rollout
    width = max(int(r.lengths[rows].max()), 1) if len(rows) else 1
    rollout = Rollout([r.prompt_ids[i] for i in rows.tolist()], r.completion_ids[rows, :width],
                      r.sampler_logprobs[rows, :width], r.mask[rows, :width], r.lengths[rows],
                      [r.finish_reasons[i] for i in rows.tolist()], r.policy_version,
                      r.versions()[rows, :width],
                      None if r.tool_mask is None else r.tool_mask[rows, :width])
    return RolloutGroup([group.examples[i] for i in prompts.tolist()], rollout,
                        [group.texts[i] for i in rows.tolist()], group.rewards[rows],
                        group.verifier_errors, group.verifier_timeouts, group.verifier_crashes,
                        group.first_error,
                        reward_terms={k: v[rows] for k, v in group.reward_terms.items()},
                        score_seconds=group.score_seconds)
