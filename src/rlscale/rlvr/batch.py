"""The batch of one RLVR step as the trainer reads it: prompts left-padded, completions
right-padded, the finished advantages and the sampler's log-probs; and its split into
minibatches and memory-bounded micro-batches (which never changes the math)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .layout import sequence_lengths


@dataclass
class PolicyBatch:
    """One collected step, ready for the update: prompts left-padded, completions right-padded."""

    input_ids: torch.Tensor        # [B, P + T]
    attention_mask: torch.Tensor   # [B, P + T]
    prompt_width: int              # P
    completion_ids: torch.Tensor   # [B, T]
    mask: torch.Tensor             # [B, T]
    advantages: torch.Tensor       # [B], the verifier's (group-relative) sequence advantages
    sampler_logprobs: torch.Tensor  # [B, T]
    policy_version: int            # the oldest version that drew any token
    token_versions: torch.Tensor | None = None  # [B, T]; None: every token `policy_version`
    teacher_logprobs: torch.Tensor | None = None  # [B, T]; a teacher's, for distillation

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    def select(self, index: torch.Tensor) -> PolicyBatch:
        return PolicyBatch(self.input_ids[index], self.attention_mask[index], self.prompt_width,
                           self.completion_ids[index], self.mask[index], self.advantages[index],
                           self.sampler_logprobs[index], self.policy_version,
                           None if self.token_versions is None else self.token_versions[index],
                           None if self.teacher_logprobs is None else self.teacher_logprobs[index])

    def versions(self) -> torch.Tensor:
        if self.token_versions is not None:
            return self.token_versions
        return torch.full(self.mask.shape, self.policy_version, dtype=torch.long,
                          device=self.mask.device)

    def lengths(self) -> torch.Tensor:
        """[B] prompt + completion tokens of each sequence."""
        prompt, completion = sequence_lengths(self.attention_mask, self.prompt_width,
                                              self.attention_mask[:, self.prompt_width:])
        return (prompt + completion).cpu()

    def to(self, device: torch.device) -> PolicyBatch:
        if self.input_ids.device == device:
            return self

        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return PolicyBatch(move(self.input_ids), move(self.attention_mask), self.prompt_width,
                           move(self.completion_ids), move(self.mask), move(self.advantages),
                           move(self.sampler_logprobs), self.policy_version,
                           move(self.token_versions), move(self.teacher_logprobs))


def build_policy_batch(prompt_ids: list[list[int]], completion_ids: torch.Tensor,
                       mask: torch.Tensor, advantages: torch.Tensor,
                       sampler_logprobs: torch.Tensor, pad_token_id: int,
                       policy_version: int, token_versions: torch.Tensor | None = None,
                       tool_mask: torch.Tensor | None = None) -> PolicyBatch:
    """`mask` marks the completion tokens (attended to); `tool_mask` the ones among them a
    tool wrote, which stay in the context and out of the loss: the batch's `mask` is the
    loss mask, the sampled tokens only."""
    batch, width = len(prompt_ids), max(len(p) for p in prompt_ids)
    prompts = torch.full((batch, width), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((batch, width), dtype=torch.long)
    for i, ids in enumerate(prompt_ids):
        prompts[i, width - len(ids):] = torch.tensor(ids)
        prompt_mask[i, width - len(ids):] = 1
    return PolicyBatch(
        input_ids=torch.cat([prompts, completion_ids], 1),
        attention_mask=torch.cat([prompt_mask, mask.long()], 1),
        prompt_width=width, completion_ids=completion_ids,
        mask=mask.float() if tool_mask is None else mask.float() * (1 - tool_mask.float()),
        advantages=advantages.float(), sampler_logprobs=sampler_logprobs.float(),
        policy_version=policy_version, token_versions=token_versions)


def micro_batches(index: torch.Tensor, lengths: torch.Tensor, rows: int = 0,
                  tokens: int = 0) -> list[torch.Tensor]:
    """Consecutive groups of `index` (a minibatch's sequence order) of at most `rows`
    sequences and, with `tokens`, at most that many prompt + completion tokens (a longer
    sequence forms a group alone); 0 = no limit of that kind. Memory limits only: the loss
    is normalised by the whole minibatch, so the grouping never changes the math."""
    if tokens <= 0:
        return list(index.split(rows)) if rows > 0 else [index]
    groups, current, used = [], [], 0
    for k, n in zip(index.tolist(), lengths[index].tolist(), strict=True):
        if current and (used + n > tokens or (rows > 0 and len(current) >= rows)):
            groups.append(current)
            current, used = [], 0
        current.append(k)
        used += n
    if current:
        groups.append(current)
    return [torch.tensor(g, dtype=torch.long) for g in groups]


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch of a minibatch with what its loss reads besides the forward: `rows`
    (into the step's batch), `mask` (the tokens that get the gradient: the top-rho entropy
    tokens of the whole minibatch with loss.entropy_top_rho < 1, else every completion
    token) and the minibatch's counts that every aggregation divides by."""

    rows: torch.Tensor
    batch: PolicyBatch
    mask: torch.Tensor
    num_sequences: int
    num_tokens: float


def minibatch_parts(batch: PolicyBatch, index: torch.Tensor, chunks: list[torch.Tensor],
                    top_entropy: torch.Tensor | None, offset: int = 0) -> list[MicroBatch]:
    """The micro-batches `chunks` (consecutive pieces of `index` from position `offset`: a
    learner rank's share) of the minibatch `index`, each with the whole minibatch's counts;
    `top_entropy` is its loss mask in `index` order (None: the completion mask)."""
    num_tokens = float(batch.mask[index].sum())
    parts = []
    for rows in chunks:
        micro = batch.select(rows)
        mask = micro.mask if top_entropy is None else top_entropy[offset: offset + len(rows)]
        offset += len(rows)
        parts.append(MicroBatch(rows, micro, mask, len(index), num_tokens))
    return parts
