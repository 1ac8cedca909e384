"""Policy-gradient objectives for RLVR: advantages, ratios, clipping, KL, aggregation, IS.

Pure tensor math, no model and no loop. Every choice that a paper changes (how the ratio is
formed, how per-token terms are averaged, which KL estimator, how off-policy samples are
corrected) is a small function registered by name, and `PRESETS` names the combinations the
papers used. A new objective should be a new function plus a preset, not a new branch.

Shapes: per-token tensors are `[B, T]` with `mask` 1 on completion tokens; `advantages` is
`[B]`; a group of `group_size` consecutive rows shares one prompt. Conventions are in
DESIGN.md ("Math conventions").
"""

from __future__ import annotations

import math
from collections.abc import Callable

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


# ----------------------------------------------------------------------------- KL estimators
# Schulman, "Approximating KL Divergence" (2020). Samples come from the policy, and with
# d = ref_logp - logp = log(ref/pi) each estimator is a per-token estimate of KL(pi || ref).

KL_ESTIMATORS: dict[str, Callable[[Tensor], Tensor]] = {}


def register_kl(name: str):
    def add(fn: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
        KL_ESTIMATORS[name] = fn
        return fn

    return add


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


# ----------------------------------------------------------------------------- ratios
# Each level maps masked per-token log-differences [B, T] to the log of the importance ratio
# at that level: [B, T] for tokens, [B] for sequences.

RATIO_LEVELS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {}


def register_ratio_level(name: str):
    def add(fn: Callable[[Tensor, Tensor], Tensor]) -> Callable[[Tensor, Tensor], Tensor]:
        RATIO_LEVELS[name] = fn
        return fn

    return add


@register_ratio_level("token")
def token_log_ratio(delta: Tensor, mask: Tensor) -> Tensor:
    """PPO/GRPO: one ratio per token, clipped token by token."""
    return delta


@register_ratio_level("sequence")
def sequence_log_ratio(delta: Tensor, mask: Tensor) -> Tensor:
    """The exact likelihood ratio of the whole completion, `sum_t`: the unit that is
    rewarded is the sequence, so that is the unit corrected and clipped. Its spread grows
    with length, so it suits short completions or wide clips."""
    return delta.sum(dim=-1)


@register_ratio_level("sequence_mean")
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
    return torch.exp(level(_masked_delta(logp, old_logp.detach(), mask), mask))


def clipped_surrogate(
    ratio: Tensor, advantages: Tensor, clip_low: float, clip_high: float
) -> Tensor:
    """PPO's pessimistic surrogate `min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)`: the
    policy gets no credit for moving the ratio further than the trust region in the
    direction the advantage favours. `clip_high > clip_low` (DAPO's clip-higher) leaves more
    room to raise unlikely tokens, which fights entropy collapse."""
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    return torch.minimum(ratio * advantages, clipped * advantages)


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

BEHAVIOUR_CORRECTIONS: dict[str, Callable[[Tensor, float], Tensor]] = {}


def register_behaviour_correction(name: str):
    def add(fn: Callable[[Tensor, float], Tensor]) -> Callable[[Tensor, float], Tensor]:
        BEHAVIOUR_CORRECTIONS[name] = fn
        return fn

    return add


@register_behaviour_correction("none")
def no_correction(weight: Tensor, threshold: float) -> Tensor:
    """Treat samples as on-policy for pi_old (the weights are still logged)."""
    return torch.ones_like(weight)


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


# ----------------------------------------------------------------------------- aggregation
# How per-token terms [B, T] become one scalar. Every aggregation divides by minibatch-wide
# counts when given (`num_sequences`, `num_tokens`), so micro-batch losses sum to the
# minibatch loss exactly; otherwise by this call's own counts.

AGGREGATIONS: dict[str, Callable[..., Tensor]] = {}


def register_aggregation(name: str):
    def add(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
        AGGREGATIONS[name] = fn
        return fn

    return add


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


# ----------------------------------------------------------------------------- the loss


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    ratio_level: str = "token",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    aggregation: str = "seq-mean-token-mean",
    norm_length: float | None = None,
    behaviour_logp: Tensor | None = None,
    is_correction: str = "none",
    is_threshold: float = 2.0,
    ref_logp: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_kind: str = "k3",
    num_sequences: int | None = None,
    num_tokens: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped policy-gradient loss (to minimise) and its metrics.

    `logp` carries the gradient; `old_logp` (the trainer's pi_old), `behaviour_logp` (the
    sampler's mu) and `ref_logp` are treated as constants. All are `[B, T]`, `advantages`
    is `[B]`.

    Token-level ratios give one clipped surrogate per token, aggregated with
    `aggregation` together with `kl_coef` times the per-token KL. Sequence-level ratios
    give one surrogate per sequence, averaged over sequences (rows without tokens count in
    the denominator but add nothing); the KL term is still per token and uses
    `aggregation`.

    `num_sequences` / `num_tokens` are the minibatch's row and token counts; pass them
    when the minibatch is split into micro-batches and the micro-batch losses (or their
    gradients) are summed, which then equals the whole-minibatch loss exactly.

    Metrics are over this call's active units (tokens, or sequences for sequence ratios):
    `clip/low_frac` counts units where `A < 0` and `r < 1 - clip_low`, `clip/high_frac`
    units where `A > 0` and `r > 1 + clip_high` (exactly the cases where the min picks the
    clipped branch and it differs).
    """
    if ratio_level not in RATIO_LEVELS:
        raise ValueError(f"unknown ratio_level {ratio_level!r}; choose from {sorted(RATIO_LEVELS)}")
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}; choose from {sorted(AGGREGATIONS)}")
    if is_correction not in BEHAVIOUR_CORRECTIONS:
        raise ValueError(
            f"unknown is_correction {is_correction!r}; choose from {sorted(BEHAVIOUR_CORRECTIONS)}"
        )
    if is_correction != "none" and behaviour_logp is None:
        raise ValueError(f"is_correction={is_correction!r} needs behaviour_logp")
    if kl_coef != 0.0 and ref_logp is None:
        raise ValueError("kl_coef != 0 needs ref_logp")

    # Low-precision log-probs (bf16) lose the small differences that ratios are made of.
    dtype = torch.promote_types(logp.dtype, torch.float32)
    logp = logp.to(dtype)
    mask = mask.to(dtype)
    active = mask > 0
    to_level = RATIO_LEVELS[ratio_level]
    token_level = ratio_level == "token"
    aggregate_kwargs = dict(
        num_sequences=num_sequences, num_tokens=num_tokens, norm_length=norm_length
    )

    old_logp = old_logp.detach().to(dtype)
    log_ratio = to_level(_masked_delta(logp, old_logp, mask), mask)
    ratio = torch.exp(log_ratio)
    adv = advantages.detach().to(dtype)
    if token_level:
        adv = adv[:, None].expand_as(ratio)
        units = active
    else:
        units = active.any(dim=-1)
    surrogate = clipped_surrogate(ratio, adv, clip_low, clip_high)

    metrics: dict[str, float] = {}
    if behaviour_logp is not None:
        behaviour_logp = behaviour_logp.detach().to(dtype)
        raw_weight = torch.exp(to_level(_masked_delta(old_logp, behaviour_logp, mask), mask))
        surrogate = surrogate * BEHAVIOUR_CORRECTIONS[is_correction](raw_weight, is_threshold)
        inside = (raw_weight >= 1.0 / is_threshold) & (raw_weight <= is_threshold)
        metrics["behaviour/weight_mean"], metrics["behaviour/weight_max"] = _stats(
            raw_weight, units, 1.0
        )
        metrics["behaviour/truncated_frac"] = _share(raw_weight > is_threshold, units)
        metrics["behaviour/masked_frac"] = _share(~inside, units)

    if token_level:
        pg_loss = AGGREGATIONS[aggregation](-surrogate, mask, **aggregate_kwargs)
    else:
        count = surrogate.shape[0] if num_sequences is None else num_sequences
        pg_loss = torch.where(units, -surrogate, torch.zeros_like(surrogate)).sum()
        pg_loss = pg_loss / _positive(count)

    loss = pg_loss
    if ref_logp is not None:
        if kl_kind not in KL_ESTIMATORS:
            raise ValueError(f"unknown kl kind {kl_kind!r}; choose from {sorted(KL_ESTIMATORS)}")
        kl = KL_ESTIMATORS[kl_kind](_masked_delta(ref_logp.detach().to(dtype), logp, mask))
        metrics["kl/mean"] = _float(masked_mean(kl, mask))
        if kl_coef != 0.0:
            kl_loss = AGGREGATIONS[aggregation](kl, mask, **aggregate_kwargs)
            metrics["kl/loss"] = _float(kl_loss)
            loss = loss + kl_coef * kl_loss

    with torch.no_grad():
        metrics["clip/low_frac"] = _share((adv < 0) & (ratio < 1.0 - clip_low), units)
        metrics["clip/high_frac"] = _share((adv > 0) & (ratio > 1.0 + clip_high), units)
        metrics["clip/frac"] = metrics["clip/low_frac"] + metrics["clip/high_frac"]
        metrics["ratio/mean"], metrics["ratio/max"] = _stats(ratio, units, 1.0)
        # KL(pi_old || pi_theta) per token (k3 on the old samples): how far this update moved.
        metrics["kl/old_new"] = _float(
            masked_mean(kl_k3(_masked_delta(logp, old_logp, mask)), mask)
        )
    metrics["loss/policy"] = _float(pg_loss)
    metrics["loss"] = _float(loss)
    return loss, metrics


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


# ----------------------------------------------------------------------------- presets
# Plain dictionaries of config fields the loop reads; no code path depends on a preset's
# name. `norm_length: None` means "use the loop's max_new_tokens". `overlong_buffer_frac` is
# the share of max_new_tokens, at the end of the budget, over which DAPO's soft overlong
# punishment ramps from 0 to -1 (read only when `overlong_penalty` is on); 0.2 is DAPO's
# 4096-token buffer on a 20480-token budget.

PRESETS: dict[str, dict] = {
    # GRPO (Shao et al. 2024, DeepSeekMath): group-relative advantages, PPO token ratios
    # clipped at 0.2, per-sequence token mean (1/|y_i|), k3 KL to the reference in the loss
    # with beta = 0.04. The paper also divides by the group std; our design makes that a
    # flag, off by default (`loss.advantage_std_normalize=true` restores it), because it
    # up-weights near-uniform groups (Dr. GRPO's question-difficulty bias).
    "grpo": {
        "advantage_std_normalize": False,
        "advantage_leave_one_out": False,
        "ratio_level": "token",
        "clip_low": 0.2,
        "clip_high": 0.2,
        "aggregation": "seq-mean-token-mean",
        "norm_length": None,
        "kl_coef": 0.04,
        "kl_kind": "k3",
        "dynamic_sampling": False,
        "overlong_penalty": False,
        "overlong_buffer_frac": 0.2,
    },
    # Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): removes GRPO's two
    # normalisations that bias optimisation: no std division (question-difficulty bias)
    # and no 1/|y_i| (length bias; sum tokens and divide by a constant). No KL term.
    "dr_grpo": {
        "advantage_std_normalize": False,
        "advantage_leave_one_out": False,
        "ratio_level": "token",
        "clip_low": 0.2,
        "clip_high": 0.2,
        "aggregation": "seq-mean-token-sum-norm",
        "norm_length": None,
        "kl_coef": 0.0,
        "kl_kind": "k3",
        "dynamic_sampling": False,
        "overlong_penalty": False,
        "overlong_buffer_frac": 0.2,
    },
    # DAPO (Yu et al. 2025): clip-higher (0.2 / 0.28) against entropy collapse,
    # token-level mean, dynamic sampling (drop groups whose rewards are all equal and
    # refill), soft overlong punishment instead of truncation noise, no KL.
    "dapo": {
        "advantage_std_normalize": True,
        "advantage_leave_one_out": False,
        "ratio_level": "token",
        "clip_low": 0.2,
        "clip_high": 0.28,
        "aggregation": "token-mean",
        "norm_length": None,
        "kl_coef": 0.0,
        "kl_kind": "k3",
        "dynamic_sampling": True,
        "overlong_penalty": True,
        "overlong_buffer_frac": 0.2,
    },
    # GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"): one length-normalised
    # sequence ratio (geometric mean of token ratios) clipped as a unit, with the paper's
    # very narrow range (3e-4 / 4e-4); group-normalised advantages, no KL.
    "gspo": {
        "advantage_std_normalize": True,
        "advantage_leave_one_out": False,
        "ratio_level": "sequence_mean",
        "clip_low": 3e-4,
        "clip_high": 4e-4,
        "aggregation": "seq-mean-token-mean",
        "norm_length": None,
        "kl_coef": 0.0,
        "kl_kind": "k3",
        "dynamic_sampling": False,
        "overlong_penalty": False,
        "overlong_buffer_frac": 0.2,
    },
    # Sequence-level PPO: the exact likelihood ratio of the completion, the unit the
    # verifier rewards, clipped at 0.2; mean-centred advantages (the library default), no
    # KL. The ratio's spread grows with length, so it suits short completions.
    "sequence": {
        "advantage_std_normalize": False,
        "advantage_leave_one_out": False,
        "ratio_level": "sequence",
        "clip_low": 0.2,
        "clip_high": 0.2,
        "aggregation": "seq-mean-token-mean",
        "norm_length": None,
        "kl_coef": 0.0,
        "kl_kind": "k3",
        "dynamic_sampling": False,
        "overlong_penalty": False,
        "overlong_buffer_frac": 0.2,
    },
}
