"""Advantage estimators for RLVR: how a completion's reward (and, for on-policy distillation,
a teacher's verdict on each of its tokens) becomes the advantage the loss weighs it by.

Sequence estimators are registered by name (`ADVANTAGE_ESTIMATORS`, like the losses'
registries in objectives.py): each maps `[N]` rewards, in consecutive groups of `group_size`
completions of one prompt, to `[N]` advantages, and the loop finishes them before the
trainer's step. An objective names its estimator (`Objective.advantage_estimator`). The
teacher's per-token term (on-policy distillation) is measured against pi_old, which with one
update per step is the update's own forward: `teacher_mixed_advantages` forms it inside the
step, through the objective's `StepLoss`, never the trainer.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .token_math import as_float, masked_delta, masked_mean, registrar

# ----------------------------------------------------------------------------- sequence estimators


def group_advantages(
    rewards: Tensor,
    group_size: int,
    *,
    std_normalize: bool = False,
    leave_one_out: bool = False,
    eps: float = 1e-6,
) -> Tensor:
    """Group-relative advantages: each completion is scored against its siblings.

    `rewards` is `[N]`, consecutive blocks of `group_size` share a prompt; returns `[N]`.

    - default: `A_i = R_i - mean(group)`. The group mean is a per-prompt baseline, so a
      prompt's difficulty does not leak into the gradient.
    - `leave_one_out` (RLOO, Ahmadian et al. 2024): `A_i = R_i - mean(others)`, which keeps
      the baseline independent of `R_i` and the estimator unbiased. It equals
      `G/(G-1) * (R_i - mean)`.
    - `std_normalize` (original GRPO): divide by the group's *population* std
      (`unbiased=False`) plus `eps`. Population std is defined for any group size and makes
      a group's default advantages exactly unit-variance; Dr. GRPO (Liu et al. 2025) argues
      the division over-weights near-uniform (too easy / too hard) prompts, so it is off by
      default.

    A group whose rewards are all equal carries no signal and gets exactly 0, whatever the
    flags: float sums of equal numbers need not divide back to the same number, so this is
    enforced rather than left to rounding.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    if leave_one_out and group_size < 2:
        raise ValueError("leave_one_out needs group_size >= 2")
    dtype = torch.promote_types(rewards.dtype, torch.float32)
    grouped = rewards.detach().to(dtype).view(-1, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if leave_one_out:
        centred = centred * (group_size / (group_size - 1))
    if std_normalize:
        centred = centred / (grouped.std(dim=1, unbiased=False, keepdim=True) + eps)
    uniform = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)
    return torch.where(uniform, torch.zeros_like(centred), centred).view(-1)


ADVANTAGE_ESTIMATORS: dict[str, Callable[[Tensor, int], Tensor]] = {}


register_advantage_estimator = registrar(ADVANTAGE_ESTIMATORS)


@register_advantage_estimator("group_mean")
def group_mean_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """`A_i = R_i - mean(group)` (Dr. GRPO, the library default)."""
    return group_advantages(rewards, group_size)


@register_advantage_estimator("leave_one_out")
def leave_one_out_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """RLOO: `A_i = R_i - mean(others)`."""
    return group_advantages(rewards, group_size, leave_one_out=True)


@register_advantage_estimator("std_normalized")
def std_normalized_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """Original GRPO: `(R_i - mean(group)) / (std(group) + eps)`."""
    return group_advantages(rewards, group_size, std_normalize=True)


@register_advantage_estimator("leave_one_out_std_normalized")
def leave_one_out_std_normalized_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """RLOO's baseline, divided by the group's std."""
    return group_advantages(rewards, group_size, std_normalize=True, leave_one_out=True)


@register_advantage_estimator("reward")
def reward_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """No baseline: `A_i = R_i`. PPO's (objective `ppo`): its critic's GAE turns the rewards
    into per-token advantages inside the step (rlvr.critic)."""
    return rewards.detach().float().clone()


def estimator_name(*, std_normalize: bool, leave_one_out: bool) -> str:
    """The registered estimator the two `loss.advantage_*` switches choose."""
    base = "leave_one_out" if leave_one_out else "group_mean"
    if std_normalize:
        return "std_normalized" if base == "group_mean" else f"{base}_std_normalized"
    return base


# ----------------------------------------------------------------------------- the teacher's per-token term
# OPD (Agarwal et al. 2024, "On-Policy Distillation of Language Models"; Thinking Machines
# 2025): the student samples y ~ pi_s, the teacher scores every sampled token, and each
# token's advantage is the negative per-token reverse KL sample,
#
#     A_{i,t} = -(log pi_s(y_t | y_<t, x) - log pi_T(y_t | y_<t, x)),   detached,
#
# each token its own (no discounting, no sum over later tokens). Through the clipped-ratio
# loss at theta = theta_old its gradient is E[sum_t A_t grad log pi_s(y_t)] = -grad of the
# per-token reverse KL(pi_s || pi_T) on the student's own states: a dense, token-level DAgger.


def teacher_advantages(student_logp: Tensor, teacher_logp: Tensor, mask: Tensor) -> Tensor:
    """`[B, T]` per-token advantages `log pi_T(y_t) - log pi_s(y_t)`, detached, exactly 0
    outside `mask`. A teacher equal to the student gives 0 everywhere (and so no gradient)."""
    return masked_delta(teacher_logp.detach().float(), student_logp.detach().float(), mask)


def mixed_advantages(sequence_advantages: Tensor, token_advantages: Tensor | None, *,
                     reward_weight: float, teacher_weight: float) -> Tensor:
    """The advantages the loss sees: `reward_weight * A_i + teacher_weight * A_{i,t}`.

    `sequence_advantages` `[B]` are the verifier's group-relative ones; `token_advantages`
    `[B, T]` the teacher's (None without a teacher). Without a teacher term the result stays
    `[B]` (the GRPO family unchanged); with one it is `[B, T]`, the sequence term shared by
    the sequence's tokens (`teacher_advantages` is already 0 on padding)."""
    if token_advantages is None or teacher_weight == 0.0:
        return reward_weight * sequence_advantages
    return (reward_weight * sequence_advantages[:, None]
            + teacher_weight * token_advantages)


def reverse_kl_per_token(student_logp: Tensor, teacher_logp: Tensor, mask: Tensor) -> float:
    """Mean over `mask` of `log pi_s - log pi_T` on the student's samples: the k1 (unbiased)
    estimate of the per-token reverse KL(pi_s || pi_T)."""
    return as_float(masked_mean(-teacher_advantages(student_logp, teacher_logp, mask), mask))


def teacher_mixed_advantages(sequence: Tensor, old_logp: Tensor,
                             teacher_logp: Tensor | None, mask: Tensor, *,
                             reward_weight: float, teacher_weight: float) -> Tensor:
    """The advantages an objective's loss sees: the finished sequence ones weighted by
    `reward_weight`, plus with a teacher its per-token ones against pi_old (`old_logp`, the
    trainer's own log-probs of the sampled tokens, not the sampler's: a teacher equal to the
    student then gives exactly 0, where engine rounding would leave noise that Adam scales
    up) weighted by `teacher_weight`."""
    token = None if teacher_logp is None else teacher_advantages(old_logp, teacher_logp, mask)
    return mixed_advantages(sequence, token, reward_weight=reward_weight,
                            teacher_weight=teacher_weight)
