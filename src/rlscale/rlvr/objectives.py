"""Policy-gradient objectives for RLVR: ratios, clipping, aggregation, KL in the loss, IS.

Pure tensor math, no model and no loop. Every choice that a paper changes (how the ratio is
formed, how per-token terms are averaged, which KL estimator, how off-policy samples are
corrected) is a small function registered by name; an `Objective` is one typed record of
those choices, and `PRESETS` names the combinations the papers used. A new objective should
be a new function plus a preset, not a new branch.

Beside it: the advantage estimators (`rlvr.advantages`), the masked helpers, KL estimators
and entropies the math is written in (`rlvr.token_math`), the loss's figures
(`rlvr.loss_metrics`), SFT and DFT (`rlvr.imitation`), and what a trainer step asks of an
objective (`rlvr.step_loss`).

Shapes: per-token tensors are `[B, T]` with `mask` 1 on completion tokens; `advantages` is
`[B]`; a group of `group_size` consecutive rows shares one prompt. Conventions are in
DESIGN.md ("Math conventions").
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from torch import Tensor

from .advantages import estimator_name as advantage_estimator_name
from .loss_metrics import BehaviourFigures, LossMetrics, RatioFigures
from .token_math import (
    KL_ESTIMATORS,
    active_units,
    check_name,
    kl_k3,
    masked_delta,
    masked_mean,
    masked_sum,
    per_unit,
    positive,
    registrar,
    unit_weight,
)

# ----------------------------------------------------------------------------- aggregation

AGGREGATIONS: dict[str, Callable[..., Tensor]] = {}


register_aggregation = registrar(AGGREGATIONS)


@register_aggregation("token-mean")
def token_mean(values, mask, *, num_sequences=None, num_tokens=None, norm_length=None):
    """DAPO: every token of the minibatch weighs the same, so a long completion's tokens
    are not diluted by its length (and long bad patterns are penalised in full)."""
    total = mask.sum() if num_tokens is None else num_tokens
    return masked_sum(values, mask) / positive(total)


@register_aggregation("seq-mean-token-mean")
def seq_mean_token_mean(values, mask, *, num_sequences=None, num_tokens=None, norm_length=None):
    """Original GRPO: average within each completion (1/|y_i|), then over completions. Each
    completion weighs the same, so a token of a long one weighs less, which Dr. GRPO shows
    biases the model towards long wrong answers."""
    per_sequence = masked_sum(values, mask, dim=-1) / positive(mask.sum(dim=-1))
    count = values.shape[0] if num_sequences is None else num_sequences
    return per_sequence.sum() / positive(count)


@register_aggregation("seq-mean-token-sum")
def seq_mean_token_sum(values, mask, *, num_sequences=None, num_tokens=None, norm_length=None):
    """Sum within each completion, mean over completions: the REINFORCE gradient of the
    sequence log-likelihood, and what a sequence-level ratio reduces to at theta_old."""
    count = values.shape[0] if num_sequences is None else num_sequences
    return masked_sum(values, mask) / positive(count)


@register_aggregation("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(values, mask, *, num_sequences=None, num_tokens=None, norm_length=None):
    """Dr. GRPO (Liu et al. 2025): sum within each completion, divide by one constant (the
    generation budget), mean over completions: no length-dependent weighting at all. The
    constant must be given: the padded width of a batch changes from batch to batch."""
    if norm_length is None:
        raise ValueError("seq-mean-token-sum-norm needs norm_length (e.g. max_new_tokens)")
    count = values.shape[0] if num_sequences is None else num_sequences
    return masked_sum(values, mask) / (norm_length * positive(count))


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
        check_name("aggregation", self.name, AGGREGATIONS)

    def __call__(self, values: Tensor, mask: Tensor) -> Tensor:
        return AGGREGATIONS[self.name](values, mask, num_sequences=self.num_sequences,
                                       num_tokens=self.num_tokens, norm_length=self.norm_length)


# ----------------------------------------------------------------------------- surrogates


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
    surrogate = clipped_surrogate(ratio, per_unit(advantages, ratio), clip_low, clip_high)
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
    surrogate = clipped_surrogate(ratio, per_unit(advantages, ratio), clip_low, clip_high)
    if behaviour_weight is not None:
        surrogate = surrogate * behaviour_weight
    count = surrogate.shape[0] if aggregate.num_sequences is None else aggregate.num_sequences
    loss = torch.where(active_units(ratio, mask), -surrogate, torch.zeros_like(surrogate)).sum()
    return loss / positive(count)


# ----------------------------------------------------------------------------- ratios

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
    return delta.sum(dim=-1) / positive(mask.sum(dim=-1))


def log_sequence_ratio(
    logp: Tensor, old_logp: Tensor, mask: Tensor, *, length_normalize: bool = False
) -> Tensor:
    """`[B]` log sequence ratios `sum_t (logp - old_logp)`, or with `length_normalize`
    GSPO's `mean_t ...`, over the masked tokens: finite where the ratio itself overflows
    (a long sequence's summed log-ratio past ~88 is an infinite float32 ratio)."""
    level = RATIO_LEVELS["sequence_mean" if length_normalize else "sequence"]
    return level.log_ratio(masked_delta(logp, old_logp.detach(), mask), mask)


def sequence_ratio(
    logp: Tensor, old_logp: Tensor, mask: Tensor, *, length_normalize: bool = False
) -> Tensor:
    """`[B]` sequence ratios `exp(sum_t (logp - old_logp))`, or with `length_normalize`
    GSPO's `exp(mean_t ...)`, over the masked tokens."""
    return torch.exp(log_sequence_ratio(logp, old_logp, mask, length_normalize=length_normalize))


# ----------------------------------------------------------------------------- behaviour correction
# The sampler's log-probs mu differ from the trainer's pi_old (other kernels, precision,
# stale weights in async runs). The weight w = pi_old / mu is detached, formed at the same
# level as the ratio, and bounded so one odd sample cannot dominate the batch.

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
    ratio = torch.exp(level.log_ratio(masked_delta(logp, old_logp, mask), mask))
    advantages = inputs.advantages.detach().to(dtype)
    units = active_units(ratio, mask)

    behaviour = weight = None
    if inputs.behaviour_logp is not None:
        behaviour_logp = inputs.behaviour_logp.detach().to(dtype)
        raw_weight = torch.exp(level.log_ratio(masked_delta(old_logp, behaviour_logp, mask), mask))
        weight = BEHAVIOUR_CORRECTIONS[o.is_correction](raw_weight, o.is_threshold)
        behaviour = BehaviourFigures(raw_weight.detach(), units, o.is_threshold)

    pg_loss = level.loss(ratio, advantages, mask, clip_low=o.clip_low, clip_high=o.clip_high,
                         behaviour_weight=weight, aggregate=aggregate)
    loss = pg_loss
    kl_mean = kl_loss = None
    if inputs.ref_logp is not None:
        kl = KL_ESTIMATORS[o.kl_kind](masked_delta(inputs.ref_logp.detach().to(dtype), logp, mask))
        kl_mean = masked_mean(kl, mask).detach()
        if o.kl_coef != 0.0:
            kl_loss = aggregate(kl, mask)
            loss = loss + o.kl_coef * kl_loss
            kl_loss = kl_loss.detach()

    delta = masked_delta(logp, old_logp, mask).detach()
    metrics = LossMetrics(
        policy_loss=pg_loss.detach(), total_loss=loss.detach(),
        kl_old_new=masked_mean(kl_k3(delta), mask), kl_mean=kl_mean, kl_loss=kl_loss,
        ratio=RatioFigures(ratio.detach(), advantages, units, o.clip_low, o.clip_high, delta,
                           mask),
        behaviour=behaviour)
    return LossOutput(loss, metrics)


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

    # advantages (advantages.ADVANTAGE_ESTIMATORS, by `advantage_estimator`)
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
    length_penalty_start: int = _number(0, ge=0)  # the step from which both length terms apply
    # the policy gradient on the top-rho share of tokens by entropy only (1: all tokens)
    entropy_top_rho: float = _number(1.0, gt=0, le=1)
    # the advantage mix (mixed_advantages): the verifier's group-relative sequence advantage
    # times `reward_weight`, plus the teacher's per-token one times `teacher_weight` (which
    # needs `teacher.path` and token ratios)
    reward_weight: float = _number(1.0, ge=0)
    teacher_weight: float = _number(0.0, ge=0)
    # PPO's learned critic (rlvr.critic): per-token advantages by GAE(gamma, lambda) from a
    # value model trained beside the policy (its loss clipped at `value_clip`, its learning
    # rate `critic_lr`, None: train.lr), instead of the group's baseline; the sequence
    # estimator then passes the rewards through. `whiten_advantages` standardises the
    # advantages over the batch's tokens.
    critic: bool = False
    gae_gamma: float = _number(1.0, ge=0, le=1)
    gae_lambda: float = _number(1.0, ge=0, le=1)
    value_clip: float = _number(0.2, ge=0)
    critic_lr: float | None = _number(None, gt=0)
    whiten_advantages: bool = False

    def __post_init__(self) -> None:
        for spec in fields(self):
            value = getattr(self, spec.name)
            if "choices" in spec.metadata:
                check_name(spec.name, value, spec.metadata["choices"])
            for bound, limit in spec.metadata.get("bounds", {}).items():
                holds, sign = _BOUNDS[bound]
                if value is not None and not holds(value, limit):
                    raise ValueError(f"{spec.name} must be {sign} {limit}, got {value!r}")
        if self.teacher_weight and self.ratio_level != "token":
            raise ValueError(f"teacher_weight > 0 gives per-token advantages, which need "
                             f"ratio_level 'token' (got {self.ratio_level!r})")
        if self.critic and self.ratio_level != "token":
            raise ValueError(f"critic gives per-token advantages, which need ratio_level "
                             f"'token' (got {self.ratio_level!r})")
        if self.critic and self.teacher_weight:
            raise ValueError("critic and teacher_weight > 0 both set the per-token advantages: "
                             "choose one")

    @property
    def uses_teacher(self) -> bool:
        return self.teacher_weight != 0.0

    @property
    def advantage_estimator(self) -> str:
        """The registered sequence estimator (advantages.ADVANTAGE_ESTIMATORS) the two
        `advantage_*` switches choose; with a critic, the rewards themselves (its GAE
        forms the advantages)."""
        if self.critic:
            return "reward"
        return advantage_estimator_name(std_normalize=self.advantage_std_normalize,
                                        leave_one_out=self.advantage_leave_one_out)


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
    # PPO with a learned critic (Schulman et al. 2017; as Open-Reasoner-Zero, Hu et al. 2025,
    # runs it on verifiable rewards): a value model beside the policy, GAE with gamma =
    # lambda = 1 (the reward is terminal: A_t = R - V(s_t)), value clipping at 0.2, the
    # advantages whitened over the batch's tokens, token ratios clipped at 0.2, token mean,
    # no KL. Groups are not needed (rollout.group_size 1 is the classic set-up).
    "ppo": Objective(
        ratio_level="token", clip_low=0.2, clip_high=0.2, aggregation="token-mean",
        kl_coef=0.0, critic=True, gae_gamma=1.0, gae_lambda=1.0, value_clip=0.2,
        whiten_advantages=True),
    # On-policy distillation (Agarwal et al. 2024; Thinking Machines 2025): per-token
    # advantages from the teacher's log-probs on the student's samples (teacher_advantages),
    # through the same clipped token ratio; token mean, since every token carries its own
    # signal. No verifier term (`loss.reward_weight` > 0 mixes it in) and no KL to the
    # reference (the teacher is the anchor).
    "opd": Objective(
        ratio_level="token", clip_low=0.2, clip_high=0.2, aggregation="token-mean",
        kl_coef=0.0, reward_weight=0.0, teacher_weight=1.0),
}
