"""SFT is a policy gradient with weight 1/pi: the identity by exact enumeration, its
Monte-Carlo estimate, and the estimator's variance as the target becomes improbable."""

import pytest
import torch

from rlscale.rlvr import sft_pg

torch.set_num_threads(1)
TARGET = (0, 1, 2)


def close(actual, expected, tol=1e-12):
    assert torch.allclose(actual, expected, atol=tol, rtol=0), (actual, expected)


def test_table_policy_is_a_distribution_over_every_sequence():
    policy = sft_pg.table_policy(vocab=3, length=3, seed=1)
    sequences = policy.sequences()
    assert len(sequences) == 27 and len(set(sequences)) == 27
    total = sum(sft_pg.grad_logprob(policy, y)[0] for y in sequences)
    assert total == pytest.approx(1.0, abs=1e-12)
    # rows: 1 empty prefix, 3 of length 1, 9 of length 2, each a distinct row
    prefixes = torch.tensor([y[:2] for y in sequences])
    assert sorted(set(sft_pg.prefix_rows(prefixes, 3).tolist())) == list(range(4, 13))


@pytest.mark.parametrize("seed, vocab, length, target", [
    (0, 3, 3, TARGET), (1, 2, 3, (1, 1, 0)), (2, 4, 2, (3, 0)), (3, 3, 1, (2,))])
def test_importance_weighted_policy_gradient_is_the_sft_gradient(seed, vocab, length, target):
    policy = sft_pg.table_policy(vocab, length, seed=seed)
    prob, sft_gradient = sft_pg.grad_logprob(policy, target)
    # E_{y~pi}[(1/pi(y)) 1{y = y*} grad log pi(y)], every y enumerated = grad log pi(y*)
    close(sft_pg.importance_weighted_gradient(policy, target), sft_gradient)
    # the library's SFT loss has that gradient; without the 1/pi weight the policy
    # gradient is pi(y*) grad log pi(y*), which is DFT with the sequence weight
    close(sft_pg.demonstration_gradient(policy, target, "one"), sft_gradient)
    close(sft_pg.plain_policy_gradient(policy, target), prob * sft_gradient)
    close(sft_pg.demonstration_gradient(policy, target, "sequence"), prob * sft_gradient)
    assert sft_gradient.abs().max() > 0.1  # not trivially zero


def test_monte_carlo_estimate_converges_to_the_sft_gradient():
    policy = sft_pg.less_likely(sft_pg.table_policy(seed=0), TARGET, -2.0)  # p ~ 0.13
    prob, exact = sft_pg.grad_logprob(policy, TARGET)
    errors = []
    for samples in (1_000, 100_000):
        estimate = sft_pg.monte_carlo_gradient(policy, TARGET, samples,
                                               torch.Generator().manual_seed(0))
        errors.append(float((estimate - exact).norm() / exact.norm()))
        # relative standard error sqrt((1 - p) / (p n)); allow 4 of them
        assert errors[-1] < 4 * ((1 - prob) / (prob * samples)) ** 0.5
    assert errors[1] < 0.02 and errors[1] < errors[0]


def test_estimator_variance_blows_up_as_the_target_becomes_improbable():
    base = sft_pg.table_policy(seed=0)
    spreads = [sft_pg.estimator_spread(sft_pg.less_likely(base, TARGET, shift), TARGET,
                                       20_000, torch.Generator().manual_seed(0))
               for shift in (-3.0, -2.0, -1.0, 0.0)]
    probs = [s.target_prob for s in spreads]
    assert probs == sorted(probs, reverse=True)
    for s in spreads:
        # one draw is 0 or g*/p: tr Cov = ||g*||^2 (1 - p) / p, exactly
        assert s.relative_variance == pytest.approx((1 - s.target_prob) / s.target_prob, rel=1e-9)
        assert s.weight == pytest.approx(1 / s.target_prob)
    variances = [s.variance for s in spreads]
    assert variances == sorted(variances) and variances[-1] > 1000 * variances[0]
    # measured from 20k draws where hits are common enough to measure (p > 0.02)
    for s in spreads[:3]:
        assert s.measured_variance == pytest.approx(s.variance, rel=0.25)


def test_variance_table_prints_one_row_per_shift():
    table = sft_pg.variance_table((0.0, 1.0), samples=2_000)
    lines = table.splitlines()
    assert len(lines) == 4 and lines[0].startswith("| shift | pi(y*")
