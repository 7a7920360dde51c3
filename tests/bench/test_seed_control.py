"""The seed control of `bench e2e --vs separate`: a run whose curve split from its lone twin
passes only if it ends where the same run ends alone under some seed. Without experiments:
the benchmark itself runs under `just bench`."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.bench import separate, separate_setup
from workbench.bench.seed_control import (
    OUTCOME_STEPS,
    control_run_id,
    judge,
    outcome,
    prediction_interval,
    write_controls,
)
from workbench.bench.separate import CURVE_TOLERANCE, compare_curves, curves_pass, verdict_of
from workbench.recipe import load_recipe

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "reverse_text.toml"


def curve(*rewards: float) -> list[list]:
    return [[step, reward, step] for step, reward in enumerate(rewards)]


def setups_with(shared: list, twin: list) -> dict:
    return {
        "shared": {"runs": {"lr8p5e-3": {"curve": shared}}},
        "one_after_another": {"runs": {"lr8p5e-3": {"curve": twin}}},
        "at_once": {"skipped": "not asked"},
    }


def control_with(**curves_by_seed: list) -> dict:
    runs = {control_run_id("lr8p5e-3", int(seed[1:])): c for seed, c in curves_by_seed.items()}
    return {"runs": {run_id: {"curve": c} for run_id, c in runs.items()}}


def test_the_outcome_is_the_mean_reward_of_the_last_steps():
    rewards = [0.1] * 10 + [0.5] * OUTCOME_STEPS
    assert outcome(curve(*rewards)) == pytest.approx(0.5)
    assert outcome(curve(0.2, 0.4)) == pytest.approx(0.3)
    assert outcome([]) is None


SEEDS = (1, 2, 3, 4)


def test_a_split_run_ending_where_the_run_ends_alone_passes():
    # The shape of a 32-run sitting's lr 8.5e-3: shared it recovered, its twin did not, and
    # alone under other seeds it ends anywhere from 0.66 to 0.75.
    shared, twin = curve(0.7, 0.798), curve(0.7, 0.745)
    control = control_with(s1=curve(0.7, 0.659), s2=curve(0.7, 0.673), s3=curve(0.7, 0.70),
                           s4=curve(0.7, 0.72))  # fmt: skip
    verdict = judge(["lr8p5e-3"], setups_with(shared, twin), control, SEEDS)["lr8p5e-3"]
    # Outcomes alone 0.7225, 0.6795, 0.6865, 0.70, 0.71: mean 0.6997, sd 0.0174;
    # t(4) = 2.776: 0.6997 +- 0.0529.
    assert verdict["alone_mean"] == pytest.approx(0.6997, abs=1e-4)
    assert verdict["interval"] == [pytest.approx(0.6468, abs=2e-4), pytest.approx(0.7526, abs=2e-4)]
    assert verdict["shared"] == pytest.approx(0.749) and verdict["within_spread"]


def test_a_split_run_ending_outside_where_the_run_ends_alone_fails():
    shared, twin = curve(0.7, 0.95), curve(0.7, 0.745)
    control = control_with(s1=curve(0.7, 0.659), s2=curve(0.7, 0.673), s3=curve(0.7, 0.70),
                           s4=curve(0.7, 0.72))  # fmt: skip
    verdict = judge(["lr8p5e-3"], setups_with(shared, twin), control, SEEDS)["lr8p5e-3"]
    assert verdict["shared"] > verdict["interval"][1] and not verdict["within_spread"]


def test_the_interval_is_never_narrower_than_the_curve_tolerance():
    # A run that ends at the same reward under every seed: only sharing could move it, and
    # it may move as far as a drift within the tolerance does.
    same = curve(0.7, 0.8)
    control = control_with(s1=same, s2=same, s3=same, s4=same)
    low, high = prediction_interval([outcome(same)] * 5)
    assert (low, high) == (
        pytest.approx(0.75 - CURVE_TOLERANCE),
        pytest.approx(0.75 + CURVE_TOLERANCE),
    )
    nearby = curve(0.7, 0.8 + 2 * CURVE_TOLERANCE * 0.9)
    far = curve(0.7, 0.8 + 2 * CURVE_TOLERANCE * 1.1)
    for shared, inside in ((nearby, True), (far, False)):
        verdict = judge(["lr8p5e-3"], setups_with(shared, same), control, SEEDS)["lr8p5e-3"]
        assert verdict["within_spread"] is inside


def test_a_control_that_did_not_finish_explains_nothing():
    shared, twin = curve(0.7, 0.8, 0.82), curve(0.7, 0.74, 0.74)
    full = curve(0.7, 0.79, 0.81)
    control = control_with(s1=full, s2=full, s3=full)  # seed 4's experiment left no steps
    verdict = judge(["lr8p5e-3"], setups_with(shared, twin), control, SEEDS)["lr8p5e-3"]
    assert not verdict["within_spread"] and verdict["other_seeds"]["4"] is None
    # Stopped after 2 of 3 steps: its last steps are not the run's outcome.
    control = control_with(s1=full, s2=full, s3=full, s4=curve(0.7, 0.8))
    verdict = judge(["lr8p5e-3"], setups_with(shared, twin), control, SEEDS)["lr8p5e-3"]
    assert not verdict["within_spread"] and verdict["other_seeds"]["4"] is None


def test_controls_are_the_split_run_alone_with_its_settings_but_the_seed(tmp_path: Path):
    (shared,) = separate.write_recipes(RECIPE, 16, tmp_path / "bench")["shared"]
    controls = write_controls(RECIPE, ["lr8p5e-3"], (1, 2), 16, tmp_path)
    assert [c.run_ids for c in controls] == [("lr8p5e-3-seed1",), ("lr8p5e-3-seed2",)]
    benchmark = load_recipe(shared.recipe)
    for control, seed in zip(controls, (1, 2), strict=True):
        alone = load_recipe(control.recipe)
        (run,) = alone.run_configs().values()
        assert run.lr == 8.5e-3 and run.seed == seed
        assert alone.trainer == benchmark.trainer and alone.inference == benchmark.inference


@pytest.mark.parametrize("ends_alone_at, passes", [(0.81, True), (0.70, False)])
def test_the_benchmark_runs_the_control_for_split_runs_and_judges_by_it(
    tmp_path, monkeypatch, ends_alone_at, passes
):
    from workbench.bench import results

    shared = curve(0.7, 0.8, 0.82)
    twin = curve(0.7, 0.7, 0.7)
    by_setup = {
        "shared": shared,
        "one_after_another": twin,
        "seed_control": curve(0.7, ends_alone_at, ends_alone_at),
    }
    ran: list[tuple[str, tuple[str, ...]]] = []

    def fake_run_setup(setup, experiments, **_):
        # Stands in for the experiments (`workbench up`), which run under `just bench`.
        ran.append((setup, tuple(r for e in experiments for r in e.run_ids)))
        return {
            "setup": setup, "wall_s": 10.0, "cpu_s": 5.0, "run_steps": 3, "problems": [],
            "run_steps_per_hour": 1.0, "peak_rss_mb": 1, "time_breakdown": {},
            "runs": {r: {"curve": by_setup[setup], "first_step_s": 1, "last_step_s": 2}
                     for e in experiments for r in e.run_ids},
        }  # fmt: skip

    monkeypatch.setattr(separate, "run_setup", fake_run_setup)
    monkeypatch.setattr(separate_setup, "run_setup", fake_run_setup)  # as seed_control calls it
    monkeypatch.setattr(results, "RESULTS_DIR", tmp_path / "results")
    report = separate.run_separate_benchmark(RECIPE, runs=1, max_steps=3, at_once=False)
    assert ran == [
        ("shared", ("lr1e-3",)),
        ("one_after_another", ("lr1e-3",)),
        ("seed_control", tuple(f"lr1e-3-seed{seed}" for seed in SEEDS)),
    ]
    assert report["curves"]["split_runs"] == ["lr1e-3"]
    assert curves_pass(report["curves"]) is passes
    assert report["exit_code"] == (0 if passes else 1)
    verdict = verdict_of(report["curves"])
    assert verdict.startswith("1 split past") if passes else verdict.startswith("DIFFERENT")
    assert "lr1e-3 ends at 0.7733 shared, alone at 0.7" in verdict
    assert ("inside" if passes else "OUTSIDE") in verdict


def test_curves_within_the_tolerance_run_no_control(tmp_path, monkeypatch):
    result = compare_curves(setups_with(curve(0.7, 0.8), curve(0.7, 0.8)), async_level=1)
    assert result["split_runs"] == [] and curves_pass(result)
