"""`workbench bench sweep`: its recipes, its CPU accounting, its comparison and plot, on
real files and processes (the experiments themselves run in tests/e2e and the benchmark)."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import make_run
from workbench.bench.headless import HeadlessRun, run_accounted
from workbench.bench.sweep import (
    ModeOutcome,
    SweepBenchError,
    anytime_best,
    compare,
    exhaustive_recipe,
    pbt_interval,
    pbt_recipe,
    render_comparison,
    trained_steps,
)
from workbench.files import layout, run_control
from workbench.recipe import load_recipe
from workbench.status import run_statuses
from workbench.sweep.report import build_report

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "recipes" / "reverse_text_sweep.toml"


def test_the_exhaustive_recipe_is_the_same_sweep_without_early_stopping(tmp_path: Path):
    path = exhaustive_recipe(SHIPPED, tmp_path)

    original, exhaustive = load_recipe(SHIPPED), load_recipe(path)
    assert original.sweep is not None and original.sweep.scheduler is not None
    assert exhaustive.sweep is not None and exhaustive.sweep.scheduler is None
    assert exhaustive.run_configs() == original.run_configs()
    assert exhaustive.trainer == original.trainer
    assert exhaustive.experiment.name == "reverse_text_sweep_exhaustive"
    assert "# A learning-rate x LoRA-rank sweep" in path.read_text(), "comments are kept"


def test_the_pbt_recipe_is_the_same_sweep_with_pbt_and_a_checkpoint_at_each_judged_step(
    tmp_path: Path,
):
    path = pbt_recipe(SHIPPED, tmp_path)

    original, pbt = load_recipe(SHIPPED), load_recipe(path)
    assert pbt.sweep is not None and pbt.sweep.scheduler is not None
    spec = pbt.sweep.scheduler
    assert (spec.kind, spec.metric, spec.interval, spec.quantile) == (
        "pbt", "eval_reward_mean", 10, 0.25,
    )  # fmt: skip
    assert spec.judged_steps(40) == [10, 20, 30]
    assert [run.run_id for run in pbt.planned_runs] == [r.run_id for r in original.planned_runs]
    assert {config.checkpoint_interval for config in pbt.run_configs().values()} == {10}
    assert pbt.experiment.name == "reverse_text_sweep_pbt"
    # Capped at 10 steps (`--quick`), it is judged at step 5.
    (tmp_path / "quick").mkdir()
    quick = load_recipe(pbt_recipe(SHIPPED, tmp_path / "quick", max_steps=10))
    assert quick.sweep is not None and quick.sweep.scheduler is not None
    assert quick.sweep.scheduler.interval == 5
    assert (pbt_interval(40, 5), pbt_interval(20, 5), pbt_interval(10, 5)) == (10, 5, 5)


def test_a_recipe_without_early_stopping_has_nothing_to_compare(tmp_path: Path):
    recipe = tmp_path / "plain.toml"
    recipe.write_text((REPO / "recipes" / "reverse_text.toml").read_text())
    with pytest.raises(SweepBenchError, match=r"plain\.toml: no \[sweep\.scheduler\]"):
        exhaustive_recipe(recipe, tmp_path)


def test_cpu_time_of_an_orphaned_grandchild_is_counted(tmp_path: Path):
    # The child starts a grandchild that burns 0.5 s of CPU, and exits at once: the
    # grandchild is orphaned and would leave the parent -> child accounting chain.
    burn = "import time\nwhile time.process_time() < 0.5: pass\n"
    child = textwrap.dedent(f"""
        import subprocess, sys
        subprocess.Popen([sys.executable, "-c", {burn!r}])
    """)
    run = run_accounted([sys.executable, "-c", child], tmp_path, timeout_s=60)
    assert run.exit_code == 0 and not run.timed_out
    assert run.unreaped == 0
    assert run.cpu_s is not None and run.cpu_s >= 0.5, run
    # The machine was busy at least as long (clock ticks of 10 ms: a tick of slack).
    assert run.machine_busy_s is not None and run.machine_busy_s >= run.cpu_s - 0.02, run
    assert run.foreign_cpu_s is not None and run.foreign_cpu_s >= 0


def synthetic_sweep(root: Path, runs: dict[str, list[tuple[int, float, float]]]) -> Path:
    """An experiment whose runs have (step, eval reward, unix time) records and one trainer
    record per step up to their last eval."""
    experiment = root / "outputs" / "exp"
    experiment.mkdir(parents=True)
    for run_id, evals in runs.items():
        run = make_run(experiment, run_id, "max_steps = 20\n")
        lines = [
            {"source": "eval", "step": s, "eval_reward_mean": v, "time": t} for s, v, t in evals
        ]
        lines += [{"source": "trainer", "step": s, "time": 0.0} for s in range(1, evals[-1][0] + 1)]
        layout.metrics_path(run).write_text("".join(json.dumps(line) + "\n" for line in lines))
        run_control.mark_finished(run, evals[-1][0])
    return experiment


def outcome(
    mode: str, experiment: Path, wall_s: float, cpu_s: float, timed_out: bool = False
) -> ModeOutcome:
    run = HeadlessRun(["workbench", "up"], 100.0, 0, timed_out, wall_s, cpu_s, 0)
    return ModeOutcome(
        mode,
        run,
        build_report(experiment),
        trained_steps(experiment),
        anytime_best(experiment, 100.0, "eval_reward_mean"),
        {s.id: (s.status, s.evicted_by, s.reason) for s in run_statuses(experiment)},
    )


@pytest.fixture
def outcomes(tmp_path: Path) -> dict[str, ModeOutcome]:
    asha = synthetic_sweep(
        tmp_path / "asha",
        {
            "run_a": [(0, 0.6, 110.0), (5, 0.7, 120.0), (20, 0.86, 150.0)],
            "run_b": [(0, 0.6, 111.0), (5, 0.62, 125.0)],  # stopped at the rung
        },
    )
    exhaustive = synthetic_sweep(
        tmp_path / "exhaustive",
        {
            "run_a": [(0, 0.6, 110.0), (5, 0.7, 120.0), (20, 0.85, 170.0)],
            "run_b": [(0, 0.6, 111.0), (5, 0.62, 125.0), (20, 0.87, 180.0)],
        },
    )
    return {
        "asha": outcome("asha", asha, wall_s=60.0, cpu_s=100.0),
        "exhaustive": outcome("exhaustive", exhaustive, wall_s=150.0, cpu_s=280.0),
    }


def test_comparison_gives_the_winners_gap_the_regret_of_the_pick_and_the_target(outcomes):
    asha, exhaustive = outcomes["asha"].to_json(), outcomes["exhaustive"].to_json()
    assert asha["winner"]["id"] == "run_a" and exhaustive["winner"]["id"] == "run_b"
    assert (asha["run_steps"], exhaustive["run_steps"]) == (25, 40)

    comparison = compare(asha, exhaustive)

    assert comparison["same_configuration"] is False
    assert comparison["exhaustive_tied_winners"] == ["run_b"]
    assert comparison["winner_gap"] == pytest.approx(0.01)
    assert comparison["regret_of_pick"] == pytest.approx(0.02)
    assert (comparison["wall_ratio"], comparison["cpu_ratio"]) == (0.4, 0.357)
    assert comparison["target"]["met"] is True


def test_the_target_is_missed_when_asha_is_too_slow_or_its_winner_too_far_behind(outcomes):
    asha, exhaustive = outcomes["asha"].to_json(), outcomes["exhaustive"].to_json()
    slow = compare({**asha, "wall_s": 80.0}, exhaustive)
    assert slow["wall_ratio"] == 0.533
    assert (slow["target"]["met"], slow["target"]["wall_within"]) == (False, False)
    behind = {**asha, "winner": {**asha["winner"], "eval_reward": 0.84}}
    assert compare(behind, exhaustive)["target"]["reward_within"] is False


def test_the_anytime_curve_is_the_best_latest_eval_at_each_moment(outcomes):
    assert outcomes["exhaustive"].anytime == [
        (10.0, 0.6),
        (11.0, 0.6),
        (20.0, 0.7),
        (25.0, 0.7),
        (70.0, 0.85),
        (80.0, 0.87),
    ]


def test_the_plot_is_a_png_of_both_modes(outcomes):
    png = render_comparison(outcomes, title="test")
    assert png.startswith(b"\x89PNG") and len(png) > 10_000


def test_runs_stopped_by_the_systems_own_rules_are_outcomes_and_anything_else_a_problem(
    outcomes,
):
    asha = outcomes["asha"].report.experiment
    assert outcomes["asha"].problems == []
    run_control.write_eviction(asha / "run_b", "asha rung 0 (step 5): ...", by="asha")
    run_control.write_eviction(asha / "run_a", "no learning signal: ...", by="orchestrator")
    assert outcome("asha", asha, 60.0, 100.0).problems == []
    run_control.clear_eviction(asha / "run_a")
    run_control.write_eviction(asha / "run_a", "diverged: gradient norm nan ...", by="trainer")
    assert outcome("asha", asha, 60.0, 100.0).problems == []
    run_control.clear_eviction(asha / "run_a")

    run_control.write_eviction(asha / "run_a", "by hand", by="user")
    layout.finished_path(asha / "run_b").unlink()
    run_control.clear_eviction(asha / "run_b")
    late = make_run(asha, "run_c", "max_steps = 20\n")
    layout.metrics_path(late).write_text("")
    assert outcome("asha", asha, 60.0, 100.0, timed_out=True).problems == [
        "timed out after 60 s",
        "run_a evicted: by hand",
        "run_b waiting",
        "run_c waiting",
    ]
