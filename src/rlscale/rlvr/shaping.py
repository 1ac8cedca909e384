"""Length shaping: reward terms that depend on how long a completion is.

Pure functions on tensors (or anything `torch.as_tensor` accepts); each returns a term to
*add* to the verifier's rewards (`[N]`, <= 0). Groups are consecutive blocks of
`group_size` rows that share a prompt, as in `advantages.group_advantages`.

`SHAPING_TERMS` registers each term by the `Objective` field that switches it on, and
`shape_rewards` adds every term an objective enables: a new term is a new entry, not a new
branch in the loop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from .objectives import Objective


def _as_float(x) -> Tensor:
    x = torch.as_tensor(x)
    return x if x.is_floating_point() else x.to(torch.get_default_dtype())


def _groups(x: Tensor, group_size: int) -> Tensor:
    if x.dim() != 1 or group_size < 1 or x.numel() % group_size:
        raise ValueError(f"{tuple(x.shape)} does not split into groups of {group_size}")
    return x.view(-1, group_size)


def constant_length_penalty(lengths, per_token: float) -> Tensor:
    """`-per_token * length`: a flat price per token. Simple, but it also taxes the long
    reasoning that hard prompts need; see `adaptive_length_penalty`."""
    return -per_token * _as_float(lengths)


def soft_overlong_penalty(lengths, max_length: int, buffer: int) -> Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025).

    0 up to `max_length - buffer` tokens, then a linear ramp `(max_length - buffer - L) /
    buffer` down to -1 at `max_length`, and -1 beyond. A truncated answer is otherwise
    scored like a wrong one, which punishes sound but long reasoning; the ramp warns
    before the cliff.
    """
    if not 0 < buffer <= max_length:
        raise ValueError(f"need 0 < buffer <= max_length, got buffer={buffer}, max={max_length}")
    lengths = _as_float(lengths)
    start = max_length - buffer
    ramp = (start - lengths) / buffer
    penalty = torch.where(lengths <= start, torch.zeros_like(lengths), ramp)
    return torch.where(lengths > max_length, torch.full_like(lengths, -1.0), penalty)


def group_success_rates(rewards, group_size: int) -> Tensor:
    """`[N] -> [N / group_size]`: the share of each group's completions with reward > 0."""
    return (_groups(_as_float(rewards), group_size) > 0).to(torch.float64).mean(dim=1)


def adaptive_length_penalty(rewards, lengths, group_size: int, *, strength: float) -> Tensor:
    """Difficulty-adaptive length penalty: be brief where the prompt is easy.

    Per group, `p` is the share of correct completions (reward > 0). Each *correct*
    completion gets `-strength * p * (L - L_min) / (L_max - L_min)`, with the min and max
    over the whole group (0 when all lengths are equal), so the shortest answer is free
    and the longest costs `strength * p`. Easy prompts (high `p`) are pushed to be concise;
    hard ones (low `p`) may think longer. Incorrect completions get no length term: length
    should not decide between two wrong answers. Normalising within the group makes the
    term independent of the generation budget and of the prompt's natural length.

    The idea follows the adaptive length penalty of Xiang et al. 2025 ("Just Enough
    Thinking") and Kimi k1.5's group-relative length reward, without claiming to match
    either exactly.
    """
    rewards = _groups(_as_float(rewards), group_size)
    lengths = _groups(_as_float(lengths), group_size).to(rewards.dtype)
    correct = rewards > 0
    success = correct.to(rewards.dtype).mean(dim=1, keepdim=True)
    shortest = lengths.min(dim=1, keepdim=True).values
    spread = lengths.max(dim=1, keepdim=True).values - shortest
    relative = torch.where(
        spread > 0, (lengths - shortest) / torch.where(spread > 0, spread, 1.0), 0.0
    )
    penalty = torch.where(correct, -strength * success * relative, torch.zeros_like(relative))
    return penalty.view(-1)


def difficulty_buckets(success_rates: Tensor | Sequence[float]) -> list[str]:
    """Map each group's success rate to "hard" (< 1/3), "medium" or "easy" (> 2/3), for
    logging length statistics per difficulty. The boundaries themselves are "medium"; a
    small tolerance keeps float32 rates such as 2/3 there."""
    rates = torch.as_tensor(success_rates, dtype=torch.float64).reshape(-1).tolist()
    tolerance = 1e-6
    buckets = []
    for p in rates:
        if p < 1 / 3 - tolerance:
            buckets.append("hard")
        elif p > 2 / 3 + tolerance:
            buckets.append("easy")
        else:
            buckets.append("medium")
    return buckets


# ----------------------------------------------------------------------------- the registry


@dataclass(frozen=True)
class ShapingInputs:
    """What a shaping term may read: the verifier's rewards and the completion lengths
    (`[N]`, groups of `group_size` consecutive rows), the generation budget, and the
    training step the batch is for."""

    rewards: Tensor
    lengths: Tensor
    group_size: int
    max_length: int
    step: int = 0


@dataclass(frozen=True)
class ShapingTerm:
    """`term(inputs, objective)` is the `[N]` term to add, or None where the objective leaves
    it off; `metric`, if set, names the batch mean logged for it."""

    term: Callable[[ShapingInputs, Objective], Tensor | None]
    metric: str | None = None


SHAPING_TERMS: dict[str, ShapingTerm] = {}


def register_shaping(name: str, metric: str | None = None):
    def add(fn: Callable[[ShapingInputs, Objective], Tensor | None]):
        SHAPING_TERMS[name] = ShapingTerm(fn, metric)
        return fn

    return add


@register_shaping("length_penalty_per_token")
def constant_length_term(inputs: ShapingInputs, objective: Objective) -> Tensor | None:
    """`constant_length_penalty` at `objective.length_penalty_per_token` (off at 0, and
    before step `objective.length_penalty_start`)."""
    if objective.length_penalty_per_token <= 0 or inputs.step < objective.length_penalty_start:
        return None
    return constant_length_penalty(inputs.lengths, objective.length_penalty_per_token)


@register_shaping("overlong_penalty", metric="length/overlong_penalty_mean")
def overlong_term(inputs: ShapingInputs, objective: Objective) -> Tensor | None:
    """DAPO's `soft_overlong_penalty`, its buffer `overlong_buffer_frac` of the budget
    (rounded, at least one token)."""
    if not objective.overlong_penalty:
        return None
    buffer = max(1, int(round(objective.overlong_buffer_frac * inputs.max_length)))
    return soft_overlong_penalty(inputs.lengths, inputs.max_length, buffer)


@register_shaping("adaptive_length_penalty", metric="length/adaptive_penalty_mean")
def adaptive_length_term(inputs: ShapingInputs, objective: Objective) -> Tensor | None:
    """`adaptive_length_penalty` at strength `objective.adaptive_length_penalty` (off at 0,
    and before step `objective.length_penalty_start`), on the verifier's rewards (not on the
    already shaped ones)."""
    if objective.adaptive_length_penalty <= 0 or inputs.step < objective.length_penalty_start:
        return None
    return adaptive_length_penalty(inputs.rewards, inputs.lengths, inputs.group_size,
                                   strength=objective.adaptive_length_penalty)


def shape_rewards(inputs: ShapingInputs, objective: Objective) -> tuple[Tensor, dict[str, float]]:
    """`R_i + sum_k term_k(i)` over the terms `objective` switches on, added in registry
    order, and the batch mean of each term that names a metric."""
    rewards = inputs.rewards.clone()
    stats: dict[str, float] = {}
    for shaping in SHAPING_TERMS.values():
        term = shaping.term(inputs, objective)
        if term is None:
            continue
        rewards += term
        if shaping.metric is not None:
            stats[shaping.metric] = float(term.mean())
    return rewards, stats
