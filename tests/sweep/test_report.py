"""`workbench sweep report`: ranking, rungs, evictions and differences read from real files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers import make_run
from workbench.cli import app
from workbench.files import layout, run_control
from workbench.sweep.asha import RungResult
from workbench.sweep.files import AshaRecord, write_asha
from workbench.sweep.report import NO_EVAL_NOTE, build_report, write_report
from workbench.sweep.scheduler import EVICTED_BY
from workbench.sweep.spec import AshaSpec

RECIPE = """\
[experiment]
name = "exp"

[model]
base = "builtin:tiny-reverse"

[defaults]
max_steps = 20
lr = 3e-3
"""


def write_records(run: Path, records: list[dict]) -> None:
    with open(layout.metrics_path(run), "a", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps({"time": 1.0, **record}) + "\n")


def evals(*points: tuple[int, float]) -> list[dict]:
    return [{"source": "eval", "step": step, "eval_reward_mean": value} for step, value in points]


@pytest.fixture
def experiment(tmp_path: Path) -> Path:
    """Four runs: a good one, a poor one early stopping evicted, a middling one, one with
    no eval yet."""
    experiment = tmp_path / "outputs" / "exp"
    experiment.mkdir(parents=True)
    (experiment / "recipe.toml").write_text(RECIPE)
    good = make_run(experiment, "run_lr1e-2", "max_steps = 20\nlr = 1e-2\n")
    poor = make_run(experiment, "run_lr3e-4", "max_steps = 20\nlr = 3e-4\n[lora]\nrank = 4\n")
    middling = make_run(experiment, "run_lr3e-3", "max_steps = 20\nlr = 3e-3\n")
    make_run(experiment, "run_late", "max_steps = 20\nlr = 3e-2\n")
    write_records(good, evals((0, 0.3), (10, 0.6), (20, 0.8)))
    write_records(middling, evals((0, 0.3), (10, 0.5), (20, 0.6)))
    write_records(poor, [*evals((0, 0.3), (10, 0.31)), {"source": "trainer", "step": 11}])
    run_control.write_eviction(poor, "asha rung 0 (step 10)", by=EVICTED_BY)
    spec = AshaSpec(grace_steps=10, reduction_factor=2, min_runs=2)
    results = [
        RungResult("run_lr1e-2", 0, 10, 0.6, 1, 1, None, "too_few", 2.0),
        RungResult("run_lr3e-3", 0, 10, 0.5, 2, 2, 0.55, "stop", 3.0),
        RungResult("run_lr3e-4", 0, 10, 0.31, 3, 3, 0.5, "stop", 4.0),
    ]
    # run_lr3e-3 was stopped but had finished first: nothing was evicted.
    actions = {("run_lr3e-3", 0): "finished", ("run_lr3e-4", 0): "evicted"}
    write_asha(experiment, AshaRecord(spec, results, actions))
    return experiment


def test_runs_are_ranked_by_their_metric_at_the_last_eval(experiment: Path):
    report = build_report(experiment)
    assert [run.id for run in report.runs] == ["run_lr1e-2", "run_lr3e-3", "run_lr3e-4", "run_late"]
    assert [run.rank for run in report.runs] == [1, 2, 3, 4]
    assert report.runs[0].value == 0.8 and report.runs[0].eval_step == 20


def test_a_run_without_eval_records_ranks_last_and_says_so(experiment: Path):
    last = build_report(experiment).runs[-1]
    assert last.id == "run_late"
    assert last.value is None and last.note == NO_EVAL_NOTE


def test_only_a_carried_out_scheduler_stop_counts_as_evicted(experiment: Path):
    runs = {run.id: run for run in build_report(experiment).runs}
    assert runs["run_lr3e-4"].evicted_by_scheduler
    assert not runs["run_lr3e-3"].evicted_by_scheduler  # stopped after it finished
    assert not runs["run_lr1e-2"].evicted_by_scheduler


def test_a_run_restarted_after_early_stopping_is_no_longer_evicted(experiment: Path):
    run_control.clear_eviction(experiment / "run_lr3e-4")
    runs = {run.id: run for run in build_report(experiment).runs}
    assert not runs["run_lr3e-4"].evicted_by_scheduler


def test_a_run_restarted_then_evicted_by_hand_is_not_marked_as_stopped_early(experiment: Path):
    run = experiment / "run_lr3e-4"
    run_control.clear_eviction(run)
    run_control.write_eviction(run, "enough of it", by="tui")
    runs = {run.id: run for run in build_report(experiment).runs}
    assert not runs["run_lr3e-4"].evicted_by_scheduler


def test_rung_and_step_reached_come_from_the_scheduler_and_the_metrics(experiment: Path):
    runs = {run.id: run for run in build_report(experiment).runs}
    assert (runs["run_lr3e-4"].rung, runs["run_lr3e-4"].rung_step) == (0, 10)
    assert runs["run_lr3e-4"].step == 11  # a trainer record past its last eval
    assert runs["run_late"].rung is None


def test_differences_are_what_orch_toml_sets_over_the_recipe_defaults(experiment: Path):
    runs = {run.id: run for run in build_report(experiment).runs}
    assert runs["run_lr3e-4"].differences == {"lr": 3e-4, "lora.rank": 4}
    assert runs["run_lr3e-3"].differences == {}  # the defaults' own lr


def test_an_eval_redone_after_a_restart_counts_once_with_its_latest_value(tmp_path: Path):
    run = make_run(tmp_path, "run_a")
    write_records(run, evals((0, 0.2), (10, 0.4), (10, 0.45)))
    outcome = build_report(tmp_path).runs[0]
    assert outcome.evals == [(0, 0.2), (10, 0.45)]


def test_min_mode_early_stopping_ranks_the_lowest_value_first(tmp_path: Path):
    for run_id, value in (("run_a", 0.9), ("run_b", 0.1)):
        write_records(make_run(tmp_path, run_id), evals((10, value)))
    write_asha(tmp_path, AshaRecord(AshaSpec(mode="min"), [], {}))
    assert build_report(tmp_path).runs[0].id == "run_b"


def test_the_recipe_scheduler_metric_and_mode_rank_the_runs(tmp_path: Path):
    scheduler = '\n[sweep.scheduler]\nkind = "asha"\nmetric = "reward_mean"\nmode = "min"\n'
    (tmp_path / "recipe.toml").write_text(RECIPE + scheduler)
    for run_id, rewards in (("run_a", [0.2, 0.5]), ("run_b", [0.6, 0.4]), ("run_c", [])):
        records = [
            {"source": "orchestrator", "step": s, "reward_mean": r} for s, r in enumerate(rewards)
        ]
        write_records(make_run(tmp_path, run_id), [*records, *evals((1, 0.9))])
    report = build_report(tmp_path)
    assert (report.metric, report.mode) == ("reward_mean", "min")
    # Orchestrator records carry this metric: each run's last one ranks it, lowest first.
    assert [(run.id, run.value) for run in report.runs] == [
        ("run_b", 0.4),
        ("run_a", 0.5),
        ("run_c", None),
    ]
    assert report.runs[1].evals == [(0, 0.2), (1, 0.5)]


def test_without_early_stopping_the_eval_reward_ranks_highest_first(experiment: Path):
    (experiment / "sweep" / "asha.json").unlink()
    report = build_report(experiment)
    assert (report.metric, report.mode) == ("eval_reward_mean", "max")


def test_the_report_files_are_written_into_the_experiment(experiment: Path):
    pytest.importorskip("matplotlib")
    written = write_report(build_report(experiment))
    assert written == [experiment / "sweep_report.json", experiment / "sweep_report.png"]
    saved = json.loads((experiment / "sweep_report.json").read_text())
    assert saved["best"] == {
        "id": "run_lr1e-2",
        "value": 0.8,
        "differences": {"lr": 0.01},
        "lineage": ["run_lr1e-2"],
    }
    assert (experiment / "sweep_report.png").read_bytes().startswith(b"\x89PNG")


def test_the_command_prints_the_ranking_and_the_best_configuration(experiment, monkeypatch):
    monkeypatch.chdir(experiment.parent.parent)
    # A wide terminal: the table must not fold the note it is checked for.
    result = CliRunner(env={"COLUMNS": "200"}).invoke(
        app, ["sweep", "report"], catch_exceptions=False
    )
    assert result.exit_code == 0
    lines = result.output
    assert lines.index("run_lr1e-2") < lines.index("run_lr3e-3") < lines.index("run_late")
    assert NO_EVAL_NOTE in lines
    assert "best: run_lr1e-2" in lines and "lr=0.01" in lines


def test_the_command_prints_json_for_scripts(experiment: Path):
    result = CliRunner().invoke(app, ["sweep", "report", str(experiment), "--json"])
    assert result.exit_code == 0
    payload = json.loads(result.output)
    assert payload["runs"][0]["id"] == "run_lr1e-2"
    assert payload["runs"][2]["evicted_by_scheduler"] is True
    assert payload["best"]["id"] == "run_lr1e-2"


DIVERGED_WHY = "diverged: gradient norm nan at updates 3-5; try a lower lr in a new run"


def test_a_run_that_diverged_ranks_last_whatever_it_recorded_and_is_never_the_best(
    experiment: Path, monkeypatch
):
    # run_lr1e-2 led at 0.8; then the trainer found its training diverged.
    run_control.write_eviction(experiment / "run_lr1e-2", DIVERGED_WHY, by="trainer")
    report = build_report(experiment)
    assert [run.id for run in report.runs] == ["run_lr3e-3", "run_lr3e-4", "run_late", "run_lr1e-2"]
    assert report.runs[-1].diverged and report.runs[-1].rank == 4
    assert not any(run.diverged for run in report.runs[:-1])
    assert report.best is not None and report.best.id == "run_lr3e-3"
    assert report.to_json()["runs"][-1]["diverged"] is True
    assert [run.id for run in build_report(experiment, by="asymptote").runs][-1] == "run_lr1e-2"

    monkeypatch.chdir(experiment.parent.parent)
    result = CliRunner(env={"COLUMNS": "200"}).invoke(
        app, ["sweep", "report"], catch_exceptions=False
    )
    row = next(line for line in result.output.splitlines() if "run_lr1e-2" in line)
    assert "diverged" in row
    assert "best: run_lr3e-3" in result.output


def test_with_every_run_that_has_evals_diverged_there_is_no_best(tmp_path: Path):
    (tmp_path / "recipe.toml").write_text(RECIPE)
    write_records(make_run(tmp_path, "run_a"), evals((0, 0.3), (10, 0.1)))
    run_control.write_eviction(tmp_path / "run_a", DIVERGED_WHY, by="trainer")
    make_run(tmp_path, "run_b")
    report = build_report(tmp_path)
    assert [run.id for run in report.runs] == ["run_b", "run_a"]
    assert report.best is None
    result = CliRunner().invoke(app, ["sweep", "report", str(tmp_path)])
    assert "best: none (no run that did not diverge has eval records yet)" in result.output
