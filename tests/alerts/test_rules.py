"""The alert rules over record sequences: each fires once per episode on the records that
show its condition, and stays quiet on healthy ones."""

from __future__ import annotations

import math

import pytest

from workbench.alerts.rules import (
    EvalRegression,
    KlSpike,
    NonFinite,
    RatioSpike,
    RewardCollapse,
    failure_burst,
    record_rules,
    stalled,
)
from workbench.config.alerts import AlertsSection


def orchestrator(rewards: list[float]) -> list[dict]:
    return [
        {"source": "orchestrator", "step": step, "reward_mean": reward}
        for step, reward in enumerate(rewards)
    ]


def trainer(key: str, values: list[float], **other) -> list[dict]:
    return [
        {"source": "trainer", "step": step, key: value, **other}
        for step, value in enumerate(values, start=1)
    ]


def findings(rule, records: list[dict]) -> list:
    return [f for record in records if (f := rule.observe(record)) is not None]


# A healthy run of the built-in reverse_text task: a slow climb with step-to-step noise.
HEALTHY_REWARDS = [0.65, 0.62, 0.68, 0.66, 0.71, 0.69, 0.74, 0.72, 0.78, 0.75, 0.8, 0.77]


def test_a_reward_that_falls_over_a_few_steps_is_one_collapse_alert():
    rewards = [*HEALTHY_REWARDS, 0.6, 0.4, 0.3, 0.2, 0.2, 0.1]
    found = findings(RewardCollapse(drop=0.25, window=10), orchestrator(rewards))
    assert len(found) == 1
    assert found[0].rule == "reward_collapse" and found[0].key == f"step {found[0].step}"
    assert "reward collapsed" in found[0].message


def test_a_recovered_reward_that_collapses_again_is_a_second_alert():
    rewards = [0.8] * 5 + [0.3] * 4 + [0.8] * 12 + [0.3] * 4
    found = findings(RewardCollapse(drop=0.25, window=10), orchestrator(rewards))
    assert len(found) == 2


def test_a_healthy_noisy_reward_and_dropped_batches_raise_nothing():
    records = orchestrator(HEALTHY_REWARDS)
    records.insert(5, {"source": "orchestrator", "step": 5, "reward_mean": 0.0, "written": False})
    assert findings(RewardCollapse(drop=0.25, window=10), records) == []


def test_an_eval_below_the_best_earlier_eval_is_a_regression():
    evals = [0.6, 0.7, 0.72, 0.5, 0.45, 0.71, 0.5]
    records = [
        {"source": "eval", "step": 5 * i, "eval_reward_mean": v} for i, v in enumerate(evals)
    ]
    found = findings(EvalRegression(drop=0.15), records)
    assert [f.step for f in found] == [15, 30]  # again after it recovered at step 25
    assert found[0].values["best"] == 0.72


def test_evals_that_climb_raise_nothing():
    records = [
        {"source": "eval", "step": i, "eval_reward_mean": v}
        for i, v in enumerate([0.6, 0.65, 0.64, 0.7, 0.69])
    ]
    assert findings(EvalRegression(drop=0.15), records) == []


def test_a_nan_loss_alerts_once_until_a_finite_update():
    records = trainer("loss", [0.1, math.nan, math.nan, 0.1, math.inf], grad_norm=0.5)
    found = findings(NonFinite(), records)
    assert [f.step for f in found] == [2, 5]
    assert "non-finite loss nan" in found[0].message


def test_an_infinite_gradient_norm_is_non_finite():
    found = findings(NonFinite(), trainer("grad_norm", [0.3, math.inf], loss=0.1))
    assert [f.step for f in found] == [2]


def test_finite_updates_are_not_non_finite():
    assert findings(NonFinite(), trainer("loss", [0.1, -0.2, 0.0], grad_norm=1e3)) == []


def test_a_kl_far_above_its_median_is_a_spike_and_a_lasting_one_one_alert():
    kls = [0.001, 0.0012, 0.0011, 0.0013, 0.5, 0.6, 0.7, 0.001, 0.9]
    found = findings(KlSpike(factor=10, minimum=0.05), trainer("base_kl", kls))
    assert [f.step for f in found] == [5, 9]


def test_a_small_kl_that_grows_slowly_is_no_spike():
    kls = [0.001 * 1.3**i for i in range(20)]  # up to 0.15, never 10x its median
    assert findings(KlSpike(factor=10, minimum=0.05), trainer("base_kl", kls)) == []


def test_a_mean_importance_ratio_far_from_one_is_a_spike():
    ratios = [1.0, 0.99, 3.5, 4.0, 1.01, 0.2, math.nan]
    found = findings(RatioSpike(limit=2.0), trainer("ratio_mean", ratios))
    assert [f.step for f in found] == [3, 6]  # a NaN is non_finite's: no third


def test_healthy_ratios_of_a_real_run_are_no_spike():
    # ratio_mean of a built-in-model run ranged 0.9857 to 1.003 (ratio_min 0.077, max 1.56).
    ratios = [1.0, 1.001, 0.9999, 0.9857, 1.003]
    assert findings(RatioSpike(limit=2.0), trainer("ratio_mean", ratios, ratio_min=0.077)) == []


def test_a_run_stalls_once_it_recorded_and_then_went_quiet():
    assert not stalled(None, now=10_000, stall_s=900)  # never recorded: it may wait for a slot
    assert not stalled(1_000, now=1_899, stall_s=900)
    assert stalled(1_000, now=1_900, stall_s=900)


def test_failures_within_the_window_are_a_burst_at_the_count():
    assert failure_burst([100, 200, 300], now=400, count=3, window_s=600) == [100, 200, 300]
    assert failure_burst([100, 200, 300], now=750, count=3, window_s=600) == []
    assert failure_burst([100, 200], now=300, count=3, window_s=600) == []


@pytest.mark.parametrize("rule", ["reward_collapse", "non_finite", "kl_spike"])
def test_a_disabled_rule_is_not_checked(rule):
    names = {r.rule for r in record_rules(AlertsSection(disabled=[rule]))}
    assert rule not in names and len(names) == 4
    assert record_rules(AlertsSection(enabled=False)) == []
