"""The advantage estimators against hand-computed numbers."""

import pytest
import torch

from rlscale.rlvr.advantages import (
    ADVANTAGE_ESTIMATORS,
    estimator_name,
    teacher_mixed_advantages,
)
from rlscale.rlvr.objectives import PRESETS, Objective

# Two groups of 4 completions: one with two right answers, one where all four are right.
REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
EPS = 1e-6


@pytest.mark.parametrize(("name", "first_group"), [
    # mean 0.5: R - 0.5
    ("group_mean", [0.5, -0.5, -0.5, 0.5]),
    # the others' mean: 1 - 1/3 = 2/3 for a right answer, 0 - 2/3 for a wrong one
    ("leave_one_out", [2 / 3, -2 / 3, -2 / 3, 2 / 3]),
    # population std of (1, 0, 0, 1) is 0.5: 0.5 / (0.5 + eps)
    ("std_normalized", [0.5 / (0.5 + EPS), -0.5 / (0.5 + EPS), -0.5 / (0.5 + EPS), 0.5 / (0.5 + EPS)]),
    ("leave_one_out_std_normalized",
     [(2 / 3) / (0.5 + EPS), -(2 / 3) / (0.5 + EPS), -(2 / 3) / (0.5 + EPS), (2 / 3) / (0.5 + EPS)]),
])
def test_each_sequence_estimator_matches_the_hand_computation(name, first_group):
    advantages = ADVANTAGE_ESTIMATORS[name](REWARDS, 4)
    assert advantages[:4].tolist() == pytest.approx(first_group, rel=1e-6)
    assert advantages[4:].tolist() == [0.0] * 4  # a group of equal rewards carries no signal


def test_the_switches_and_presets_name_their_estimator():
    assert set(ADVANTAGE_ESTIMATORS) == {"group_mean", "leave_one_out", "std_normalized",
                                         "leave_one_out_std_normalized", "reward"}
    # PPO's: the rewards pass through, its critic's GAE forms the advantages in the step
    assert ADVANTAGE_ESTIMATORS["reward"](REWARDS, 4).tolist() == REWARDS.tolist()
    assert PRESETS["ppo"].advantage_estimator == "reward"
    assert estimator_name(std_normalize=False, leave_one_out=False) == "group_mean"
    assert estimator_name(std_normalize=True, leave_one_out=True) == "leave_one_out_std_normalized"
    assert PRESETS["grpo"].advantage_estimator == "group_mean"
    assert PRESETS["dapo"].advantage_estimator == "std_normalized"
    assert Objective(advantage_leave_one_out=True).advantage_estimator == "leave_one_out"


def test_teacher_mixed_advantages_weigh_the_sequence_and_the_teacher_per_token():
    sequence = torch.tensor([0.5, -0.5])
    old = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]])
    teacher = torch.tensor([[-1.5, -1.0, -3.0], [-0.5, -2.5, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    mixed = teacher_mixed_advantages(sequence, old, teacher, mask, reward_weight=0.5,
                                     teacher_weight=2.0)
    # 0.5 * A_i + 2 * (teacher - old) on the completion's tokens; the padding keeps A_i only
    expected = torch.tensor([[0.25 - 1.0, 0.25 + 2.0, 0.25 + 0.0], [-0.25 + 0.0, -0.25 - 4.0, -0.25]])
    assert torch.allclose(mixed, expected)
    # without a teacher: the weighted sequence advantages, still one per sequence
    alone = teacher_mixed_advantages(sequence, old, None, mask, reward_weight=1.0,
                                     teacher_weight=0.0)
    assert alone.tolist() == [0.5, -0.5]
