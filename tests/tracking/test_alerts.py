"""Alerts (`workbench.alerts`) sent by the tracking forwarder as the tracker's own alerts, with
the real trackio and wandb writing locally."""

from __future__ import annotations

import itertools
from pathlib import Path

from tests.helpers import wait_for
from tests.tracking.stores import wandb_records
from workbench.config import OrchestratorConfig
from workbench.experiment import write_run
from workbench.files.alerts import Alert
from workbench.files.metrics import append_metrics
from workbench.tracking import MetricsForwarder, TrackingTarget

_projects = itertools.count()


def nan_alert(run: str | None = "run_a", process: str | None = None) -> Alert:
    return Alert(
        time=1.0,
        run=run,
        rule="non_finite" if run else "restarts",
        message="non-finite loss nan at update 2" if run else "trainer failed 3 times",
        key="step 2",
        step=2 if run else None,
        process=process,
    )


def experiment_with_two_runs(experiment: Path) -> None:
    for run_id in ("run_a", "run_b"):
        run = write_run(experiment, run_id, OrchestratorConfig())
        append_metrics(run, "trainer", 1, loss=0.1)


def send(experiment: Path, target: TrackingTarget, *alerts: Alert) -> None:
    forwarder = MetricsForwarder(experiment, target)
    forwarder.poll()  # the runs' tracker runs opened
    for alert in alerts:
        forwarder.alert(alert)
    forwarder.poll()
    forwarder.close()
    assert forwarder.warnings() == []


def test_trackio_stores_a_runs_alert_on_its_run_and_a_trainers_on_every_run(
    trackio_dir: Path, experiment: Path
):
    from trackio.sqlite_storage import SQLiteStorage

    project = f"alerts-{next(_projects)}"
    experiment_with_two_runs(experiment)
    target = TrackingTarget(backend="trackio", project=project, experiment=project, dir=trackio_dir)
    send(experiment, target, nan_alert(), nan_alert(run=None, process="trainer"))

    def alerts(run: str) -> list[tuple[str, str, str, int | None]]:
        rows = SQLiteStorage.get_alerts(project, run_name=run)
        return sorted((r["title"], r["text"], r["level"], r["step"]) for r in rows)

    assert alerts("run_a") == [
        ("run_a: non_finite", "non-finite loss nan at update 2", "error", 2),
        # Without a step of its own, trackio files it at the run's last step (1).
        ("trainer: restarts", "trainer failed 3 times", "error", 1),
    ]
    assert alerts("run_b") == [("trainer: restarts", "trainer failed 3 times", "error", 1)]


def test_wandb_offline_records_the_alert_in_the_runs_log(tmp_path: Path, experiment: Path):
    experiment_with_two_runs(experiment)
    target = TrackingTarget(backend="wandb", project="exp", experiment="exp", dir=tmp_path)
    send(experiment, target, nan_alert())

    def alerts() -> list[tuple[str, str, str]] | None:
        found = [
            (record.alert.title, record.alert.text, record.alert.level)
            for log in (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
            for record in wandb_records(log)
            if record.WhichOneof("record_type") == "alert"
        ]
        return found or None

    got = wait_for(alerts, 60, "wandb's log to hold the alert", every_s=0.2)
    assert got == [("run_a: non_finite", "non-finite loss nan at update 2 (step 2)", "ERROR")]
