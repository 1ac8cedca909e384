"""Masked tensor helpers, the KL estimators and token entropies: the small pieces of math
that the RLVR losses (objectives.py), their metrics (loss_metrics.py), the advantage
estimators (advantages.py) and SFT/DFT (imitation.py) are written in.

Shapes: per-token tensors are `[B, T]` with `mask` 1 on the active tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

# ----------------------------------------------------------------------------- helpers


def positive(denominator: Tensor | float) -> Tensor | float:
    """A denominator that is never zero: an empty sum is divided by 1 and stays 0, not NaN."""
    if isinstance(denominator, Tensor):
        return torch.where(denominator > 0, denominator, torch.ones_like(denominator))
    return denominator if denominator > 0 else 1.0


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of `x * mask`; positions outside the mask are dropped with `where`, so an inf or
    NaN sitting in padding cannot leak into the sum."""
    x = torch.where(mask > 0, x * mask, torch.zeros_like(x))
    return x.sum() if dim is None else x.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of `x` over the masked positions; 0 where nothing is masked in."""
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(x, mask, dim) / positive(count)


def masked_delta(a: Tensor, b: Tensor, mask: Tensor) -> Tensor:
    """`a - b` on active tokens and exactly 0 elsewhere. Log-differences are zeroed *before*
    they are exponentiated: padding often holds arbitrary log-probs, and exp of those would
    overflow and turn into NaN gradients even if the result were masked afterwards."""
    return torch.where(mask > 0, a - b, torch.zeros_like(a))


def as_float(x: Tensor) -> float:
    return float(x.detach().item())


def check_name(what: str, name: str, registry: dict) -> None:
    if name not in registry:
        raise ValueError(f"unknown {what} {name!r}; choose from {sorted(registry)}")


def registrar(table: dict[str, Callable]) -> Callable[[str], Callable[[Callable], Callable]]:
    """A decorator factory: `@register("name")` puts the function in `table` under that name."""

    def register(name: str) -> Callable[[Callable], Callable]:
        def add(fn: Callable) -> Callable:
            table[name] = fn
            return fn

        return add

    return register


def active_units(ratio: Tensor, mask: Tensor) -> Tensor:
    """The units a ratio lives on: active tokens `[B, T]` for a token ratio, sequences with
    any active token `[B]` for a sequence ratio."""
    active = mask > 0
    return active if ratio.dim() == active.dim() else active.any(dim=-1)


def per_unit(advantages: Tensor, ratio: Tensor) -> Tensor:
    """Advantages at the ratio's level: `[B]` ones are shared by every token for `[B, T]`
    ratios; `[B, T]` ones (per-token, e.g. on-policy distillation's) are used as they are,
    and only a token ratio can take them."""
    if advantages.dim() == 2:
        if ratio.dim() != 2:
            raise ValueError("per-token advantages [B, T] need ratio_level 'token'")
        return advantages
    return advantages[:, None].expand_as(ratio) if ratio.dim() == 2 else advantages


def unit_weight(values: Tensor, _: object) -> Tensor:
    """A weight of 1 on every entry of `values`: the behaviour correction "none" (samples
    treated as on-policy for pi_old; their weights are still logged), and SFT's demonstration
    weight "one" (`w_t = 1` on every target token, see "SFT and DFT")."""
    return torch.ones_like(values)


# ----------------------------------------------------------------------------- KL estimators

KL_ESTIMATORS: dict[str, Callable[[Tensor], Tensor]] = {}


register_kl = registrar(KL_ESTIMATORS)


@register_kl("k1")
def kl_k1(d: Tensor) -> Tensor:
    """`-d`: unbiased but high-variance, and negative on many tokens."""
    return -d


@register_kl("k2")
def kl_k2(d: Tensor) -> Tensor:
    """`d^2 / 2`: biased but low-variance; always >= 0."""
    return 0.5 * d * d


@register_kl("k3")
def kl_k3(d: Tensor) -> Tensor:
    """`exp(d) - d - 1`: unbiased *and* always >= 0 (the GRPO choice). `expm1` keeps it
    accurate for small `d`, where it behaves like k2."""
    return torch.expm1(d) - d


def kl_penalty(logp: Tensor, ref_logp: Tensor, kind: str = "k3") -> Tensor:
    """Elementwise KL estimate of the policy to the reference; `d = ref_logp - logp`."""
    if kind not in KL_ESTIMATORS:
        raise ValueError(f"unknown kl kind {kind!r}; choose from {sorted(KL_ESTIMATORS)}")
    return KL_ESTIMATORS[kind](ref_logp - logp)


# ----------------------------------------------------------------------------- entropy


# Rows of logits whose entropy is computed at once: its four temporaries of [rows, V] are
# bounded (~64 MB each at 2**24 elements) instead of four copies of every completion token's
# logits (4.6 GiB at 1,536 tokens of a 151,936-token vocabulary: benchmarks/memory.py).
ENTROPY_CHUNK_ELEMENTS = 2**24


def _entropy_rows(logits: Tensor) -> Tensor:
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    log_probs = torch.log_softmax(logits, dim=-1)
    probs = log_probs.exp()
    safe_log_probs = torch.where(probs > 0, log_probs, torch.zeros_like(log_probs))
    return -(probs * safe_log_probs).sum(dim=-1)


def token_entropy_from_logits(logits: Tensor) -> Tensor:
    """`[..., V]` logits -> `[...]` entropies, from `log_softmax` (no exp overflow) and
    with `p log p = 0` where `p = 0`, so vocabularies masked with `-inf` stay finite; a
    chunk of rows at a time (each row's figure is computed alone either way)."""
    rows = logits.reshape(-1, logits.shape[-1])
    step = max(1, ENTROPY_CHUNK_ELEMENTS // max(1, rows.shape[1]))
    if rows.shape[0] <= step:
        return _entropy_rows(logits)
    return torch.cat([_entropy_rows(chunk) for chunk in rows.split(step)]).reshape(
        logits.shape[:-1])


def top_entropy_mask(entropy: Tensor, mask: Tensor, rho: float) -> Tensor:
    """Keep the top-`rho` share of active tokens by entropy, across the whole batch.

    Wang et al. 2025 ("Beyond the 80/20 Rule") find that RLVR's gains come from the few
    high-entropy "forking" tokens where the reasoning path branches, and that restricting
    the policy gradient to the top 20% matches or beats the full gradient. The threshold is
    the `ceil(rho * n_active)`-th largest active entropy; ties at it are all kept. Pass the
    result as `policy_loss`'s `mask`, and (to keep the paper's normalisation over all
    response tokens) `num_tokens=` the original mask's token count. `rho = 1` returns
    `mask` unchanged.
    """
    if not 0.0 < rho <= 1.0:
        raise ValueError(f"rho must be in (0, 1], got {rho}")
    mask = mask.to(torch.promote_types(mask.dtype, torch.float32))
    if rho == 1.0:
        return mask
    active = mask > 0
    n_active = int(active.sum())
    if n_active == 0:
        return mask
    k = max(1, math.ceil(rho * n_active))
    threshold = entropy.detach()[active].topk(k).values[-1]
    return torch.where(active & (entropy.detach() >= threshold), mask, torch.zeros_like(mask))
