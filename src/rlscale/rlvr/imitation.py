"""Learning from a teacher: SFT and DFT on demonstrations, and on-policy distillation's
per-token advantages from a teacher's log-probs on the student's own samples.

Pure tensor math beside `objectives` (whose helpers, aggregations and registries it uses):
`rlscale sft` computes its loss with `demonstration_loss`; the RL trainer mixes the verifier's
sequence advantages with `teacher_advantages` through `mixed_advantages`. Shapes as in
`objectives`: `[B, T]` per-token tensors with `mask` 1 on target or completion tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .objectives import (
    Aggregation,
    _check_name,
    _float,
    _masked_delta,
    masked_mean,
    masked_sum,
    registrar,
    unit_weight,
)

# ----------------------------------------------------------------------------- SFT and DFT
# SFT and RL are two settings of one per-token policy-gradient loss,
#
#     l_t = -sg(w_t) * log pi(y_t | y_<t, x),      grad l_t = -w_t * grad log pi(y_t | y_<t, x),
#
# with the weight w_t a constant. RL samples y from the policy and weighs each token of y_i
# by its advantage (at theta = theta_old the clipped surrogate has exactly this gradient,
# w = A_i); SFT takes y* from a demonstration and weighs every token by 1; DFT weighs it by
# the token's own detached probability. SFT's weight 1 is a policy gradient with reward
# 1{y = y*} and importance weight 1/pi(y*|x) (rlscale.rlvr.sft_pg shows it exactly), which
# blows up on improbable targets; DFT multiplies the 1/pi back out.

DEMONSTRATION_WEIGHTS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"one": unit_weight}


register_demonstration_weight = registrar(DEMONSTRATION_WEIGHTS)


@register_demonstration_weight("token")
def token_probability(logp: Tensor, mask: Tensor) -> Tensor:
    """DFT (Wu et al. 2025): `w_t = sg(pi(y*_t | y*_<t, x)) = exp(logp_t)`, detached."""
    return logp.detach().exp()


@register_demonstration_weight("sequence")
def sequence_probability(logp: Tensor, mask: Tensor) -> Tensor:
    """DFT by the whole target's probability: `w_t = sg(pi(y* | x)) = exp(sum_t logp_t)`
    for every token of the sequence, detached. It is the exact inverse of the sequence-level
    importance weight 1/pi(y*|x), and it underflows to 0 on long or improbable targets."""
    return torch.exp(masked_sum(logp.detach(), mask, dim=-1))[:, None].expand_as(logp)


def policy_gradient_term(logp: Tensor, weight: Tensor, mask: Tensor) -> Tensor:
    """The one per-token loss `-sg(w_t) * log pi(y_t | y_<t, x)`, `[B, T]`, 0 outside
    `mask`: its gradient is `-w_t * grad log pi`, the weight never differentiated."""
    term = -weight.detach() * logp
    return torch.where(mask > 0, term, torch.zeros_like(term))


def sft_loss(logp: Tensor, mask: Tensor) -> Tensor:
    """Per-token SFT loss `-log pi(y*_t | y*_<t, x)` on the target tokens (`w_t = 1`), `[B, T]`.
    Its token mean is the Hugging Face `labels` cross-entropy."""
    return policy_gradient_term(logp, unit_weight(logp, mask), mask)


def dft_loss(logp: Tensor, mask: Tensor, *, weight: str = "token") -> Tensor:
    """Per-token DFT loss `-sg(p_t) * log pi(y*_t | y*_<t, x)`, `[B, T]` (Wu et al. 2025,
    "On the Generalization of SFT: A Reinforcement Learning Perspective with Reward
    Rectification").

    `weight="token"`: `p_t = pi(y*_t | y*_<t, x)`, the paper's; `weight="sequence"`:
    `p_t = pi(y* | x)` for every token. Either way its gradient is SFT's times `p_t`:
    tokens the model already finds likely keep their full gradient, improbable ones (where
    SFT's implicit 1/pi weight is largest) are damped."""
    if weight == "one":
        raise ValueError("dft_loss needs a probability weight ('token' or 'sequence')")
    _check_name("dft weight", weight, DEMONSTRATION_WEIGHTS)
    return policy_gradient_term(logp, DEMONSTRATION_WEIGHTS[weight](logp, mask), mask)


def demonstration_loss(logp: Tensor, mask: Tensor, *, weight: str = "one",
                       aggregate: Aggregation | None = None) -> tuple[Tensor, dict[str, float]]:
    """The aggregated loss on demonstration tokens (to minimise) and its metrics.

    `logp` `[B, T]` are the log-probs of the target tokens, `mask` 1 on them; `weight` names
    the per-token weight (DEMONSTRATION_WEIGHTS: `one` = SFT, `token` / `sequence` = DFT);
    `aggregate` defaults to the token mean over this call's tokens. Metrics: `loss`, `nll`
    (the token-mean -log pi, whatever the weight, so that runs compare), `weight_mean`
    (the mean token weight)."""
    _check_name("demonstration weight", weight, DEMONSTRATION_WEIGHTS)
    aggregate = Aggregation("token-mean") if aggregate is None else aggregate
    logp = logp.to(torch.promote_types(logp.dtype, torch.float32))
    mask = mask.to(logp.dtype)
    weights = DEMONSTRATION_WEIGHTS[weight](logp, mask)
    loss = aggregate(policy_gradient_term(logp, weights, mask), mask)
    with torch.no_grad():
        metrics = {"loss": _float(loss), "nll": _float(masked_mean(-logp, mask)),
                   "weight_mean": _float(masked_mean(weights, mask))}
    return loss, metrics


# ----------------------------------------------------------------------------- on-policy distillation
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
    return _masked_delta(teacher_logp.detach().float(), student_logp.detach().float(), mask)


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
    return _float(masked_mean(-teacher_advantages(student_logp, teacher_logp, mask), mask))
