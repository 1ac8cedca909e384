"""Objectives against hand-computed numbers (the arithmetic is written out in comments)."""

import dataclasses
import math
import statistics

import pytest
import torch

from rlscale.rlvr.advantages import group_advantages
from rlscale.rlvr.imitation import demonstration_loss, dft_loss, sft_loss
from rlscale.rlvr.objectives import (
    AGGREGATIONS,
    PRESETS,
    RATIO_LEVELS,
    Aggregation,
    LossInputs,
    Objective,
    log_sequence_ratio,
    policy_loss,
    sequence_level_loss,
    sequence_ratio,
    token_level_loss,
)
from rlscale.rlvr.token_math import (
    kl_penalty,
    masked_mean,
    token_entropy_from_logits,
    top_entropy_mask,
)

torch.set_num_threads(1)
F64 = torch.float64


def loss_of(logp, old, adv, mask, *, behaviour_logp=None, ref_logp=None, num_sequences=None,
            num_tokens=None, **objective):
    """policy_loss on these tensors with an Objective of `objective`'s fields: (loss, metrics
    by their logged names)."""
    out = policy_loss(LossInputs(logp, old, adv, mask, behaviour_logp, ref_logp, num_sequences,
                                 num_tokens), Objective(**objective))
    return out.loss, out.metrics.as_dict()


def close(actual, expected, tol=1e-9):
    expected = torch.as_tensor(expected, dtype=F64)
    assert torch.allclose(torch.as_tensor(actual, dtype=F64), expected, atol=tol, rtol=0), (
        actual,
        expected,
    )


# ----------------------------------------------------------------------------- advantages


def test_group_advantages_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 0.0, 1.0, 1.0])
    # group 1: mean 0.25; group 2: mean 1
    close(group_advantages(rewards, 4), [0.75, -0.25, -0.25, -0.25, 1.0, -1.0, 0.0, 0.0], 1e-6)
    # population std: group 1 sqrt(0.25 * 0.75) = 0.4330127, group 2 sqrt(2 / 4) = 0.7071068
    close(
        group_advantages(rewards, 4, std_normalize=True),
        [1.7320508, -0.5773503, -0.5773503, -0.5773503, 1.4142136, -1.4142136, 0.0, 0.0],
        1e-5,
    )
    # leave-one-out: 1 - 0 = 1, 0 - 1/3; 2 - 2/3, 0 - 4/3, 1 - 1, 1 - 1
    close(
        group_advantages(rewards, 4, leave_one_out=True),
        [1.0, -1 / 3, -1 / 3, -1 / 3, 4 / 3, -4 / 3, 0.0, 0.0],
        1e-6,
    )


@pytest.mark.parametrize("value", [0.1, 0.3, 0.7, 1.0, -2.5, 1e-3])
@pytest.mark.parametrize("group_size", [3, 5, 7])
@pytest.mark.parametrize("flags", [{}, {"std_normalize": True}, {"leave_one_out": True}])
def test_uniform_group_is_exactly_zero(value, group_size, flags):
    rewards = torch.cat([torch.full((group_size,), value), torch.arange(group_size) * 1.0])
    adv = group_advantages(rewards, group_size, **flags)
    assert torch.equal(adv[:group_size], torch.zeros(group_size))
    assert (adv[group_size:] != 0).any()


def test_uniform_group_gives_zero_gradient():
    rewards = torch.tensor([0.3, 0.3, 0.3])
    adv = group_advantages(rewards, 3, std_normalize=True)
    logp = torch.randn(3, 4, dtype=F64, requires_grad=True)
    old = logp.detach() + 0.1 * torch.randn(3, 4, dtype=F64)
    for level in ["token", "sequence", "sequence_mean"]:
        logp.grad = None
        loss, _ = loss_of(logp, old, adv, torch.ones(3, 4), ratio_level=level)
        loss.backward()
        assert loss.item() == 0.0
        assert torch.count_nonzero(logp.grad) == 0


def test_group_advantages_rejects_bad_shapes():
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(5), 2)
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(3), 1, leave_one_out=True)


# ----------------------------------------------------------------------------- KL


def test_kl_estimators_by_hand():
    logp = torch.zeros(2, dtype=F64)
    ref = torch.tensor([1.0, -0.5], dtype=F64)  # d = ref - logp
    close(kl_penalty(logp, ref, "k1"), [-1.0, 0.5])
    close(kl_penalty(logp, ref, "k2"), [0.5, 0.125])
    # e - 2 = 0.718281828; exp(-0.5) + 0.5 - 1 = 0.106530660
    close(kl_penalty(logp, ref, "k3"), [0.718281828459, 0.106530659713])
    with pytest.raises(ValueError):
        kl_penalty(logp, ref, "k4")


def test_k3_nonnegative_and_close_to_k2_for_small_d():
    d = torch.linspace(-5, 5, 1001, dtype=F64)
    zero = torch.zeros_like(d)
    assert (kl_penalty(zero, d, "k3") >= 0).all()
    small = torch.tensor([1e-3, -1e-3, 1e-5], dtype=F64)
    k2, k3 = kl_penalty(0 * small, small, "k2"), kl_penalty(0 * small, small, "k3")
    # k3 - k2 = d^3/6 + ...
    assert ((k3 - k2).abs() <= small.abs() ** 3).all()
    assert (k3 > 0).all()


def test_kl_term_in_loss():
    logp = torch.zeros(1, 2, dtype=F64, requires_grad=True)
    ref = torch.tensor([[1.0, -0.5]], dtype=F64)
    loss, metrics = loss_of(
        logp,
        logp.detach(),
        torch.zeros(1),
        torch.ones(1, 2),
        ref_logp=ref,
        kl_coef=0.1,
        aggregation="token-mean",
    )
    # advantages 0 -> only KL: 0.1 * (0.718281828 + 0.106530660) / 2
    close(loss.item(), 0.1 * (0.718281828459 + 0.106530659713) / 2)
    close(metrics["kl/mean"], (0.718281828459 + 0.106530659713) / 2)
    loss.backward()
    # d k3 / d logp = 1 - exp(d): (1 - e, 1 - exp(-0.5)) * 0.1 / 2
    close(logp.grad, [[0.1 * (1 - math.e) / 2, 0.1 * (1 - math.exp(-0.5)) / 2]])
    with pytest.raises(ValueError):
        loss_of(logp, logp.detach(), torch.zeros(1), torch.ones(1, 2), kl_coef=0.1)


# ----------------------------------------------------------------------------- ratio and clip


def two_by_three():
    """2 sequences x 3 tokens. Token ratios: seq 0 (A=+1) [1.0, 1.5, 0.5]; seq 1 (A=-1)
    [0.5, 1.5, pad]. The pad token holds garbage (old_logp = -1e30) to check masking."""
    ratios = torch.tensor([[1.0, 1.5, 0.5], [0.5, 1.5, 1.0]], dtype=F64)
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, -1e30]], dtype=F64)
    logp = old + ratios.log()
    logp[1, 2] = 0.0
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    return logp.requires_grad_(True), old, torch.tensor([1.0, -1.0]), mask


# Per-token surrogate min(r A, clip(r, 0.8, 1.2) A):
#   seq 0, A=+1: r=1.0 -> 1.0; r=1.5 -> min(1.5, 1.2) = 1.2 (clip high); r=0.5 -> 0.5
#   seq 1, A=-1: r=0.5 -> min(-0.5, -0.8) = -0.8 (clip low); r=1.5 -> min(-1.5, -1.2) = -1.5
# Token losses (minus): seq 0 [-1.0, -1.2, -0.5] (sum -2.7); seq 1 [0.8, 1.5] (sum 2.3).
HAND_LOSSES = {
    "token-mean": (-2.7 + 2.3) / 5,  # -0.08
    "seq-mean-token-mean": (-2.7 / 3 + 2.3 / 2) / 2,  # 0.125
    "seq-mean-token-sum": (-2.7 + 2.3) / 2,  # -0.2
    "seq-mean-token-sum-norm": (-2.7 / 4 + 2.3 / 4) / 2,  # -0.05 with norm_length 4
}


@pytest.mark.parametrize("aggregation", list(HAND_LOSSES))
def test_token_loss_by_hand(aggregation):
    assert set(HAND_LOSSES) == set(AGGREGATIONS)
    logp, old, adv, mask = two_by_three()
    loss, metrics = loss_of(logp, old, adv, mask, aggregation=aggregation, norm_length=4)
    close(loss.item(), HAND_LOSSES[aggregation])
    close(metrics["loss"], HAND_LOSSES[aggregation])
    # one of five active tokens binds on each side
    assert metrics["clip/high_frac"] == pytest.approx(0.2, abs=1e-12)
    assert metrics["clip/low_frac"] == pytest.approx(0.2, abs=1e-12)
    close(metrics["ratio/mean"], 1.0)  # (1 + 1.5 + 0.5 + 0.5 + 1.5) / 5
    close(metrics["ratio/max"], 1.5)
    # both levels' spread whatever the level: token log-ratios 0, ln 1.5, ln 0.5 | ln 0.5,
    # ln 1.5 (n - 1 variance); each sequence's sum is ln 0.75, so its spread is 0
    close(metrics["ratio/token_log_var"],
          statistics.variance([0.0, math.log(1.5), math.log(0.5), math.log(0.5), math.log(1.5)]))
    close(metrics["ratio/sequence_log_var"], 0.0)
    loss.backward()
    assert torch.isfinite(logp.grad).all()


def test_token_gradient_by_hand():
    logp, old, adv, mask = two_by_three()
    loss, _ = loss_of(logp, old, adv, mask, aggregation="token-mean")
    loss.backward()
    # d(-r A)/d logp = -r A / 5 on unclipped branches; clipped branches and pad give 0
    close(logp.grad, [[-1.0 / 5, 0.0, -0.5 / 5], [0.0, 1.5 / 5, 0.0]])


def test_clip_sides_with_signs():
    # ratio above 1 + eps: binds only for A > 0; ratio below 1 - eps: binds only for A < 0.
    # Asymmetric clips and advantages, so swapping clip_low and clip_high changes the loss.
    ratios = torch.tensor([[1.5], [1.5], [0.6], [0.6]], dtype=F64)
    logp = ratios.log().requires_grad_(True)
    adv = torch.tensor([2.0, -2.0, 3.0, -3.0])
    loss, metrics = loss_of(
        logp,
        torch.zeros_like(logp),
        adv,
        torch.ones(4, 1),
        clip_low=0.1,
        clip_high=0.3,
        aggregation="seq-mean-token-sum",
    )
    # clip range [0.9, 1.3]. Surrogates:
    #   r=1.5, A=+2: min(3.0, 2.6) = 2.6 (high binds)   r=1.5, A=-2: min(-3.0, -2.6) = -3.0
    #   r=0.6, A=+3: min(1.8, 2.7) = 1.8                r=0.6, A=-3: min(-1.8, -2.7) = -2.7 (low)
    # loss = -(2.6 - 3.0 + 1.8 - 2.7) / 4 = 0.325
    close(loss.item(), 0.325)
    assert metrics["clip/high_frac"] == 0.25 and metrics["clip/low_frac"] == 0.25
    # every completion is one token long: all at the median, all "short"
    assert (metrics["clip/frac_short"], metrics["clip/frac_long"]) == (0.5, 0.0)
    loss.backward()
    # gradient only where the unclipped branch is chosen: -r A / 4
    close(logp.grad, [[0.0], [1.5 * 2 / 4], [-0.6 * 3 / 4], [0.0]])


def test_sequence_level_by_hand():
    logp, old, adv, mask = two_by_three()
    # s_0 = 1 * 1.5 * 0.5 = 0.75, A=+1 -> min(0.75, 0.8) = 0.75
    # s_1 = 0.5 * 1.5 = 0.75, A=-1 -> min(-0.75, -0.8) = -0.8 (clip low)
    loss, metrics = loss_of(logp, old, adv, mask, ratio_level="sequence")
    close(loss.item(), -(0.75 - 0.8) / 2)
    assert metrics["clip/low_frac"] == 0.5 and metrics["clip/high_frac"] == 0.0
    # by length: the clipped sequence is the shorter (2 tokens, the median), the other long
    assert (metrics["clip/frac_short"], metrics["clip/frac_long"]) == (1.0, 0.0)
    close(sequence_ratio(logp, old, mask), [0.75, 0.75])
    # GSPO: s_0 = 0.75^(1/3) = 0.908560296, s_1 = 0.75^(1/2) = 0.866025404, both unclipped
    loss, metrics = loss_of(logp, old, adv, mask, ratio_level="sequence_mean")
    close(loss.item(), -(0.908560296416 - 0.866025403784) / 2)
    close(metrics["ratio/max"], 0.908560296416)


def test_gspo_ratio_is_geometric_mean_of_token_ratios():
    torch.manual_seed(0)
    logp, old = torch.randn(4, 6, dtype=F64), torch.randn(4, 6, dtype=F64)
    mask = torch.tensor(
        [[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0], [0] * 6], dtype=F64
    )
    token_ratios = (logp - old).exp()
    for i in range(4):
        kept = token_ratios[i][mask[i] > 0]
        expected = kept.prod() ** (1 / len(kept)) if len(kept) else torch.tensor(1.0)
        close(sequence_ratio(logp, old, mask, length_normalize=True)[i], expected, 1e-12)


def test_the_log_sequence_ratio_stays_finite_where_the_ratio_overflows():
    """120 tokens each 1 nat more likely: the ratio is exp(120), past float32's range; its
    log is 120 (GSPO's: 1), which is what a variance of log-ratios must read."""
    logp, old = torch.ones(2, 120), torch.zeros(2, 120)
    mask = torch.ones(2, 120)
    mask[1, 60:] = 0
    assert torch.isinf(sequence_ratio(logp, old, mask)[0])
    close(log_sequence_ratio(logp, old, mask), [120.0, 60.0])
    close(log_sequence_ratio(logp, old, mask, length_normalize=True), [1.0, 1.0])


def test_on_policy_gradients_agree_across_levels():
    torch.manual_seed(1)
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=F64)
    adv = torch.tensor([0.7, -1.3, 0.4])

    def grad(**kw):
        logp = torch.randn(3, 5, dtype=F64, generator=torch.Generator().manual_seed(2))
        logp.requires_grad_(True)
        loss_of(logp, logp.detach(), adv, mask, **kw)[0].backward()
        return logp.grad

    # sequence ratio: grad = -A_i sum_t grad logp_t / B == token-level seq-mean-token-sum
    sequence = grad(ratio_level="sequence")
    close(sequence, grad(aggregation="seq-mean-token-sum"), 1e-12)
    close(sequence, -adv[:, None].double() * mask / 3, 1e-12)
    # old_logp is a constant even when handed the very tensor that carries the gradient
    logp = torch.randn(3, 5, dtype=F64, generator=torch.Generator().manual_seed(2))
    logp.requires_grad_(True)
    loss_of(logp, logp, adv, mask, ratio_level="sequence")[0].backward()
    close(logp.grad, sequence, 1e-12)
    # GSPO: grad = -A_i mean_t grad logp_t / B == token-level seq-mean-token-mean
    gspo = grad(ratio_level="sequence_mean")
    close(gspo, grad(aggregation="seq-mean-token-mean"), 1e-12)
    close(gspo, -adv[:, None].double() * mask / mask.sum(1, keepdim=True) / 3, 1e-12)


def test_empty_rows_are_finite():
    logp = torch.randn(3, 4, dtype=F64).requires_grad_(True)
    mask = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1.0]])
    adv = torch.tensor([1.0, 5.0, -1.0])
    for level in ["token", "sequence", "sequence_mean"]:
        for aggregation in AGGREGATIONS:
            logp.grad = None
            loss, metrics = loss_of(
                logp,
                logp.detach() - 0.1,
                adv,
                mask,
                ratio_level=level,
                aggregation=aggregation,
                norm_length=4,
                ref_logp=logp.detach() + 0.2,
                kl_coef=0.1,
                behaviour_logp=logp.detach(),
                is_correction="tis",
            )
            loss.backward()
            assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
            assert (logp.grad[1] == 0).all()
            assert all(math.isfinite(v) for v in metrics.values())
    loss, metrics = loss_of(logp, logp.detach(), adv, torch.zeros(3, 4))
    assert loss.item() == 0.0 and all(math.isfinite(v) for v in metrics.values())


def test_norm_length_required():
    logp, old, adv, mask = two_by_three()
    with pytest.raises(ValueError):
        loss_of(logp, old, adv, mask, aggregation="seq-mean-token-sum-norm")


# ----------------------------------------------------------------------------- behaviour correction


def behaviour_case(weights):
    """One sequence, on-policy for pi_old (ratio 1), with pi_old/mu = weights per token."""
    old = torch.tensor([[-1.0, -2.0, -0.5]], dtype=F64)
    logp = old.clone().requires_grad_(True)
    mu = (old - torch.tensor([weights], dtype=F64).log()).requires_grad_(True)
    return logp, old, mu


def test_tis_caps_and_is_detached():
    logp, old, mu = behaviour_case([0.5, 3.0, 1.0])
    adv, mask = torch.tensor([1.0]), torch.ones(1, 3)
    loss, metrics = loss_of(
        logp,
        old,
        adv,
        mask,
        behaviour_logp=mu,
        is_correction="tis",
        is_threshold=2.0,
        aggregation="token-mean",
    )
    loss.backward()
    # plain gradient -A / 3 per token, times min(w, 2) = [0.5, 2.0, 1.0]
    close(logp.grad, [[-0.5 / 3, -2.0 / 3, -1.0 / 3]])
    close(loss.item(), -(0.5 + 2.0 + 1.0) / 3)
    assert mu.grad is None or torch.count_nonzero(mu.grad) == 0
    close(metrics["behaviour/weight_max"], 3.0)
    close(metrics["behaviour/weight_mean"], 1.5)
    close(metrics["behaviour/truncated_frac"], 1 / 3)
    # "none" ignores the weights in the loss but still logs them
    logp.grad = None
    plain, metrics = loss_of(logp, old, adv, mask, behaviour_logp=mu, aggregation="token-mean")
    plain.backward()
    close(logp.grad, [[-1 / 3, -1 / 3, -1 / 3]])
    close(metrics["behaviour/weight_max"], 3.0)


def test_mis_zeroes_outside_band():
    logp, old, mu = behaviour_case([0.4, 3.0, 1.25])
    loss, metrics = loss_of(
        logp,
        old,
        torch.tensor([-1.0]),
        torch.ones(1, 3),
        behaviour_logp=mu,
        is_correction="mis",
        is_threshold=2.0,
        aggregation="seq-mean-token-sum",
    )
    loss.backward()
    # 0.4 < 1/2 and 3.0 > 2 are dropped; 1.25 kept: gradient -A w = +1.25 on the last token
    close(logp.grad, [[0.0, 0.0, 1.25]])
    close(loss.item(), 1.25)
    close(metrics["behaviour/masked_frac"], 2 / 3)


def test_sequence_level_behaviour_weight():
    logp, old, mu = behaviour_case([0.5, 3.0, 1.0])  # product 1.5, geometric mean 1.5^(1/3)
    for level, w in [("sequence", 1.5), ("sequence_mean", 1.5 ** (1 / 3))]:
        loss, metrics = loss_of(
            logp,
            old,
            torch.tensor([1.0]),
            torch.ones(1, 3),
            ratio_level=level,
            behaviour_logp=mu,
            is_correction="tis",
            is_threshold=1.2,
        )
        close(loss.item(), -min(w, 1.2))
        close(metrics["behaviour/weight_mean"], w)


# ----------------------------------------------------------------------------- micro-batches


@pytest.mark.parametrize("level", ["token", "sequence", "sequence_mean"])
@pytest.mark.parametrize("aggregation", list(HAND_LOSSES))
def test_micro_batches_sum_to_minibatch(level, aggregation):
    gen = torch.Generator().manual_seed(3)
    B, T = 7, 6
    lengths = torch.tensor([6, 2, 4, 1, 0, 5, 3])
    mask = (torch.arange(T)[None] < lengths[:, None]).double()
    old = -torch.rand(B, T, generator=gen, dtype=F64) * 3
    logp = (old + 0.3 * torch.randn(B, T, generator=gen, dtype=F64)).requires_grad_(True)
    mu = old + 0.5 * torch.randn(B, T, generator=gen, dtype=F64)
    ref = old + 0.2 * torch.randn(B, T, generator=gen, dtype=F64)
    adv = torch.randn(B, generator=gen, dtype=F64)
    kw = dict(
        ratio_level=level,
        aggregation=aggregation,
        norm_length=8,
        behaviour_logp=mu,
        is_correction="tis",
        ref_logp=ref,
        kl_coef=0.05,
    )

    whole, _ = loss_of(logp, old, adv, mask, **kw)
    (whole_grad,) = torch.autograd.grad(whole, logp)

    total = 0.0
    for rows in [slice(0, 2), slice(2, 3), slice(3, 7)]:
        width = int(lengths[rows].max())  # each micro-batch drops its own padding columns
        cols = slice(0, max(width, 1))
        part, _ = loss_of(
            logp[rows, cols],
            old[rows, cols],
            adv[rows],
            mask[rows, cols],
            **{**kw, "behaviour_logp": mu[rows, cols], "ref_logp": ref[rows, cols]},
            num_sequences=B,
            num_tokens=float(mask.sum()),
        )
        total = total + part
    (micro_grad,) = torch.autograd.grad(total, logp)
    close(total.item(), whole.item(), 1e-6)
    close(micro_grad, whole_grad, 1e-6)
    assert whole_grad.abs().sum() > 0


# ----------------------------------------------------------------------------- entropy


def test_token_entropy_by_hand_and_stable():
    logits = torch.tensor(
        [[[0.0, math.log(3.0)], [5.0, -float("inf")], [1e4, 1e4 + math.log(3.0)]]]
    )
    # p = [1/4, 3/4]: -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.562335145; one-hot -> 0
    close(token_entropy_from_logits(logits), [[0.562335145, 0.0, 0.562335145]], 1e-5)
    uniform = torch.zeros(2, 3, 50)
    close(token_entropy_from_logits(uniform), torch.full((2, 3), math.log(50)), 1e-5)


def test_token_entropy_in_row_chunks_is_bitwise_the_whole(monkeypatch):
    """Chunking bounds the temporaries and changes no figure: each row is computed alone."""
    import rlscale.rlvr.token_math as token_math

    logits = torch.randn(3, 70, 40, generator=torch.Generator().manual_seed(0))
    whole = token_entropy_from_logits(logits)
    monkeypatch.setattr(token_math, "ENTROPY_CHUNK_ELEMENTS", 40 * 7)
    chunked = token_entropy_from_logits(logits)
    assert chunked.shape == (3, 70) and torch.equal(chunked, whole)


def test_top_entropy_mask():
    entropy = torch.tensor([[0.1, 0.9, 5.0, 0.5], [0.7, 0.3, 0.2, 9.0]])
    mask = torch.tensor([[1, 1, 0, 1], [1, 1, 1, 0.0]])  # inactive 5.0 and 9.0 are ignored
    # 6 active tokens; top half (3) by entropy: 0.9, 0.7, 0.5
    expected = torch.tensor([[0, 1, 0, 1], [1, 0, 0, 0.0]])
    assert torch.equal(top_entropy_mask(entropy, mask, 0.5), expected)
    # ceil(0.2 * 6) = 2 tokens: 0.9 and 0.7
    assert torch.equal(
        top_entropy_mask(entropy, mask, 0.2), torch.tensor([[0, 1, 0, 0], [1, 0, 0, 0.0]])
    )
    assert torch.equal(top_entropy_mask(entropy, mask, 1.0), mask)
    assert masked_mean(entropy, top_entropy_mask(entropy, mask, 0.5)).item() == pytest.approx(0.7)


# ----------------------------------------------------------------------------- presets


def test_presets_are_complete_and_valid():
    # what a preset decides; the rest (behaviour correction, length shaping, entropy
    # masking) is left at the library's "off" defaults by every preset
    refinements = {"is_correction": "none", "is_threshold": 2.0,
                   "length_penalty_per_token": 0.0, "adaptive_length_penalty": 0.0,
                   "entropy_top_rho": 1.0}
    assert set(PRESETS) == {"grpo", "dr_grpo", "dapo", "gspo", "sequence", "opd", "ppo"}
    for preset in PRESETS.values():
        assert isinstance(preset, Objective)
        assert {k: getattr(preset, k) for k in refinements} == refinements
        assert preset.aggregation in AGGREGATIONS
        assert preset.norm_length is None  # the loop's max_new_tokens
    assert PRESETS["dapo"].clip_high > PRESETS["dapo"].clip_low
    assert PRESETS["dapo"].dynamic_sampling and PRESETS["dapo"].overlong_penalty
    assert PRESETS["dr_grpo"].aggregation == "seq-mean-token-sum-norm"
    assert not PRESETS["dr_grpo"].advantage_std_normalize
    assert PRESETS["gspo"].ratio_level == "sequence_mean"
    assert PRESETS["grpo"].kl_coef > 0
    assert PRESETS["opd"].teacher_weight == 1.0 and PRESETS["opd"].reward_weight == 0.0
    assert all(p.reward_weight == 1.0 and not p.uses_teacher
               for name, p in PRESETS.items() if name != "opd")
    # every preset runs through policy_loss
    logp, old, adv, mask = two_by_three()
    for preset in PRESETS.values():
        out = policy_loss(LossInputs(logp, old, adv, mask, ref_logp=old),
                          dataclasses.replace(preset, norm_length=preset.norm_length or 3))
        assert torch.isfinite(out.loss)


# ----------------------------------------------------------------------------- the typed record


def test_objective_is_a_frozen_record_and_overrides_replace():
    dapo = PRESETS["dapo"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        dapo.clip_high = 0.5
    wider = dataclasses.replace(dapo, clip_high=0.5)
    assert wider.clip_high == 0.5 and wider.clip_low == dapo.clip_low
    assert PRESETS["dapo"].clip_high == 0.28  # the preset is untouched


@pytest.mark.parametrize("field, value", [("ratio_level", "word"), ("aggregation", "sum"),
                                          ("kl_kind", "k4"), ("is_correction", "pis")])
def test_objective_names_are_checked_against_the_registries(field, value):
    with pytest.raises(ValueError, match=f"unknown .*{value!r}"):
        Objective(**{field: value})
    with pytest.raises(ValueError, match="choose from"):
        dataclasses.replace(PRESETS["grpo"], **{field: value})


@pytest.mark.parametrize("field, value, rule", [
    ("clip_low", -0.1, ">= 0"), ("norm_length", 0, ">= 1"), ("is_threshold", 1.0, "> 1"),
    ("entropy_top_rho", 0.0, "> 0"), ("entropy_top_rho", 1.5, "<= 1"),
    ("overlong_buffer_frac", 0.0, "> 0"), ("teacher_weight", -1.0, ">= 0")])
def test_objective_numbers_are_checked_against_their_bounds(field, value, rule):
    with pytest.raises(ValueError, match=f"{field} must be {rule}"):
        dataclasses.replace(PRESETS["grpo"], **{field: value})
    assert Objective(norm_length=None).norm_length is None  # None: the loop's max_new_tokens


def test_loss_output_is_typed_and_logs_the_same_names():
    logp, old, adv, mask = two_by_three()
    mu, ref = old - 0.1, old + 0.2
    out = policy_loss(LossInputs(logp, old, adv, mask, behaviour_logp=mu, ref_logp=ref),
                      Objective(kl_coef=0.1, is_correction="tis"))
    m = out.metrics
    assert m.total_loss == out.loss.item()
    close(m.total_loss, m.policy_loss + 0.1 * m.kl_loss)
    assert m.kl_mean is not None and m.kl_old_new >= 0.0
    assert list(m.as_dict()) == [
        "behaviour/weight_mean", "behaviour/weight_max", "behaviour/truncated_frac",
        "behaviour/masked_frac", "kl/mean", "kl/loss", "clip/low_frac", "clip/high_frac",
        "clip/frac", "ratio/mean", "ratio/max", "clip/frac_short", "clip/frac_long",
        "ratio/token_log_var", "ratio/sequence_log_var",
        "kl/old_new", "loss/policy", "loss"]
    # without a reference or a behaviour policy those figures are absent, not zero
    plain = policy_loss(LossInputs(logp, old, adv, mask), Objective()).metrics
    assert plain.kl_mean is None and plain.kl_loss is None and plain.behaviour is None
    assert not {"kl/mean", "kl/loss", "behaviour/weight_mean"} & set(plain.as_dict())
    with pytest.raises(dataclasses.FrozenInstanceError):
        out.metrics.total_loss = 0.0


def test_policy_loss_dispatches_through_the_ratio_level_registry():
    assert RATIO_LEVELS["token"].loss is token_level_loss
    assert RATIO_LEVELS["sequence"].loss is sequence_level_loss
    assert RATIO_LEVELS["sequence_mean"].loss is sequence_level_loss
    logp, old, adv, mask = two_by_three()
    for level in RATIO_LEVELS:
        ratio = torch.exp(RATIO_LEVELS[level].log_ratio((logp - old) * mask, mask))
        direct = RATIO_LEVELS[level].loss(
            ratio, adv, mask, clip_low=0.1, clip_high=0.2, behaviour_weight=None,
            aggregate=Aggregation("seq-mean-token-sum", num_sequences=4))
        through, _ = loss_of(logp, old, adv, mask, ratio_level=level, clip_low=0.1,
                                 clip_high=0.2, aggregation="seq-mean-token-sum",
                                 num_sequences=4)
        assert direct.item() == through.item()


def test_sequence_level_loss_by_hand():
    # two sequences, ratios 1.5 and 0.5, advantages +1 and -1, clip 0.2: min(1.5, 1.2) = 1.2
    # and min(-0.5, -0.8) = -0.8; the third row has no token and counts in N = 3 only.
    ratio = torch.tensor([1.5, 0.5, 1.0], dtype=F64)
    adv = torch.tensor([1.0, -1.0, 5.0], dtype=F64)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]], dtype=F64)
    loss = sequence_level_loss(ratio, adv, mask, clip_low=0.2, clip_high=0.2,
                               behaviour_weight=None, aggregate=Aggregation())
    close(loss, -(1.2 - 0.8) / 3)
    weighted = sequence_level_loss(ratio, adv, mask, clip_low=0.2, clip_high=0.2,
                                   behaviour_weight=torch.tensor([0.5, 2.0, 1.0], dtype=F64),
                                   aggregate=Aggregation(num_sequences=4))
    close(weighted, -(0.5 * 1.2 - 2.0 * 0.8) / 4)


def test_token_level_loss_by_hand():
    # token ratios [[1.5, 0.9]], A = +1, clip 0.2: min(1.5, 1.2) = 1.2, 0.9; token-mean
    ratio = torch.tensor([[1.5, 0.9]], dtype=F64)
    loss = token_level_loss(ratio, torch.tensor([1.0], dtype=F64), torch.ones(1, 2, dtype=F64),
                            clip_low=0.2, clip_high=0.2, behaviour_weight=None,
                            aggregate=Aggregation("token-mean"))
    close(loss, -(1.2 + 0.9) / 2)


def test_aggregation_record_reads_its_counts():
    values = torch.tensor([[1.0, 2.0], [3.0, 0.0]], dtype=F64)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=F64)
    close(Aggregation("token-mean")(values, mask), 2.0)
    close(Aggregation("token-mean", num_tokens=6)(values, mask), 1.0)
    close(Aggregation("seq-mean-token-sum-norm", num_sequences=2, norm_length=3)(values, mask),
          6 / (3 * 2))
    with pytest.raises(ValueError, match="unknown aggregation"):
        Aggregation("mean")


# ----------------------------------------------------------------------------- SFT and DFT

LOG2, LOG4 = math.log(2.0), math.log(4.0)


def sft_batch():
    # two targets: probabilities [1/2, 1/4, pad] and [1/8, pad, pad]; padding holds -inf,
    # as a log-prob of an impossible token would
    logp = torch.tensor([[-LOG2, -LOG4, -math.inf], [-math.log(8.0), -math.inf, -math.inf]],
                        dtype=F64)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]], dtype=F64)
    return logp, mask


def test_sft_and_dft_losses_by_hand():
    logp, mask = sft_batch()
    log8 = math.log(8.0)
    # SFT: -log p per target token
    close(sft_loss(logp, mask), [[LOG2, LOG4, 0.0], [log8, 0.0, 0.0]])
    # DFT: -p log p with the token's own probability
    close(dft_loss(logp, mask), [[0.5 * LOG2, 0.25 * LOG4, 0.0], [log8 / 8, 0.0, 0.0]])
    # DFT, sequence weight: pi(y*|x) = 1/2 * 1/4 = 1/8 for both tokens of row 1; 1/8 in row 2
    close(dft_loss(logp, mask, weight="sequence"),
          [[LOG2 / 8, LOG4 / 8, 0.0], [log8 / 8, 0.0, 0.0]])
    with pytest.raises(ValueError, match="probability weight"):
        dft_loss(logp, mask, weight="one")
    with pytest.raises(ValueError, match="unknown dft weight"):
        dft_loss(logp, mask, weight="tokens")


def test_demonstration_loss_aggregates_and_reports():
    logp, mask = sft_batch()
    log8 = math.log(8.0)
    # token mean over the 3 target tokens
    loss, metrics = demonstration_loss(logp, mask)
    close(loss, (LOG2 + LOG4 + log8) / 3)
    assert metrics["nll"] == pytest.approx((LOG2 + LOG4 + log8) / 3)
    assert metrics["weight_mean"] == 1.0
    loss, metrics = demonstration_loss(logp, mask, weight="token")
    close(loss, (0.5 * LOG2 + 0.25 * LOG4 + log8 / 8) / 3)
    assert metrics["nll"] == pytest.approx((LOG2 + LOG4 + log8) / 3)  # whatever the weight
    assert metrics["weight_mean"] == pytest.approx((0.5 + 0.25 + 0.125) / 3)
    # the aggregation machinery of the RL losses: per-sequence token sums over 4 rows
    loss, _ = demonstration_loss(logp, mask, aggregate=Aggregation("seq-mean-token-sum",
                                                                   num_sequences=4))
    close(loss, (LOG2 + LOG4 + log8) / 4)
    assert torch.isfinite(loss)


def test_dft_gradient_is_sft_gradient_times_the_detached_probability():
    # per token, d/dlogp of -sg(p) log p is -p; of -log p it is -1
    logp, mask = sft_batch()
    logp = logp.clone().requires_grad_(True)
    sft_grad, = torch.autograd.grad(sft_loss(logp, mask).sum(), logp)
    dft_grad, = torch.autograd.grad(dft_loss(logp, mask).sum(), logp)
    close(sft_grad, -mask)
    close(dft_grad, [[-0.5, -0.25, 0.0], [-0.125, 0.0, 0.0]])
    assert torch.isfinite(sft_grad).all() and torch.isfinite(dft_grad).all()
    # through a softmax over logits (the parameters): token by token, DFT's gradient is
    # SFT's scaled by sg(pi(y*_t)); the sequence weight scales them all by pi(y*|x)
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 5, generator=generator, dtype=F64, requires_grad=True)
    targets = torch.tensor([[1, 4, 0], [2, 2, 3]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=F64)
    logp = logits.log_softmax(-1).gather(-1, targets[..., None]).squeeze(-1)
    prob = logp.detach().exp()
    for i, t in ((0, 0), (0, 2), (1, 1)):
        sft_t, = torch.autograd.grad(sft_loss(logp, mask)[i, t], logits, retain_graph=True)
        dft_t, = torch.autograd.grad(dft_loss(logp, mask)[i, t], logits, retain_graph=True)
        close(dft_t, prob[i, t] * sft_t, 1e-12)
    sequence_prob = torch.exp((logp.detach() * mask).sum(-1))
    sft_all, = torch.autograd.grad(sft_loss(logp, mask).sum(-1)[1], logits, retain_graph=True)
    dft_all, = torch.autograd.grad(dft_loss(logp, mask, weight="sequence").sum(-1)[1], logits)
    close(dft_all, sequence_prob[1] * sft_all, 1e-12)


def test_clip_share_by_length_splits_at_the_median_completion():
    from rlscale.rlvr.loss_metrics import clip_by_length

    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    ratio = torch.tensor([[1.5, 1.0, 1.0, 1.0], [1.5, 1.5, 1.5, 1.0]])  # clipped above 1.2
    figures = clip_by_length(ratio, torch.tensor([1.0, 1.0]), mask > 0, 0.2, 0.2, mask)
    assert figures == {"clip/frac_short": 0.5, "clip/frac_long": 0.75}
    # a sequence ratio: one unit per completion; a negative advantage clips below 0.8
    seq = clip_by_length(torch.tensor([0.5, 1.0]), torch.tensor([-1.0, -1.0]),
                         torch.tensor([True, True]), 0.2, 0.2, mask)
    assert seq == {"clip/frac_short": 1.0, "clip/frac_long": 0.0}
    nothing = clip_by_length(ratio, torch.tensor([1.0, 1.0]), torch.zeros_like(mask) > 0,
                             0.2, 0.2, mask)
    assert nothing == {"clip/frac_short": 0.0, "clip/frac_long": 0.0}
