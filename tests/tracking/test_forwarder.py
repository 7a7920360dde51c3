"""The metrics forwarder with the real trackio and wandb, writing under temporary directories.

Each test writes runs' metrics.jsonl as the trainer and orchestrators do, lets the
forwarder pass over them (`poll`, on the test's thread), and reads back what the library
stored (`tests.tracking.stores`). "A restart" is a second forwarder over the same
experiment, as a restarted supervisor builds one.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tests.tracking.records import (
    as_trackio,
    expected_rows,
    trackio_rows,
    wandb_rows,
    write_steps,
)
from tests.tracking.stores import (
    trackio_config,
    trackio_runs,
    wait_for_finished_wandb_run,
    wandb_runs,
)
from workbench.config import OrchestratorConfig
from workbench.experiment import write_run
from workbench.files import layout, run_control
from workbench.files.metrics import append_metrics
from workbench.tracking import MetricsForwarder, TrackingTarget
from workbench.tracking.forwarder import tracked_values
from workbench.tracking.progress import read_progress

_projects = itertools.count()


def unique_project() -> str:
    # trackio's directory is shared by the session (see tests/conftest.py): one project each.
    return f"forwarder-{next(_projects)}"


def two_runs(experiment: Path) -> dict[str, Path]:
    return {
        run_id: write_run(experiment, run_id, OrchestratorConfig(lr=lr))
        for run_id, lr in (("run_a", 1e-3), ("run_b", 3e-4))
    }


def forward(experiment: Path, target: TrackingTarget) -> MetricsForwarder:
    """One pass of a forwarder over `experiment`, then everything finished, as at a stop."""
    forwarder = MetricsForwarder(experiment, target)
    forwarder.poll()
    forwarder.close()
    assert forwarder.warnings() == []
    return forwarder


def forward_across_a_restart(experiment: Path, target: TrackingTarget) -> dict[str, Path]:
    """Two runs: steps 0-2 forwarded, then 3-5 by a second forwarder (a restart)."""
    runs = two_runs(experiment)
    for steps in (range(3), range(3, 6)):
        for run in runs.values():
            write_steps(run, steps)
        forward(experiment, target)
    return runs


def trackio_target(trackio_dir: Path, project: str) -> TrackingTarget:
    return TrackingTarget(backend="trackio", project=project, experiment=project, dir=trackio_dir)


# ---------------------------------------------------------------- records


def test_a_record_becomes_its_numbers_under_its_source_at_its_step():
    record = {"source": "orchestrator", "step": 4, "time": 1.5, "reward_mean": 0.25}
    record |= {"written": False, "adapter": "run_a@step4", "policy_version": 3}
    assert tracked_values(record) == (
        "orchestrator",
        4,
        {
            "orchestrator/reward_mean": 0.25,
            "orchestrator/written": 0.0,
            "orchestrator/policy_version": 3.0,
        },
    )


@pytest.mark.parametrize(
    "record",
    [
        {"step": 1, "loss": 1.0},  # no source
        {"source": "trainer", "step": "1", "loss": 1.0},  # not an integer step
        {"source": "trainer", "step": True, "loss": 1.0},
        {"source": "eval", "step": 1, "time": 2.0, "adapter": "x"},  # no number
    ],
)
def test_a_record_without_source_integer_step_or_number_is_not_sent(record):
    assert tracked_values(record) is None


# ---------------------------------------------------------------- trackio


def test_trackio_gets_every_record_of_two_runs_at_its_step_with_the_run_config(
    trackio_dir: Path, experiment: Path
):
    project = unique_project()
    runs = two_runs(experiment)
    for run in runs.values():
        write_steps(run, range(5))
    forward(experiment, trackio_target(trackio_dir, project))
    assert trackio_runs(project) == ["run_a", "run_b"]
    for run_id in runs:
        assert trackio_rows(project, run_id) == as_trackio(expected_rows(range(5)))
    config = trackio_config(project, "run_a")
    assert config["lr"] == 1e-3 and config["sampling.temperature"] == 1.0
    assert config["_Group"] == project  # grouped by experiment
    assert trackio_config(project, "run_b")["lr"] == 3e-4


def test_a_restarted_forwarder_resumes_each_trackio_run_and_sends_nothing_twice(
    trackio_dir: Path, experiment: Path
):
    project = unique_project()
    target = trackio_target(trackio_dir, project)
    runs = forward_across_a_restart(experiment, target)
    forward(experiment, target)  # and another restart, with nothing new
    assert trackio_runs(project) == ["run_a", "run_b"]  # resumed, not opened again
    for run_id, run in runs.items():
        assert trackio_rows(project, run_id) == as_trackio(expected_rows(range(6)))
        progress = read_progress(experiment, run_id)
        assert progress is not None
        assert progress.offset == layout.metrics_path(run).stat().st_size
        assert progress.records == len(expected_rows(range(6)))


def test_a_half_written_line_is_sent_once_it_is_complete(trackio_dir: Path, experiment: Path):
    project = unique_project()
    run = write_run(experiment, "run_a", OrchestratorConfig())
    append_metrics(run, "trainer", 0, loss=2.0)
    with open(layout.metrics_path(run), "ab") as handle:
        handle.write(b'{"source":"trainer","step":1,')
    forwarder = MetricsForwarder(experiment, trackio_target(trackio_dir, project))
    forwarder.poll()
    with open(layout.metrics_path(run), "ab") as handle:
        handle.write(b'"loss":1.5}\n')
    forwarder.poll()
    forwarder.close()
    assert trackio_rows(project, "run_a") == [
        (0, {"trainer/loss": 2.0}),
        (1, {"trainer/loss": 1.5}),
    ]


def test_a_shared_project_names_each_run_after_its_experiment_too(
    trackio_dir: Path, tmp_path: Path
):
    project = unique_project()
    for name in ("first", "second"):
        experiment = tmp_path / name
        write_steps(write_run(experiment, "run_a", OrchestratorConfig()), range(2))
        target = TrackingTarget(
            backend="trackio", project=project, experiment=name, dir=trackio_dir
        )
        forward(experiment, target)
    assert trackio_runs(project) == ["first-run_a", "second-run_a"]
    assert trackio_config(project, "second-run_a")["_Group"] == "second"


# ---------------------------------------------------------------- wandb


def wandb_target(directory: Path, project: str = "exp") -> TrackingTarget:
    return TrackingTarget(backend="wandb", project=project, experiment="exp", dir=directory)


def test_wandb_gets_every_record_of_two_runs_offline_with_its_step_and_config(
    tmp_path: Path, experiment: Path
):
    runs = two_runs(experiment)
    for run in runs.values():
        write_steps(run, range(5))
    forward(experiment, wandb_target(tmp_path / "wandb-dir"))
    stored = wandb_runs(tmp_path / "wandb-dir")
    assert sorted(stored) == ["run_a", "run_b"]
    for run_id in runs:
        assert wandb_rows(stored[run_id].history) == expected_rows(range(5))
        assert stored[run_id].group == "exp" and stored[run_id].project == "exp"
        assert stored[run_id].finished
    assert stored["run_a"].config["lr"] == 1e-3 and stored["run_b"].config["lr"] == 3e-4


def test_a_restarted_forwarder_continues_the_same_wandb_run_without_repeats(
    tmp_path: Path, experiment: Path
):
    runs = forward_across_a_restart(experiment, wandb_target(tmp_path / "wandb-dir"))
    stored = wandb_runs(tmp_path / "wandb-dir")
    for run_id in runs:
        assert stored[run_id].sessions == 2  # one wandb run, continued
        assert stored[run_id].id == read_progress(experiment, run_id).tracker_id
        assert wandb_rows(stored[run_id].history) == expected_rows(range(6))


def test_a_finished_run_gets_its_wandb_run_finished_and_a_late_record_reopens_it(
    tmp_path: Path, experiment: Path
):
    directory = tmp_path / "wandb-dir"
    runs = two_runs(experiment)
    for run in runs.values():
        write_steps(run, range(2))
    forwarder = MetricsForwarder(experiment, wandb_target(directory))
    forwarder.poll()
    run_control.mark_finished(runs["run_a"], step=2)
    forwarder.poll()  # nothing new for run_a, which is over: its wandb run is finished
    wandb_id = read_progress(experiment, "run_a").tracker_id
    wait_for_finished_wandb_run(directory, wandb_id, "run_a")

    write_steps(runs["run_a"], range(2, 3))  # the trainer's last line, after the finish
    forwarder.poll()
    forwarder.close()
    run_a = wandb_runs(directory)["run_a"]
    assert run_a.sessions == 2
    assert wandb_rows(run_a.history) == expected_rows(range(3))


# ---------------------------------------------------------------- failures


def test_a_tracker_that_fails_is_a_warning_and_is_retried_until_it_works(
    tmp_path: Path, experiment: Path
):
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("a file where wandb's directory should be")
    runs = two_runs(experiment)
    for run in runs.values():
        write_steps(run, range(2))
    forwarder = MetricsForwarder(experiment, wandb_target(blocked / "wandb"), retry_s=30.0)
    forwarder.poll(now=100.0)
    problems = forwarder.warnings()
    assert len(problems) == 2 and all("tracking (wandb): run_" in p for p in problems)
    assert all("trying again in 30s" in p for p in problems)

    blocked.unlink()
    forwarder.poll(now=110.0)  # before the retry: nothing tried
    assert len(forwarder.warnings()) == 2
    forwarder.poll(now=131.0)
    forwarder.close()
    assert forwarder.warnings() == []
    stored = wandb_runs(blocked / "wandb")
    assert wandb_rows(stored["run_a"].history) == expected_rows(range(2))


def test_trackio_failing_to_write_is_a_warning_not_an_error(trackio_dir: Path, experiment: Path):
    project = unique_project()
    # trackio reports a failed write only as a Python warning from its sender thread.
    (trackio_dir / f"{project}.db").mkdir()
    write_steps(write_run(experiment, "run_a", OrchestratorConfig()), range(2))
    forwarder = MetricsForwarder(experiment, trackio_target(trackio_dir, project))
    forwarder.poll()
    forwarder.close()
    problems = forwarder.warnings()
    assert problems and all(p.startswith("tracking (trackio): ") for p in problems)
