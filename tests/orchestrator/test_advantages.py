"""Advantage estimators per run, against hand-computed values from the reference's formulas
(RLOO, GRPO's and REINFORCE++'s, as verl's `core_algos.py` computes them), written out here."""

from __future__ import annotations

import math

import pytest

from workbench.config import AdvantageConfig
from workbench.orchestrator.advantages import compute_advantages, group_advantages

REWARDS = [1.0, 0.0, 0.5, 0.5, 0.2, 0.9, 0.4, 0.1]  # two groups of four


def test_the_default_is_todays_reward_minus_the_group_mean_bit_for_bit():
    assert compute_advantages(REWARDS, 4) == group_advantages(REWARDS, 4)
    assert compute_advantages(REWARDS, 4, AdvantageConfig()) == group_advantages(REWARDS, 4)


def test_leave_one_out_subtracts_the_mean_of_the_other_completions():
    advantages = compute_advantages(REWARDS, 4, AdvantageConfig(baseline="leave_one_out"))
    # R_i - sum_{j != i} R_j / (G - 1), written out for the first group.
    assert advantages[0] == pytest.approx(1.0 - (0.0 + 0.5 + 0.5) / 3)
    assert advantages[1] == pytest.approx(0.0 - (1.0 + 0.5 + 0.5) / 3)
    assert advantages[2] == pytest.approx(0.5 - (1.0 + 0.0 + 0.5) / 3)
    assert advantages[5] == pytest.approx(0.9 - (0.2 + 0.4 + 0.1) / 3)


def test_group_std_divides_by_the_groups_sample_std_plus_eps():
    advantages = compute_advantages(REWARDS, 4, AdvantageConfig(scale="group_std"))
    mean = 0.5
    std = math.sqrt(((0.5) ** 2 + (0.5) ** 2 + 0 + 0) / 3)  # unbiased, as torch.std
    assert advantages[0] == pytest.approx((1.0 - mean) / (std + 1e-6))
    second = [0.2, 0.9, 0.4, 0.1]
    mean2 = sum(second) / 4
    std2 = math.sqrt(sum((r - mean2) ** 2 for r in second) / 3)
    assert advantages[5] == pytest.approx((0.9 - mean2) / (std2 + 1e-6))


def test_a_group_of_equal_rewards_gets_zero_advantages_under_group_std():
    advantages = compute_advantages(
        [0.3] * 4 + [1.0, 0.0, 1.0, 0.0], 4, AdvantageConfig(scale="group_std")
    )
    assert advantages[:4] == [0.0] * 4
    assert advantages[4] == pytest.approx(0.5 / (math.sqrt(1 / 3) + 1e-6))


def test_batch_std_scales_by_the_std_over_the_runs_own_step():
    centred = group_advantages(REWARDS, 4)
    mean = sum(centred) / len(centred)
    std = math.sqrt(sum((a - mean) ** 2 for a in centred) / (len(centred) - 1))
    advantages = compute_advantages(REWARDS, 4, AdvantageConfig(scale="batch_std"))
    assert advantages == pytest.approx([a / (std + 1e-6) for a in centred])


def test_rloo_with_group_std_combines_both():
    config = AdvantageConfig(baseline="leave_one_out", scale="group_std", std_eps=1e-4)
    advantages = compute_advantages(REWARDS, 4, config)
    std = math.sqrt(0.5 / 3)
    assert advantages[0] == pytest.approx((1.0 - 1.0 / 3) / (std + 1e-4))


def test_groups_must_divide_the_batch():
    with pytest.raises(ValueError, match="do not split into groups of 3"):
        compute_advantages(REWARDS, 3, AdvantageConfig(scale="group_std"))
