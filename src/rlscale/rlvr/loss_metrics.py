"""The figures a policy-gradient loss reports: clip shares, ratio statistics, the spread of
the log-ratios, the behaviour weights pi_old/mu, and the engine/staleness mismatch. Read
under `torch.no_grad`; nothing here changes the loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .token_math import as_float, kl_k3, per_unit


def share(flags: Tensor, units: Tensor) -> float:
    """Share of `units` where `flags` holds, as a python float (0 when there are no units)."""
    return int((flags & units).sum()) / max(int(units.sum()), 1)


def kept_stats(values: Tensor, keep: Tensor, empty: float) -> tuple[float, float]:
    """(mean, max) of `values[keep]` as python floats; `empty` for both if nothing is kept."""
    if not bool(keep.any()):
        return empty, empty
    kept = values.detach()[keep]
    return as_float(kept.mean()), as_float(kept.max())


@dataclass(frozen=True)
class RatioFigures:
    """What the ratio figures are read from: the ratios over their `units`, the advantages,
    the clip range, and the token log-ratios `delta` with their `mask`."""

    ratio: Tensor
    advantages: Tensor
    units: Tensor
    clip_low: float
    clip_high: float
    delta: Tensor
    mask: Tensor

    def figures(self) -> dict[str, float]:
        return {**ratio_metrics(self.ratio, self.advantages, self.units, self.clip_low,
                                self.clip_high),
                **clip_by_length(self.ratio, self.advantages, self.units, self.clip_low,
                                 self.clip_high, self.mask),
                **log_ratio_spread(self.delta, self.mask)}


@dataclass(frozen=True)
class BehaviourFigures:
    """What the behaviour-weight figures are read from: the raw weights pi_old/mu over their
    `units`, and the correction's threshold."""

    raw_weight: Tensor
    units: Tensor
    threshold: float

    def figures(self) -> dict[str, float]:
        return behaviour_weight_metrics(self.raw_weight, self.units, self.threshold)


@dataclass(frozen=True)
class LossMetrics:
    """The figures of one `policy_loss` call, over its active units (tokens, or sequences for
    sequence ratios), held as detached tensors: nothing is read back to the host until
    `as_dict` (at logging), so a micro-batch's loss queues its work without a sync."""

    policy_loss: Tensor     # loss/policy: the clipped surrogate alone
    total_loss: Tensor      # loss: what is minimised (surrogate + kl_coef * KL term)
    kl_old_new: Tensor      # kl/old_new: KL(pi_old || pi_theta) per token (k3): how far it moved
    kl_mean: Tensor | None  # kl/mean: KL to the reference per token; None without ref_logp
    kl_loss: Tensor | None  # kl/loss: the aggregated KL term; None when kl_coef is 0
    ratio: RatioFigures     # clip shares, ratio mean and max, log-ratio spread
    behaviour: BehaviourFigures | None  # None without behaviour_logp

    def as_dict(self) -> dict[str, float]:
        """The metrics by their logged names, in the order they have always been logged."""
        out = {} if self.behaviour is None else self.behaviour.figures()
        if self.kl_mean is not None:
            out["kl/mean"] = as_float(self.kl_mean)
        if self.kl_loss is not None:
            out["kl/loss"] = as_float(self.kl_loss)
        out.update(self.ratio.figures())
        out["kl/old_new"] = as_float(self.kl_old_new)
        out["loss/policy"] = as_float(self.policy_loss)
        out["loss"] = as_float(self.total_loss)
        return out


@torch.no_grad()
def ratio_metrics(ratio: Tensor, advantages: Tensor, units: Tensor, clip_low: float,
                  clip_high: float) -> dict[str, float]:
    """Clip shares and ratio statistics over the active `units` (tokens or sequences).

    `clip/low_frac` counts units where `A < 0` and `r < 1 - clip_low`, `clip/high_frac`
    units where `A > 0` and `r > 1 + clip_high`: exactly the cases where the min picks the
    clipped branch and it differs."""
    low, high = clipped_sides(ratio, advantages, clip_low, clip_high)
    mean, largest = kept_stats(ratio, units, 1.0)
    low_share, high_share = share(low, units), share(high, units)
    return {"clip/low_frac": low_share, "clip/high_frac": high_share,
            "clip/frac": low_share + high_share, "ratio/mean": mean, "ratio/max": largest}


def clipped_sides(ratio: Tensor, advantages: Tensor, clip_low: float,
                  clip_high: float) -> tuple[Tensor, Tensor]:
    """Where the clipped branch binds, below (`A < 0`, `r < 1 - clip_low`) and above
    (`A > 0`, `r > 1 + clip_high`), at the ratio's level."""
    advantages = per_unit(advantages, ratio)
    return ((advantages < 0) & (ratio < 1.0 - clip_low),
            (advantages > 0) & (ratio > 1.0 + clip_high))


@torch.no_grad()
def clip_by_length(ratio: Tensor, advantages: Tensor, units: Tensor, clip_low: float,
                   clip_high: float, mask: Tensor) -> dict[str, float]:
    """The clip share of the short and of the long completions: `clip/frac_short` over the
    units of the completions no longer than the batch's median length, `clip/frac_long` over
    the longer ones (both 0 where a half has no unit). One clip range for every length is
    what GSPO's length normalisation questions (docs/objectives.md)."""
    low, high = clipped_sides(ratio, advantages, clip_low, clip_high)
    clipped = (low | high) & units
    lengths = mask.sum(dim=1)
    if ratio.dim() == 2:          # token units: each row's clipped and active tokens
        hits, counts = clipped.sum(dim=1).float(), units.sum(dim=1).float()
    else:                         # one unit per sequence
        hits, counts = clipped.float(), units.float()
    active = counts > 0
    if not bool(active.any()):
        return {"clip/frac_short": 0.0, "clip/frac_long": 0.0}
    median = lengths[active].float().median()
    out = {}
    for name, half in (("short", lengths <= median), ("long", lengths > median)):
        chosen = active & half
        out[f"clip/frac_{name}"] = as_float(hits[chosen].sum() / counts[chosen].sum()) \
            if bool(chosen.any()) else 0.0
    return out


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
    return {"ratio/token_log_var": as_float(tokens.var()) if tokens.numel() > 1 else 0.0,
            "ratio/sequence_log_var": as_float(sums.var()) if sums.numel() > 1 else 0.0}


def behaviour_weight_metrics(raw_weight: Tensor, units: Tensor,
                             threshold: float) -> dict[str, float]:
    """The raw behaviour weights pi_old/mu over the active `units`, before truncation or
    masking: mean and max, and the shares that TIS would truncate (`w > C`) and MIS would
    mask (`w` outside `[1/C, C]`)."""
    inside = (raw_weight >= 1.0 / threshold) & (raw_weight <= threshold)
    mean, largest = kept_stats(raw_weight, units, 1.0)
    return {"behaviour/weight_mean": mean, "behaviour/weight_max": largest,
            "behaviour/truncated_frac": share(raw_weight > threshold, units),
            "behaviour/masked_frac": share(~inside, units)}


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
    out: dict[str, float] = {"behaviour/stale_token_share": share(lag > 0, active)}
    for name, keep in (("engine_kl", active & (lag == 0)), ("stale_kl", active & (lag > 0))):
        if bool(keep.any()):
            out[f"behaviour/{name}"] = as_float(kl[keep].mean())
    return out
