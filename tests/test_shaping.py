"""Length shaping against hand-computed numbers."""

import pytest
import torch

from rlscale.rlvr.shaping import (
    adaptive_length_penalty,
    constant_length_penalty,
    difficulty_buckets,
    group_success_rates,
    soft_overlong_penalty,
)


def close(actual, expected, tol=1e-6):
    assert torch.allclose(
        torch.as_tensor(actual, dtype=torch.float64),
        torch.as_tensor(expected, dtype=torch.float64),
        atol=tol,
        rtol=0,
    ), (actual, expected)


def test_constant_length_penalty():
    close(constant_length_penalty(torch.tensor([0, 10, 25]), 0.01), [0.0, -0.1, -0.25])
    close(constant_length_penalty([4.0], 0.5), [-2.0])


def test_soft_overlong_penalty():
    # max 100, buffer 20: free up to 80, ramp (80 - L) / 20 up to 100, -1 beyond
    lengths = torch.tensor([50, 80, 81, 90, 100, 101, 120])
    close(soft_overlong_penalty(lengths, 100, 20), [0.0, 0.0, -0.05, -0.5, -1.0, -1.0, -1.0])
    with pytest.raises(ValueError):
        soft_overlong_penalty(lengths, 100, 0)


def test_adaptive_length_penalty_by_hand():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    lengths = torch.tensor([10, 20, 30, 40, 40, 10, 20, 30])
    penalty = adaptive_length_penalty(rewards, lengths, 4, strength=1.0)
    # group 1: p = 3/4, relative lengths (L - 10) / 30 = [0, 1/3, 2/3, 1]; the wrong one free
    # group 2: p = 1/4, its only correct answer is the longest: -1/4
    close(penalty, [0.0, -0.25, -0.5, 0.0, -0.25, 0.0, 0.0, 0.0])
    close(adaptive_length_penalty(rewards, lengths, 4, strength=2.0), 2 * penalty)


def test_adaptive_penalty_hits_easy_prompts_harder():
    lengths = torch.tensor([10, 20, 30, 40] * 2)
    easy = torch.tensor([1.0, 1.0, 1.0, 1.0])
    hard = torch.tensor([0.0, 0.0, 0.0, 1.0])
    penalty = adaptive_length_penalty(torch.cat([easy, hard]), lengths, 4, strength=0.5)
    # same longest correct completion: easy -0.5 * 1 * 1, hard -0.5 * 1/4 * 1
    close(penalty[3], -0.5)
    close(penalty[7], -0.125)
    assert penalty[3] < penalty[7]
    # equal lengths carry no length signal
    flat = adaptive_length_penalty(easy, torch.tensor([7, 7, 7, 7]), 4, strength=1.0)
    assert torch.equal(flat, torch.zeros(4))


def test_success_rates_and_buckets():
    rewards = torch.tensor([1.0, 0, 0, 1, 1, 0, 1, 1, 1, 0.5, 0, 0])
    rates = group_success_rates(rewards, 3)
    close(rates, [1 / 3, 2 / 3, 1.0, 1 / 3])
    assert difficulty_buckets(rates) == ["medium", "medium", "easy", "medium"]
    assert difficulty_buckets(torch.tensor([0.0, 0.3, 2 / 3, 0.7, 1.0], dtype=torch.float32)) == [
        "hard",
        "hard",
        "medium",
        "easy",
        "easy",
    ]
    assert difficulty_buckets([0.5]) == ["medium"]


def test_shaping_terms_are_a_registry_switched_by_the_objective():
    from rlscale.rlvr.objectives import Objective
    from rlscale.rlvr.shaping import SHAPING_TERMS, ShapingInputs, shape_rewards

    assert list(SHAPING_TERMS) == ["length_penalty_per_token", "overlong_penalty",
                                   "adaptive_length_penalty"]
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    lengths = torch.tensor([2.0, 10.0, 9.0, 6.0])
    inputs = ShapingInputs(rewards, lengths, group_size=4, max_length=10)
    # everything off: the verifier's rewards, nothing logged
    plain, stats = shape_rewards(inputs, Objective())
    assert torch.equal(plain, rewards) and stats == {} and plain is not rewards
    objective = Objective(length_penalty_per_token=0.01, overlong_penalty=True,
                          overlong_buffer_frac=0.2, adaptive_length_penalty=1.0)
    shaped, stats = shape_rewards(inputs, objective)
    # constant: -0.01 L = [-0.02, -0.1, -0.09, -0.06]
    # overlong, max 10, buffer round(0.2 * 10) = 2: free to 8, (8 - L) / 2 = [0, -1, -0.5, 0]
    # adaptive, p = 3/4, relative (L - 2) / 8 over the correct ones: [0, -, 7/8, 1/2] * -3/4
    overlong = [0.0, -1.0, -0.5, 0.0]
    adaptive = [0.0, 0.0, -0.75 * 7 / 8, -0.75 * 0.5]
    close(shaped, [1 - 0.02, 0 - 0.1 - 1.0, 1 - 0.09 - 0.5 - 0.75 * 7 / 8, 1 - 0.06 - 0.375])
    assert stats == pytest.approx({"length/overlong_penalty_mean": sum(overlong) / 4,
                                   "length/adaptive_penalty_mean": sum(adaptive) / 4})


def test_length_penalties_wait_for_their_start_step():
    from dataclasses import replace

    from rlscale.rlvr.objectives import Objective
    from rlscale.rlvr.shaping import ShapingInputs, shape_rewards

    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    lengths = torch.tensor([2.0, 10.0, 9.0, 6.0])
    objective = Objective(length_penalty_per_token=0.01, adaptive_length_penalty=1.0,
                          overlong_penalty=True, length_penalty_start=5)
    before = ShapingInputs(rewards, lengths, group_size=4, max_length=10, step=4)
    shaped, stats = shape_rewards(before, objective)
    # step 4 < 5: only the overlong term (not a length penalty of this field) applies
    close(shaped, [1.0, 0.0 - 1.0, 1.0 - 0.5, 1.0])
    assert "length/adaptive_penalty_mean" not in stats
    on, _ = shape_rewards(replace(before, step=5), objective)
    started, _ = shape_rewards(before, replace(objective, length_penalty_start=0))
    close(on, started.tolist())
