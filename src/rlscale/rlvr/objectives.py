"""Policy-gradient objectives for RLVR: advantages, ratios, clipping, KL, aggregation, IS.

Pure tensor math, no model and no loop. Every choice that a paper changes (how the ratio is
formed, how per-token terms are averaged, which KL estimator, how off-policy samples are
corrected) is a small function registered by name; an `Objective` is one typed record of
those choices, and `PRESETS` names the combinations the papers used. A new objective should
be a new function plus a preset, not a new branch.

SFT and DFT (the same per-token policy-gradient loss with other weights) and on-policy
distillation's per-token advantages are in `rlvr.imitation`.

Shapes: per-token tensors are `[B, T]` with `mask` 1 on completion tokens; `advantages` is
`[B]`; a group of `group_size` consecutive rows shares one prompt. Conventions are in
DESIGN.md ("Math conventions").
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from torch import Tensor

# ----------------------------------------------------------------------------- helpers


def _positive(denominator: Tensor | float) -> Tensor | float:
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
    return masked_sum(x, mask, dim) / _positive(count)


def _masked_delta(a: Tensor, b: Tensor, mask: Tensor) -> Tensor:
    """`a - b` on active tokens and exactly 0 elsewhere. Log-differences are zeroed *before*
    they are exponentiated: padding often holds arbitrary log-probs, and exp of those would
    overflow and turn into NaN gradients even if the result were masked afterwards."""
    return torch.where(mask > 0, a - b, torch.zeros_like(a))


def _float(x: Tensor) -> float:
    return float(x.detach().item())


def _share(flags: Tensor, units: Tensor) -> float:
    """Share of `units` where `flags` holds, as a python float (0 when there are no units)."""
    return int((flags & units).sum()) / max(int(units.sum()), 1)


def _check_name(what: str, name: str, registry: dict) -> None:
    if name not in registry:
        raise ValueError(f"unknown {what} {name!r}; choose from {sorted(registry)}")


def _stats(values: Tensor, keep: Tensor, empty: float) -> tuple[float, float]:
    """(mean, max) of `values[keep]` as python floats; `empty` for both if nothing is kept."""
    if not bool(keep.any()):
        return empty, empty
    kept = values.detach()[keep]
    return _float(kept.mean()), _float(kept.max())


# ----------------------------------------------------------------------------- advantages


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


def registrar(table: dict[str, Callable]) -> Callable[[str], Callable[[Callable], Callable]]:
    """A decorator factory: `@register("name")` puts the function in `table` under that name."""

    def register(name: str) -> Callable[[Callable], Callable]:
        def add(fn: Callable) -> Callable:
            table[name] = fn
            return fn

        return add

    return register


# ----------------------------------------------------------------------------- KL estimators
# Schulman, "Approximating KL Divergence" (2020). Samples come from the policy, and with
# d = ref_logp - logp = log(ref/pi) each estimator is a per-token estimate of KL(pi || ref).

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


# ----------------------------------------------------------------------------- aggregation
# How per-token terms [B, T] become one scalar. Every aggregation divides by minibatch-wide
# counts when given (`num_sequences`, `num_tokens`), so micro-batch losses sum to the
# minibatch loss exactly; otherwise by this call's own counts.

AGGREGATIONS: dict[str, Callable[..., Tensor]] = {}


register_aggregation = registrar(AGGREGATIONS)


@register_aggregation("token-mean")
def token_mean(values, mask, *, num_sequences=None, num_tokens=None, norm_length=None):
    """DAPO: every token of the minibatch weighs the same, so a long completion's tokens
    are not diluted by its length (and long bad patterns are penalised in full)."""
    total = mask.sum() if num_tokens is None else num_tokens
    return masked_sum(values, mask) / _positive(total)


@register_aggregation("seq-mean-token-mean")
def seq_mean_token_mean(values, mask, *, num_sequences=None, num_tokens=None, norm_length=None):
    """Original GRPO: average within each completion (1/|y_i|), then over completions. Each
    completion weighs the same, so a token of a long one weighs less, which Dr. GRPO shows
    biases the model towards long wrong answers."""
    per_sequence = masked_sum(values, mask, dim=-1) / _positive(mask.sum(dim=-1))
    count = values.shape[0] if num_sequences is None else num_sequences
    return per_sequence.sum() / _positive(count)


@register_aggregation("seq-mean-token-sum")
def seq_mean_token_sum(values, mask, *, num_sequences=None, num_tokens=None, norm_length=None):
    """Sum within each completion, mean over completions: the REINFORCE gradient of the
    sequence log-likelihood, and what a sequence-level ratio reduces to at theta_old."""
    count = values.shape[0] if num_sequences is None else num_sequences
    return masked_sum(values, mask) / _positive(count)


@register_aggregation("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(values, mask, *, num_sequences=None, num_tokens=None, norm_length=None):
    """Dr. GRPO (Liu et al. 2025): sum within each completion, divide by one constant (the
    generation budget), mean over completions: no length-dependent weighting at all. The
    constant must be given: the padded width of a batch changes from batch to batch."""
    if norm_length is None:
        raise ValueError("seq-mean-token-sum-norm needs norm_length (e.g. max_new_tokens)")
    count = values.shape[0] if num_sequences is None else num_sequences
    return masked_sum(values, mask) / (norm_length * _positive(count))


@dataclass(frozen=True)
class Aggregation:
    """A registered aggregation with the counts it divides by: the minibatch's rows
    (`num_sequences`) and completion tokens (`num_tokens`), and Dr. GRPO's constant
    `norm_length`. None: this call's own counts. Calling it aggregates `[B, T]` -> scalar."""

    name: str = "token-mean"
    num_sequences: int | None = None
    num_tokens: float | None = None
    norm_length: float | None = None

    def __post_init__(self) -> None:
        _check_name("aggregation", self.name, AGGREGATIONS)

    def __call__(self, values: Tensor, mask: Tensor) -> Tensor:
        return AGGREGATIONS[self.name](values, mask, num_sequences=self.num_sequences,
                                       num_tokens=self.num_tokens, norm_length=self.norm_length)


# ----------------------------------------------------------------------------- surrogates
# The clipped objective at each ratio level. Both take the ratio of their level (`[B, T]`
# tokens or `[B]` sequences), the `[B]` advantages and the detached behaviour weight of the
# same level (None: no correction), and return the loss to minimise.


def clipped_surrogate(
    ratio: Tensor, advantages: Tensor, clip_low: float, clip_high: float
) -> Tensor:
    """PPO's pessimistic surrogate `min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)`: the
    policy gets no credit for moving the ratio further than the trust region in the
    direction the advantage favours. `clip_high > clip_low` (DAPO's clip-higher) leaves more
    room to raise unlikely tokens, which fights entropy collapse."""
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    return torch.minimum(ratio * advantages, clipped * advantages)


def token_level_loss(ratio: Tensor, advantages: Tensor, mask: Tensor, *, clip_low: float,
                     clip_high: float, behaviour_weight: Tensor | None,
                     aggregate: Aggregation) -> Tensor:
    """One clipped surrogate per token, aggregated by `aggregate`:

        L = agg_{i,t} -w_{i,t} min(r_{i,t} A_{i,t}, clip(r_{i,t}, 1 - eps_low, 1 + eps_high) A_{i,t})

    `r` is `[B, T]`; `A` is `[B]` (each sequence's advantage shared by its tokens) or `[B, T]`
    (each token its own, as in on-policy distillation); `w` is the behaviour weight (1
    without a correction)."""
    surrogate = clipped_surrogate(ratio, _per_unit(advantages, ratio), clip_low, clip_high)
    if behaviour_weight is not None:
        surrogate = surrogate * behaviour_weight
    return aggregate(-surrogate, mask)


def sequence_level_loss(ratio: Tensor, advantages: Tensor, mask: Tensor, *, clip_low: float,
                        clip_high: float, behaviour_weight: Tensor | None,
                        aggregate: Aggregation) -> Tensor:
    """One clipped surrogate per sequence, averaged over the minibatch's `N` sequences:

        L = -(1/N) sum_i w_i min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)

    `s` is `[B]`. The unit that is rewarded, corrected and clipped is the sequence, so the
    token aggregation does not apply; only its `num_sequences` (N) is read. Rows without
    tokens count in N but add nothing."""
    surrogate = clipped_surrogate(ratio, _per_unit(advantages, ratio), clip_low, clip_high)
    if behaviour_weight is not None:
        surrogate = surrogate * behaviour_weight
    count = surrogate.shape[0] if aggregate.num_sequences is None else aggregate.num_sequences
    loss = torch.where(_units(ratio, mask), -surrogate, torch.zeros_like(surrogate)).sum()
    return loss / _positive(count)


def _units(ratio: Tensor, mask: Tensor) -> Tensor:
    """The units a ratio lives on: active tokens `[B, T]` for a token ratio, sequences with
    any active token `[B]` for a sequence ratio."""
    active = mask > 0
    return active if ratio.dim() == active.dim() else active.any(dim=-1)


def _per_unit(advantages: Tensor, ratio: Tensor) -> Tensor:
    """Advantages at the ratio's level: `[B]` ones are shared by every token for `[B, T]`
    ratios; `[B, T]` ones (per-token, e.g. on-policy distillation's) are used as they are,
    and only a token ratio can take them."""
    if advantages.dim() == 2:
        if ratio.dim() != 2:
            raise ValueError("per-token advantages [B, T] need ratio_level 'token'")
        return advantages
    return advantages[:, None].expand_as(ratio) if ratio.dim() == 2 else advantages


# ----------------------------------------------------------------------------- ratios
# Each level maps masked per-token log-differences [B, T] to the log of the importance ratio
# at that level ([B, T] for tokens, [B] for sequences), and names the surrogate loss that
# clips at that level.


@dataclass(frozen=True)
class RatioLevel:
    """`log_ratio(delta, mask)` forms the level's log importance ratio; `loss` is the
    surrogate that clips and averages at that level (`token_level_loss` or
    `sequence_level_loss`)."""

    log_ratio: Callable[[Tensor, Tensor], Tensor]
    loss: Callable[..., Tensor]


RATIO_LEVELS: dict[str, RatioLevel] = {}


def register_ratio_level(name: str, loss: Callable[..., Tensor]):
    def add(fn: Callable[[Tensor, Tensor], Tensor]) -> Callable[[Tensor, Tensor], Tensor]:
        RATIO_LEVELS[name] = RatioLevel(fn, loss)
        return fn

    return add


@register_ratio_level("token", token_level_loss)
def token_log_ratio(delta: Tensor, mask: Tensor) -> Tensor:
    """PPO/GRPO: one ratio per token, clipped token by token."""
    return delta


@register_ratio_level("sequence", sequence_level_loss)
def sequence_log_ratio(delta: Tensor, mask: Tensor) -> Tensor:
    """The exact likelihood ratio of the whole completion, `sum_t`: the unit that is
    rewarded is the sequence, so that is the unit corrected and clipped. Its spread grows
    with length, so it suits short completions or wide clips."""
    return delta.sum(dim=-1)


@register_ratio_level("sequence_mean", sequence_level_loss)
def sequence_mean_log_ratio(delta: Tensor, mask: Tensor) -> Tensor:
    """GSPO (Zheng et al. 2025): the geometric mean of the token ratios, `mean_t`, so that
    one clip range fits every length. Its gradient reaches every token of the sequence
    with weight `s_i / |y_i|`, the GSPO gradient, through autograd."""
    return delta.sum(dim=-1) / _positive(mask.sum(dim=-1))


def sequence_ratio(
    logp: Tensor, old_logp: Tensor, mask: Tensor, *, length_normalize: bool = False
) -> Tensor:
    """`[B]` sequence ratios `exp(sum_t (logp - old_logp))`, or with `length_normalize`
    GSPO's `exp(mean_t ...)`, over the masked tokens."""
    level = RATIO_LEVELS["sequence_mean" if length_normalize else "sequence"]
    return torch.exp(level.log_ratio(_masked_delta(logp, old_logp.detach(), mask), mask))


def behaviour_mismatch(old_logp: Tensor, behaviour_logp: Tensor, mask: Tensor,
                       lag: Tensor) -> dict[str, float]:
    """The factor pi_old/mu of the full ratio, measured apart on fresh and on lagged tokens.

    On tokens drawn by the very weights being trained (`lag == 0`) the gap between the
    trainer's pi_old and the sampler's mu is the engine mismatch alone (another dtype,
    kernels, top-p truncation); on older tokens it also holds the staleness drift. Each is
    reported as KL(mu || pi_old) per token by the k3 estimator on mu's own samples: with
    `d = log pi_old - log mu`, `E_mu[exp(d) - d - 1] = KL(mu || pi_old)`, never negative.
    """
    kl = kl_k3((old_logp - behaviour_logp).detach().float())
    active = mask > 0
    out: dict[str, float] = {"behaviour/stale_token_share": _share(lag > 0, active)}
    for name, keep in (("engine_kl", active & (lag == 0)), ("stale_kl", active & (lag > 0))):
        if bool(keep.any()):
            out[f"behaviour/{name}"] = _float(kl[keep].mean())
    return out


# ----------------------------------------------------------------------------- behaviour correction
# The sampler's log-probs mu differ from the trainer's pi_old (other kernels, precision,
# stale weights in async runs). The weight w = pi_old / mu is detached, formed at the same
# level as the ratio, and bounded so one odd sample cannot dominate the batch.

def unit_weight(values: Tensor, _: object) -> Tensor:
    """A weight of 1 on every entry of `values`: the behaviour correction "none" (samples
    treated as on-policy for pi_old; their weights are still logged), and SFT's demonstration
    weight "one" (`w_t = 1` on every target token, see "SFT and DFT")."""
    return torch.ones_like(values)


BEHAVIOUR_CORRECTIONS: dict[str, Callable[[Tensor, float], Tensor]] = {"none": unit_weight}


register_behaviour_correction = registrar(BEHAVIOUR_CORRECTIONS)


@register_behaviour_correction("tis")
def truncated_importance_sampling(weight: Tensor, threshold: float) -> Tensor:
    """TIS: `min(w, C)`. Bounded variance at the price of a little bias on rare tokens."""
    return weight.clamp(max=threshold)


@register_behaviour_correction("mis")
def masked_importance_sampling(weight: Tensor, threshold: float) -> Tensor:
    """MIS: keep `w` inside `[1/C, C]`, drop the rest. Samples that far off-policy are
    treated as noise rather than down-weighted evidence."""
    inside = (weight >= 1.0 / threshold) & (weight <= threshold)
    return torch.where(inside, weight, torch.zeros_like(weight))


# ----------------------------------------------------------------------------- the loss


@dataclass(frozen=True)
class LossInputs:
    """What the loss reads of one (micro-)batch.

    `logp` carries the gradient; `old_logp` (the trainer's pi_old), `behaviour_logp` (the
    sampler's mu; None: no correction, and no weight metrics) and `ref_logp` (the reference's;
    None: no KL) are treated as constants. All are `[B, T]` with `mask` 1 on the tokens that
    get the gradient; `advantages` is `[B]`, or `[B, T]` per-token advantages (token ratios
    only). `num_sequences` / `num_tokens` are the minibatch's row and token counts (None: this
    call's own); pass them when the minibatch is split into micro-batches and the micro-batch
    losses (or their gradients) are summed, which then equals the whole-minibatch loss exactly.
    """

    logp: Tensor
    old_logp: Tensor
    advantages: Tensor
    mask: Tensor
    behaviour_logp: Tensor | None = None
    ref_logp: Tensor | None = None
    num_sequences: int | None = None
    num_tokens: float | None = None


@dataclass(frozen=True)
class LossMetrics:
    """The figures of one `policy_loss` call, over its active units (tokens, or sequences for
    sequence ratios); `as_dict` gives them under their logged names."""

    policy_loss: float      # loss/policy: the clipped surrogate alone
    total_loss: float       # loss: what is minimised (surrogate + kl_coef * KL term)
    kl_old_new: float       # kl/old_new: KL(pi_old || pi_theta) per token (k3): how far it moved
    kl_mean: float | None   # kl/mean: KL to the reference per token; None without ref_logp
    kl_loss: float | None   # kl/loss: the aggregated KL term; None when kl_coef is 0
    ratio: dict[str, float]      # ratio_metrics: clip shares, ratio mean and max
    behaviour: dict[str, float]  # behaviour_weight_metrics; empty without behaviour_logp

    def as_dict(self) -> dict[str, float]:
        """The metrics by their logged names, in the order they have always been logged."""
        out = dict(self.behaviour)
        if self.kl_mean is not None:
            out["kl/mean"] = self.kl_mean
        if self.kl_loss is not None:
            out["kl/loss"] = self.kl_loss
        out.update(self.ratio)
        out["kl/old_new"] = self.kl_old_new
        out["loss/policy"] = self.policy_loss
        out["loss"] = self.total_loss
        return out


@dataclass(frozen=True)
class LossOutput:
    loss: Tensor  # the scalar to minimise
    metrics: LossMetrics


def policy_loss(inputs: LossInputs, objective: Objective) -> LossOutput:
    """Clipped policy-gradient loss (to minimise) and its metrics.

    `objective.ratio_level` names the level (RATIO_LEVELS) whose surrogate this dispatches
    to: `token_level_loss` (one clipped surrogate per token, aggregated with
    `objective.aggregation`) or `sequence_level_loss` (one per sequence, averaged over
    sequences). The KL term, `kl_coef` times the per-token KL, always uses the aggregation.
    The objective's names were checked when it was made; only what depends on the inputs is
    checked here.
    """
    o = objective
    if o.is_correction != "none" and inputs.behaviour_logp is None:
        raise ValueError(f"is_correction={o.is_correction!r} needs behaviour_logp")
    if o.kl_coef != 0.0 and inputs.ref_logp is None:
        raise ValueError("kl_coef != 0 needs ref_logp")

    # Low-precision log-probs (bf16) lose the small differences that ratios are made of.
    dtype = torch.promote_types(inputs.logp.dtype, torch.float32)
    logp = inputs.logp.to(dtype)
    mask = inputs.mask.to(dtype)
    level = RATIO_LEVELS[o.ratio_level]
    aggregate = Aggregation(o.aggregation, inputs.num_sequences, inputs.num_tokens, o.norm_length)

    old_logp = inputs.old_logp.detach().to(dtype)
    ratio = torch.exp(level.log_ratio(_masked_delta(logp, old_logp, mask), mask))
    advantages = inputs.advantages.detach().to(dtype)
    units = _units(ratio, mask)

    behaviour: dict[str, float] = {}
    weight = None
    if inputs.behaviour_logp is not None:
        behaviour_logp = inputs.behaviour_logp.detach().to(dtype)
        raw_weight = torch.exp(level.log_ratio(_masked_delta(old_logp, behaviour_logp, mask), mask))
        weight = BEHAVIOUR_CORRECTIONS[o.is_correction](raw_weight, o.is_threshold)
        behaviour = behaviour_weight_metrics(raw_weight, units, o.is_threshold)

    pg_loss = level.loss(ratio, advantages, mask, clip_low=o.clip_low, clip_high=o.clip_high,
                         behaviour_weight=weight, aggregate=aggregate)
    loss = pg_loss
    kl_mean = kl_loss_value = None
    if inputs.ref_logp is not None:
        kl = KL_ESTIMATORS[o.kl_kind](_masked_delta(inputs.ref_logp.detach().to(dtype), logp, mask))
        kl_mean = _float(masked_mean(kl, mask))
        if o.kl_coef != 0.0:
            kl_loss = aggregate(kl, mask)
            kl_loss_value = _float(kl_loss)
            loss = loss + o.kl_coef * kl_loss

    ratio_figures = {**ratio_metrics(ratio, advantages, units, o.clip_low, o.clip_high),
                     **log_ratio_spread(_masked_delta(logp, old_logp, mask), mask)}
    metrics = LossMetrics(
        policy_loss=_float(pg_loss), total_loss=_float(loss),
        kl_old_new=_float(masked_mean(kl_k3(_masked_delta(logp, old_logp, mask)), mask)),
        kl_mean=kl_mean, kl_loss=kl_loss_value, ratio=ratio_figures, behaviour=behaviour)
    return LossOutput(loss, metrics)


@torch.no_grad()
def ratio_metrics(ratio: Tensor, advantages: Tensor, units: Tensor, clip_low: float,
                  clip_high: float) -> dict[str, float]:
    """Clip shares and ratio statistics over the active `units` (tokens or sequences).

    `clip/low_frac` counts units where `A < 0` and `r < 1 - clip_low`, `clip/high_frac`
    units where `A > 0` and `r > 1 + clip_high`: exactly the cases where the min picks the
    clipped branch and it differs."""
    advantages = _per_unit(advantages, ratio)
    low = _share((advantages < 0) & (ratio < 1.0 - clip_low), units)
    high = _share((advantages > 0) & (ratio > 1.0 + clip_high), units)
    mean, largest = _stats(ratio, units, 1.0)
    return {"clip/low_frac": low, "clip/high_frac": high, "clip/frac": low + high,
            "ratio/mean": mean, "ratio/max": largest}


@torch.no_grad()
def log_ratio_spread(delta: Tensor, mask: Tensor) -> dict[str, float]:
    """The spread of the importance ratio at both levels, whatever level the objective
    uses: the variance of the token log-ratios `delta` over active tokens, and of the
    sequence log-ratios `sum_t delta_t` over sequences with an active token (logs: the
    ratio itself is ruled by a few outliers). 0 where there are fewer than two units; both
    are exactly 0 on-policy, where every ratio is 1."""
    active = mask > 0
    sequences = active.any(dim=-1)
    tokens = delta.detach()[active]
    sums = (delta.detach() * active).sum(dim=-1)[sequences]
    return {"ratio/token_log_var": _float(tokens.var()) if tokens.numel() > 1 else 0.0,
            "ratio/sequence_log_var": _float(sums.var()) if sums.numel() > 1 else 0.0}


def behaviour_weight_metrics(raw_weight: Tensor, units: Tensor,
                             threshold: float) -> dict[str, float]:
    """The raw behaviour weights pi_old/mu over the active `units`, before truncation or
    masking: mean and max, and the shares that TIS would truncate (`w > C`) and MIS would
    mask (`w` outside `[1/C, C]`)."""
    inside = (raw_weight >= 1.0 / threshold) & (raw_weight <= threshold)
    mean, largest = _stats(raw_weight, units, 1.0)
    return {"behaviour/weight_mean": mean, "behaviour/weight_max": largest,
            "behaviour/truncated_frac": _share(raw_weight > threshold, units),
            "behaviour/masked_frac": _share(~inside, units)}


# ----------------------------------------------------------------------------- entropy


def token_entropy_from_logits(logits: Tensor) -> Tensor:
    """`[B, T, V]` logits -> `[B, T]` entropies, from `log_softmax` (no exp overflow) and
    with `p log p = 0` where `p = 0`, so vocabularies masked with `-inf` stay finite."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    log_probs = torch.log_softmax(logits, dim=-1)
    probs = log_probs.exp()
    safe_log_probs = torch.where(probs > 0, log_probs, torch.zeros_like(log_probs))
    return -(probs * safe_log_probs).sum(dim=-1)


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


# ----------------------------------------------------------------------------- objectives


def _named(default: str, registry: dict) -> Any:
    """An `Objective` field that names an entry of `registry`: the registry's keys are its
    allowed values, for the record and for the `loss.*` config built from it."""
    return field(default=default, metadata={"choices": registry})


def _number(default: float | None, **bounds: float) -> Any:
    """An `Objective` field bounded by `bounds` (pydantic's names: ge, gt, le; None passes),
    for the record and for the `loss.*` config built from it."""
    return field(default=default, metadata={"bounds": bounds})


_BOUNDS: dict[str, tuple[Callable[[Any, Any], bool], str]] = {
    "ge": (operator.ge, ">="), "gt": (operator.gt, ">"), "le": (operator.le, "<=")}


@dataclass(frozen=True)
class Objective:
    """Every choice of an RLVR objective, as one typed record read by the loop and trainer.

    A preset is an instance (`PRESETS`); a run's `loss.*` overrides are applied with
    `dataclasses.replace`. Names are checked against the registries above and numbers against
    their bounds, once, when a record is made; the `loss.*` config (rlvr.config.LossConfig) is
    built from these fields, their registries and bounds. The defaults are the library's
    ("off" for every refinement), not any one paper's.
    """

    # advantages (group_advantages)
    advantage_std_normalize: bool = False
    advantage_leave_one_out: bool = False
    # the clipped surrogate (policy_loss)
    ratio_level: str = _named("token", RATIO_LEVELS)
    clip_low: float = _number(0.2, ge=0)
    clip_high: float = _number(0.2, ge=0)
    aggregation: str = _named("seq-mean-token-mean", AGGREGATIONS)
    norm_length: int | None = _number(None, ge=1)  # None: the loop's max_new_tokens
    # KL to the frozen reference, in the loss
    kl_coef: float = _number(0.0, ge=0)
    kl_kind: str = _named("k3", KL_ESTIMATORS)
    # dynamic sampling: drop groups whose rewards are all equal, and refill
    dynamic_sampling: bool = False
    # DAPO's soft overlong punishment (shaping.SHAPING_TERMS): `overlong_buffer_frac` is the
    # share of max_new_tokens, at the end of the budget, over which it ramps from 0 to -1;
    # 0.2 is DAPO's 4096-token buffer on a 20480-token budget.
    overlong_penalty: bool = False
    overlong_buffer_frac: float = _number(0.2, gt=0, le=1)
    # behaviour correction of pi_old / mu (BEHAVIOUR_CORRECTIONS)
    is_correction: str = _named("none", BEHAVIOUR_CORRECTIONS)
    is_threshold: float = _number(2.0, gt=1)
    # length shaping terms that no preset sets (shaping.SHAPING_TERMS; 0 is off)
    length_penalty_per_token: float = _number(0.0, ge=0)
    adaptive_length_penalty: float = _number(0.0, ge=0)
    # the policy gradient on the top-rho share of tokens by entropy only (1: all tokens)
    entropy_top_rho: float = _number(1.0, gt=0, le=1)
    # the advantage mix (mixed_advantages): the verifier's group-relative sequence advantage
    # times `reward_weight`, plus the teacher's per-token one times `teacher_weight` (which
    # needs `teacher.path` and token ratios)
    reward_weight: float = _number(1.0, ge=0)
    teacher_weight: float = _number(0.0, ge=0)

    def __post_init__(self) -> None:
        for spec in fields(self):
            value = getattr(self, spec.name)
            if "choices" in spec.metadata:
                _check_name(spec.name, value, spec.metadata["choices"])
            for bound, limit in spec.metadata.get("bounds", {}).items():
                holds, sign = _BOUNDS[bound]
                if value is not None and not holds(value, limit):
                    raise ValueError(f"{spec.name} must be {sign} {limit}, got {value!r}")
        if self.teacher_weight and self.ratio_level != "token":
            raise ValueError(f"teacher_weight > 0 gives per-token advantages, which need "
                             f"ratio_level 'token' (got {self.ratio_level!r})")

    @property
    def uses_teacher(self) -> bool:
        return self.teacher_weight != 0.0


PRESETS: dict[str, Objective] = {
    # GRPO (Shao et al. 2024, DeepSeekMath): group-relative advantages, PPO token ratios
    # clipped at 0.2, per-sequence token mean (1/|y_i|), k3 KL to the reference in the loss
    # with beta = 0.04. The paper also divides by the group std; our design makes that a
    # flag, off by default (`loss.advantage_std_normalize=true` restores it), because it
    # up-weights near-uniform groups (Dr. GRPO's question-difficulty bias).
    "grpo": Objective(
        advantage_std_normalize=False, ratio_level="token", clip_low=0.2, clip_high=0.2,
        aggregation="seq-mean-token-mean", kl_coef=0.04, kl_kind="k3"),
    # Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): removes GRPO's two
    # normalisations that bias optimisation: no std division (question-difficulty bias)
    # and no 1/|y_i| (length bias; sum tokens and divide by a constant). No KL term.
    "dr_grpo": Objective(
        advantage_std_normalize=False, ratio_level="token", clip_low=0.2, clip_high=0.2,
        aggregation="seq-mean-token-sum-norm", kl_coef=0.0),
    # DAPO (Yu et al. 2025): clip-higher (0.2 / 0.28) against entropy collapse,
    # token-level mean, dynamic sampling (drop groups whose rewards are all equal and
    # refill), soft overlong punishment instead of truncation noise, no KL.
    "dapo": Objective(
        advantage_std_normalize=True, ratio_level="token", clip_low=0.2, clip_high=0.28,
        aggregation="token-mean", kl_coef=0.0, dynamic_sampling=True, overlong_penalty=True,
        overlong_buffer_frac=0.2),
    # GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"): one length-normalised
    # sequence ratio (geometric mean of token ratios) clipped as a unit, with the paper's
    # very narrow range (3e-4 / 4e-4); group-normalised advantages, no KL.
    "gspo": Objective(
        advantage_std_normalize=True, ratio_level="sequence_mean", clip_low=3e-4,
        clip_high=4e-4, aggregation="seq-mean-token-mean", kl_coef=0.0),
    # Sequence-level PPO: the exact likelihood ratio of the completion, the unit the
    # verifier rewards, clipped at 0.2; mean-centred advantages (the library default), no
    # KL. The ratio's spread grows with length, so it suits short completions.
    "sequence": Objective(
        advantage_std_normalize=False, ratio_level="sequence", clip_low=0.2, clip_high=0.2,
        aggregation="seq-mean-token-mean", kl_coef=0.0),
    # On-policy distillation (Agarwal et al. 2024; Thinking Machines 2025): per-token
    # advantages from the teacher's log-probs on the student's samples (teacher_advantages),
    # through the same clipped token ratio; token mean, since every token carries its own
    # signal. No verifier term (`loss.reward_weight` > 0 mixes it in) and no KL to the
    # reference (the teacher is the anchor).
    "opd": Objective(
        ratio_level="token", clip_low=0.2, clip_high=0.2, aggregation="token-mean",
        kl_coef=0.0, reward_weight=0.0, teacher_weight=1.0),
}
