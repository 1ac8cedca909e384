"""Learning from demonstrations: SFT and DFT as one per-token policy-gradient loss.

Pure tensor math beside `objectives` (whose aggregations it uses): `rlscale sft` computes its
loss with `demonstration_loss`. On-policy distillation's per-token advantages from a
teacher's log-probs are an advantage estimator (`rlvr.advantages`). Shapes as in
`objectives`: `[B, T]` per-token tensors with `mask` 1 on target tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .objectives import Aggregation
from .token_math import as_float, check_name, masked_mean, masked_sum, registrar, unit_weight

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
    check_name("dft weight", weight, DEMONSTRATION_WEIGHTS)
    return policy_gradient_term(logp, DEMONSTRATION_WEIGHTS[weight](logp, mask), mask)


def demonstration_loss(logp: Tensor, mask: Tensor, *, weight: str = "one",
                       aggregate: Aggregation | None = None) -> tuple[Tensor, dict[str, float]]:
    """The aggregated loss on demonstration tokens (to minimise) and its metrics.

    `logp` `[B, T]` are the log-probs of the target tokens, `mask` 1 on them; `weight` names
    the per-token weight (DEMONSTRATION_WEIGHTS: `one` = SFT, `token` / `sequence` = DFT);
    `aggregate` defaults to the token mean over this call's tokens. Metrics: `loss`, `nll`
    (the token-mean -log pi, whatever the weight, so that runs compare), `weight_mean`
    (the mean token weight)."""
    check_name("demonstration weight", weight, DEMONSTRATION_WEIGHTS)
    aggregate = Aggregation("token-mean") if aggregate is None else aggregate
    logp = logp.to(torch.promote_types(logp.dtype, torch.float32))
    mask = mask.to(logp.dtype)
    weights = DEMONSTRATION_WEIGHTS[weight](logp, mask)
    loss = aggregate(policy_gradient_term(logp, weights, mask), mask)
    with torch.no_grad():
        metrics = {"loss": as_float(loss), "nll": as_float(masked_mean(-logp, mask)),
                   "weight_mean": as_float(masked_mean(weights, mask))}
    return loss, metrics

