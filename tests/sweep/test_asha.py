"""ASHA early stopping, the pure decision: rungs, cutoffs, ranks, and the runs that crash,
join late or are evicted by hand."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from workbench.sweep.asha import (
    MetricPoint,
    RunCurve,
    RungResult,
    advance,
    judge,
    latest_by_run,
    quantile,
    value_at,
)
from workbench.sweep.spec import AshaSpec

SPEC = AshaSpec(grace_steps=5, reduction_factor=2, metric="eval_reward_mean", min_runs=3)


def curve(
    run_id: str,
    values: dict[int, float],
    *,
    start: float = 0.0,
    max_steps: int = 40,
    finished: bool = False,
    evicted: bool = False,
) -> RunCurve:
    """A run whose metric at step s is values[s], recorded at time start + s."""
    points = tuple(MetricPoint(step, value, start + step) for step, value in sorted(values.items()))
    return RunCurve(run_id, points, max_steps, finished=finished, evicted=evicted)


def linear(slope: float, steps: Sequence[int] = range(0, 41, 5)) -> dict[int, float]:
    return {step: round(slope * step, 6) for step in steps}


def decisions(results: list[RungResult]) -> list[tuple[str, int, str]]:
    return [(r.run_id, r.rung, r.decision) for r in results]


def test_rungs_sit_at_grace_times_powers_of_the_factor_below_max_steps():
    assert SPEC.rung_steps(40) == [5, 10, 20]
    assert SPEC.rung_steps(41) == [5, 10, 20, 40]
    assert AshaSpec(grace_steps=3, reduction_factor=3).rung_steps(100) == [3, 9, 27, 81]
    assert SPEC.rung_steps(5) == [], "a rung at max_steps would judge finished runs"


def test_the_eviction_reason_names_rung_metric_cutoff_and_rank():
    result = RungResult("run_x", 2, 20, 0.41, 6, 8, 0.55, "stop", 100.0)
    assert result.reason("eval_reward_mean", "max") == (
        "asha rung 2 (step 20): eval_reward_mean 0.41 < cutoff 0.55, rank 6/8"
    )
    lower = RungResult("run_x", 0, 5, 2.5, 3, 3, 1.25, "stop", 1.0)
    assert lower.reason("loss", "min") == "asha rung 0 (step 5): loss 2.5 > cutoff 1.25, rank 3/3"


def test_numbers_in_a_reason_get_the_digits_that_tell_them_apart():
    result = RungResult("run_x", 0, 5, 0.54999, 2, 3, 0.55, "stop", 1.0)
    assert "0.54999 < cutoff 0.55," in result.reason("m", "max")


def test_the_bottom_half_of_eight_runs_stops_when_the_factor_is_two():
    values = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2]
    stops = []
    for value in values:
        others = [v for v in values if v != value]
        rank, count, cutoff, decision = judge(others, value, SPEC)
        assert count == 8 and cutoff == quantile(values, 0.5) == 0.55
        stops.append((rank, decision))
    assert stops == [
        (1, "continue"),
        (2, "continue"),
        (3, "continue"),
        (4, "continue"),
        (5, "stop"),
        (6, "stop"),
        (7, "stop"),
        (8, "stop"),
    ]


def test_a_factor_of_three_keeps_the_top_third():
    values = [float(v) for v in range(1, 10)]
    spec = AshaSpec(reduction_factor=3, min_runs=3)
    kept = [v for v in values if judge([o for o in values if o != v], v, spec)[3] == "continue"]
    assert kept == [7.0, 8.0, 9.0]


def test_mode_min_keeps_the_lowest_values():
    spec = AshaSpec(metric="loss", mode="min", min_runs=3)
    assert judge([1.0, 2.0, 3.0], 4.0, spec)[3] == "stop"
    assert judge([2.0, 3.0, 4.0], 1.0, spec)[3] == "continue"
    assert judge([2.0, 3.0, 4.0], 1.0, spec)[0] == 1, "rank 1 is the lowest loss"


def test_ties_never_stop_a_run_and_share_a_rank():
    assert judge([0.5, 0.5, 0.5], 0.5, SPEC) == (1, 4, 0.5, "continue")
    rank, _, _, decision = judge([0.9, 0.5, 0.5], 0.5, SPEC)
    assert (rank, decision) == (2, "continue"), "0.5 equals the cutoff: it goes on"


def test_too_few_runs_at_a_rung_stop_nobody():
    assert judge([0.9], 0.1, SPEC) == (2, 2, None, "too_few")
    assert judge([0.9, 0.8], 0.1, SPEC)[3] == "stop", "the third run meets min_runs"


def test_the_value_at_a_rung_is_the_latest_record_at_or_before_its_step():
    points = [MetricPoint(0, 0.1, 0), MetricPoint(4, 0.4, 1), MetricPoint(8, 0.8, 2)]
    assert value_at(points, 5) == 0.4
    assert value_at(points, 8) == 0.8
    assert value_at(points, -1) is None
    resumed = [*points, MetricPoint(4, 0.45, 3)]
    assert value_at(resumed, 5) == 0.45, "a step recorded again counts as last written"


def test_asynchronous_each_run_is_judged_on_arrival_against_those_before_it():
    runs = [
        curve("run_a", {5: 0.5}, start=0),
        curve("run_b", {5: 0.3}, start=1),
        curve("run_c", {5: 0.1}, start=2),
        curve("run_d", {5: 0.9}, start=3),
        curve("run_e", {5: 0.2}, start=4),
    ]
    results = advance([], runs, SPEC)
    assert decisions(results) == [
        ("run_a", 0, "too_few"),
        ("run_b", 0, "too_few"),
        ("run_c", 0, "stop"),
        ("run_a", 0, "continue"),  # judged once the rung has min_runs values
        ("run_b", 0, "continue"),  # equal to the cutoff: goes on
        ("run_d", 0, "continue"),
        ("run_e", 0, "stop"),
    ]
    ranks = [(r.rank, r.of) for r in results]
    assert ranks == [(1, 1), (2, 2), (3, 3), (1, 3), (2, 3), (1, 4), (4, 5)]
    assert results[2].cutoff == results[3].cutoff == 0.3
    assert results[3].reached_at == results[2].reached_at == 7, "judged when run_c arrived"


def test_the_first_arrivals_are_judged_once_min_runs_have_reached_the_rung():
    # Runs that start together reach every rung together: without the wait, the two first
    # at each rung would go on unjudged every time.
    runs = [
        curve("run_a", linear(0.001), start=0),
        curve("run_b", linear(0.002), start=1),
        curve("run_c", linear(0.03), start=2),
        curve("run_d", linear(0.02), start=3),
    ]
    results = advance([], runs, SPEC)
    assert [d for d in decisions(results) if d[1] == 0] == [
        ("run_a", 0, "too_few"),
        ("run_b", 0, "too_few"),
        ("run_c", 0, "continue"),
        ("run_a", 0, "stop"),
        ("run_b", 0, "continue"),
        ("run_d", 0, "continue"),
    ]
    assert "run_a" not in {r.run_id for r in results if r.rung > 0}, "stopped at rung 0"
    assert latest_by_run(results)["run_a"].decision == "stop"


def test_a_wait_that_ends_after_the_run_went_on_stops_it_all_the_same():
    # Two slots: run_a and run_b pass rungs 0 and 1 before a third run reaches rung 0.
    early = [curve("run_a", linear(0.001), start=0), curve("run_b", linear(0.03), start=1)]
    first = advance([], early, SPEC)
    assert {d[2] for d in decisions(first)} == {"too_few"}
    late = curve("run_c", {5: 0.1}, start=500)
    new = advance(first, [*early, late], SPEC)
    assert decisions(new) == [
        ("run_c", 0, "continue"),
        ("run_a", 0, "stop"),
        ("run_b", 0, "continue"),
    ]
    standing = latest_by_run([*first, *new])
    assert (standing["run_a"].rung, standing["run_a"].decision) == (0, "stop")
    assert (standing["run_b"].rung, standing["run_b"].decision) == (2, "too_few")


def test_waits_over_in_a_file_from_an_older_build_are_judged_at_once():
    older = [
        RungResult("run_a", 0, 5, 0.1, 1, 1, None, "too_few", 1.0),
        RungResult("run_b", 0, 5, 0.5, 1, 2, None, "too_few", 2.0),
        RungResult("run_c", 0, 5, 0.9, 1, 3, 0.5, "continue", 3.0),
    ]
    new = advance(older, [], SPEC)
    assert decisions(new) == [("run_a", 0, "stop"), ("run_b", 0, "continue")]
    assert {r.reached_at for r in new} == {3.0}


def test_a_run_that_joins_late_is_compared_with_every_run_recorded_so_far():
    early = [curve(f"run_{i}", {5: 0.1 * i}, start=i) for i in range(1, 5)]
    results = advance([], early, SPEC)
    late = curve("run_late", {5: 0.15}, start=1000)
    new = advance(results, [*early, late], SPEC)
    assert decisions(new) == [("run_late", 0, "stop")]
    assert (new[0].rank, new[0].of) == (4, 5)
    assert new[0].cutoff == 0.2, "the median of 0.1, 0.15, 0.2, 0.3, 0.4"


def test_decisions_are_never_revisited_and_a_replay_adds_nothing():
    runs = [curve(f"run_{i}", linear(0.01 * i)) for i in range(1, 7)]
    first = advance([], runs, SPEC)
    # As the supervisor reads them again: the runs it stopped are evicted by then.
    stopped = {r.run_id for r in first if r.decision == "stop"}
    assert stopped, "the slowest are stopped"
    again = [replace(run, evicted=run.run_id in stopped) for run in runs]
    assert advance(first, again, SPEC) == []
    assert advance([], runs, SPEC) == first, "the same records give the same decisions"


def test_a_run_is_judged_only_once_it_has_a_record_at_or_past_the_rung():
    before = curve("run_a", {0: 0.2, 4: 0.3})
    assert advance([], [before], SPEC) == []
    after = curve("run_a", {0: 0.2, 4: 0.3, 6: 0.35})
    [result] = advance([], [after], SPEC)
    assert (result.rung, result.step, result.value) == (0, 5, 0.3)


def test_a_run_without_a_record_before_the_rung_is_not_judged_there():
    runs = [
        curve("run_sparse", {10: 0.9}),
        *(curve(f"run_{i}", {5: 0.5, 10: 0.5}) for i in range(3)),
    ]
    results = advance([], runs, SPEC)
    sparse = [r for r in results if r.run_id == "run_sparse"]
    assert [(r.rung, r.decision, r.value) for r in sparse] == [
        (0, "no_value", None),
        (1, "continue", 0.9),
    ]
    assert all(r.of <= 3 for r in results if r.rung == 0), "no value, no count"


def test_a_finished_run_reaches_its_remaining_rungs_with_its_last_values():
    finished = curve("run_f", {0: 0.1, 7: 0.7}, max_steps=12, finished=True)
    results = advance([], [finished], SPEC)
    assert [(r.rung, r.value) for r in results] == [(0, 0.1), (1, 0.7)]


def test_a_stopped_run_is_not_judged_at_later_rungs_while_it_stays_evicted():
    runs = [curve(f"run_{i}", linear(0.1 * i)) for i in range(1, 4)]
    runs[0] = RunCurve("run_1", (MetricPoint(5, 0.0, 99.0),), 40)  # worst, and last at rung 0
    first = advance([], runs, SPEC)
    assert ("run_1", 0, "stop") in decisions(first)
    more = RunCurve(
        "run_1", (MetricPoint(5, 0.0, 99.0), MetricPoint(12, 9.0, 120.0)), 40, evicted=True
    )
    assert [r for r in advance(first, [runs[1], runs[2], more], SPEC) if r.run_id == "run_1"] == []


def test_a_stopped_run_that_the_user_restarted_is_judged_again_from_the_next_rung():
    runs = [curve("run_2", linear(0.2)), curve("run_3", linear(0.3))]
    slow = RunCurve("run_1", (MetricPoint(5, 0.0, 99.0),), 40)
    first = advance([], [*runs, slow], SPEC)
    assert ("run_1", 0, "stop") in decisions(first)
    restarted = RunCurve(
        "run_1", (MetricPoint(5, 0.0, 99.0), MetricPoint(10, 5.0, 200.0)), 40, evicted=False
    )
    new = [r for r in advance(first, [*runs, restarted], SPEC) if r.run_id == "run_1"]
    assert [(r.rung, r.decision) for r in new] == [(1, "continue")]


def test_a_run_stopped_at_one_rung_is_not_judged_at_the_next_in_the_same_pass():
    runs = [curve("run_a", linear(0.3), start=-100), curve("run_b", linear(0.2), start=-100)]
    lagging = curve("run_c", linear(0.01), start=0)  # reaches rungs 0 and 1 in one read
    results = advance([], [*runs, lagging], SPEC)
    assert [(r.rung, r.decision) for r in results if r.run_id == "run_c"] == [(0, "stop")]


def test_runs_that_crashed_or_were_evicted_by_hand_still_count_at_their_rungs():
    crashed = curve("run_crashed", {0: 0.1, 5: 0.9})  # no record after step 5: it died
    by_hand = curve("run_by_hand", {0: 0.1, 5: 0.8}, start=1, evicted=True)
    results = advance([], [crashed, by_hand], SPEC)
    assert [(r.run_id, r.rung) for r in results] == [("run_crashed", 0), ("run_by_hand", 0)]
    newcomer = curve("run_new", {5: 0.5}, start=50)
    judged, *waited = advance(results, [crashed, by_hand, newcomer], SPEC)
    assert (judged.rank, judged.of, judged.decision) == (3, 3, "stop")
    assert judged.cutoff == 0.8
    assert decisions(waited) == [("run_crashed", 0, "continue"), ("run_by_hand", 0, "continue")]


def test_synthetic_curves_leave_the_steepest_runs_standing():
    # Eight runs learning at different speeds, with noise that never reorders them by
    # more than a neighbour; they start together, so each rung sees them in step order.
    slopes = [0.010, 0.020, 0.015, 0.030, 0.005, 0.025, 0.035, 0.012]
    noise = [0.01, -0.01, 0.0, 0.005, -0.005, 0.0, 0.01, -0.01]
    runs = [
        curve(f"run_{i}", {s: slope * s + n for s in range(0, 41)}, start=0.001 * i)
        for i, (slope, n) in enumerate(zip(slopes, noise, strict=True))
    ]
    results = advance([], runs, SPEC)
    stopped = {r.run_id for r in results if r.decision == "stop"}
    survivors = {f"run_{i}" for i in range(8)} - stopped
    assert "run_6" in survivors and "run_3" in survivors, "the two steepest go the distance"
    assert "run_4" in stopped, "the flattest is stopped"
    assert all(r.rung <= 2 for r in results)
    at_last_rung = latest_by_run(results)
    assert all(at_last_rung[run].rung == 2 for run in survivors)


def test_latest_by_run_gives_each_runs_highest_rung():
    results = [
        RungResult("run_a", 0, 5, 0.1, 1, 1, None, "too_few", 1.0),
        RungResult("run_b", 0, 5, 0.2, 1, 2, None, "too_few", 2.0),
        RungResult("run_a", 1, 10, 0.3, 1, 1, None, "too_few", 3.0),
    ]
    latest = latest_by_run(results)
    assert latest["run_a"].rung == 1 and latest["run_b"].rung == 0


# ---------------------------------------------------------------- runs that diverged


def diverged(run_id: str, values: dict[int, float], at: float) -> RunCurve:
    """A run the trainer evicted for divergence at time `at`, having recorded `values`."""
    return replace(curve(run_id, values, evicted=True), diverged_at=at)


def test_a_diverged_run_takes_the_last_place_at_its_next_rung_so_the_others_need_not_wait():
    # Three runs, min_runs 3: one diverges at step 3, before the first rung (step 5).
    runs = [
        diverged("run_x", {0: 0.3}, at=3.5),
        curve("run_a", {0: 0.3, 5: 0.6}, start=1),
        curve("run_b", {0: 0.3, 5: 0.4}, start=2),
    ]
    results = advance([], runs, SPEC)
    assert decisions(results) == [
        ("run_x", 0, "diverged"),
        ("run_a", 0, "too_few"),
        ("run_b", 0, "continue"),  # the rung is full: the diverged run counts
        ("run_a", 0, "continue"),
    ]
    place = results[0]
    assert (place.step, place.value, place.rank, place.of, place.cutoff) == (5, None, None, 1, None)
    assert place.reached_at == 3.5, "it is placed when it was evicted"
    # Successive halving of three keeps the top half, which the diverged one is not: the
    # cutoff between it and the worse real value is that value, so both go on.
    assert [(r.rank, r.of, r.cutoff) for r in results[2:]] == [(2, 3, 0.4), (1, 3, 0.4)]
    assert latest_by_run(results)["run_x"].decision == "diverged"
    assert advance(results, runs, SPEC) == [], "decided once"
    # Without it, the two would wait at the rung for a third run that never comes.
    waiting = advance([], runs[1:], SPEC)
    assert decisions(waiting) == [("run_a", 0, "too_few"), ("run_b", 0, "too_few")]


def test_a_diverged_run_ranks_below_every_value_and_never_raises_the_cutoff():
    spec = AshaSpec(grace_steps=5, reduction_factor=2, min_runs=2)
    runs = [
        diverged("run_x", {}, at=1.0),
        diverged("run_y", {}, at=2.0),
        curve("run_a", {5: 0.2}, start=10),
        curve("run_b", {5: 0.1}, start=20),
    ]
    results = advance([], runs, spec)
    assert [(r.run_id, r.decision, r.rank, r.of) for r in results] == [
        ("run_x", "diverged", None, 1),
        ("run_y", "diverged", None, 2),
        ("run_a", "continue", 1, 3),
        ("run_b", "continue", 2, 4),  # the median falls among the diverged: cutoff 0.1
    ]
    assert results[3].cutoff == 0.1
    # For mode min the diverged runs sit above every value instead.
    lowest = AshaSpec(grace_steps=5, reduction_factor=2, min_runs=2, mode="min")
    judged = [r for r in advance([], runs, lowest) if r.decision != "diverged"]
    assert [(r.run_id, r.decision, r.cutoff) for r in judged] == [
        ("run_a", "continue", 0.2),
        ("run_b", "continue", 0.2),
    ]


def test_a_diverged_run_counts_at_its_next_rung_only_and_is_judged_again_once_restarted():
    steady = [curve(f"run_{i}", linear(0.1 * i)) for i in range(1, 4)]
    # The best at rung 0 (step 5), then nan before rung 1 (step 10).
    gone = diverged("run_x", {0: 0.3, 5: 2.0}, at=8.0)
    results = advance([], [*steady, gone], SPEC)
    assert [(r.rung, r.decision) for r in results if r.run_id == "run_x"] == [
        (0, "continue"),
        (1, "diverged"),
    ]
    # It fills rung 1 (run_1 was stopped at rung 0), and counts nowhere beyond, as a run
    # stopped there would not.
    assert [(r.run_id, r.decision, r.of) for r in results if r.rung == 1] == [
        ("run_x", "diverged", 1),
        ("run_2", "too_few", 2),
        ("run_3", "continue", 3),
        ("run_2", "continue", 3),
    ]
    assert decisions([r for r in results if r.rung == 2]) == [
        ("run_2", 2, "too_few"),
        ("run_3", 2, "too_few"),
    ]
    # Restarted (its eviction lifted), it is judged again from the rung after.
    restarted = curve("run_x", {0: 0.3, 5: 2.0, 10: 2.5, 20: 7.0}, start=100)
    again = [r for r in advance(results, [*steady, restarted], SPEC) if r.run_id == "run_x"]
    assert [(r.rung, r.decision) for r in again] == [(2, "continue")]


def test_quantiles_over_a_diverged_runs_place_are_that_infinity_or_a_value():
    assert quantile([-math.inf, 0.5, 0.7], 0.5) == 0.5
    assert quantile([-math.inf, -math.inf, 0.1, 0.2], 0.5) == -math.inf
    assert quantile([0.1, 0.2, math.inf, math.inf], 0.5) == math.inf
    assert quantile([0.1, 0.3], 0.5) == 0.2
