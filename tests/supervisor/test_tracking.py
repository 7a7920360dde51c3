"""Experiment tracking in the running supervisor: the real daemon, stand-in children, the
real trackio and wandb writing under temporary directories.

The test writes the runs' metrics.jsonl itself (as orchestrators and the trainer would),
while the stand-in orchestrators run until they are stopped.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers import wait_for
from tests.supervisor.conftest import StandinExperiment
from tests.tracking.records import as_trackio, expected_rows, trackio_rows, wandb_rows, write_steps
from tests.tracking.stores import trackio_runs, wandb_runs
from workbench.cli import app
from workbench.files import layout
from workbench.supervisor.launch import stop_experiment
from workbench.supervisor.process import family_members
from workbench.tracking.progress import read_progress

_projects = itertools.count()


def track_with(standin: StandinExperiment, table: dict[str, str]) -> None:
    lines = "".join(f'{key} = "{value}"\n' for key, value in table.items())
    with open(layout.recipe_path(standin.path), "a") as recipe:
        recipe.write(f"\n[tracking]\n{lines}")


def all_forwarded(standin: StandinExperiment, run_ids: list[str]) -> bool:
    for run_id in run_ids:
        progress = read_progress(standin.path, run_id)
        size = layout.metrics_path(layout.run_dir(standin.path, run_id)).stat().st_size
        if progress is None or progress.offset != size:
            return False
    return True


def run_and_stop(standin: StandinExperiment, run_ids: list[str], steps: range) -> None:
    """Start the supervisor, write `steps` for every run, wait until they were forwarded,
    stop everything; the supervisor's own session must then be empty (no wandb service)."""
    started = standin.start()
    for run_id in run_ids:
        write_steps(layout.run_dir(standin.path, run_id), steps)
    # Generous: wandb starts its service and each run, on a machine busy with other tests.
    wait_for(lambda: all_forwarded(standin, run_ids), 120.0, "every record forwarded")
    assert standin.state()["warnings"] == []
    assert stop_experiment(standin.path, timeout_s=60).graceful
    assert family_members(started.pid) == []


@pytest.mark.parametrize("backend", ["trackio", "wandb"])
def test_every_record_of_two_runs_lands_once_through_a_supervisor_restart(
    standin: StandinExperiment, trackio_dir: Path, tmp_path: Path, backend: str
):
    project = f"supervised-{next(_projects)}"
    directory = trackio_dir if backend == "trackio" else tmp_path / "wandb-dir"
    track_with(standin, {"backend": backend, "project": project, "dir": str(directory)})
    run_ids = ["run_a", "run_b"]
    standin.add_runs(*run_ids)
    run_and_stop(standin, run_ids, range(3))
    # Records written while no supervisor runs are sent by the next one; none twice.
    write_steps(layout.run_dir(standin.path, "run_a"), range(3, 4))
    run_and_stop(standin, run_ids, range(4, 6))

    steps = {"run_a": range(6), "run_b": [*range(3), *range(4, 6)]}
    expected = {
        run_id: [row for part in steps[run_id] for row in expected_rows(range(part, part + 1))]
        for run_id in run_ids
    }
    # The project is not the experiment's own: run names carry the experiment's name.
    names = {run_id: f"standins-{run_id}" for run_id in run_ids}
    if backend == "trackio":
        assert trackio_runs(project) == list(names.values())
        for run_id, name in names.items():
            assert trackio_rows(project, name) == as_trackio(expected[run_id])
    else:
        stored = wandb_runs(directory)
        assert sorted(stored) == list(names.values())
        for run_id, name in names.items():
            assert stored[name].sessions == 2 and stored[name].finished
            assert stored[name].group == "standins" and stored[name].config["max_steps"] == 30
            assert wandb_rows(stored[name].history) == expected[run_id]


def test_a_failing_tracker_is_a_warning_in_status_and_the_runs_go_on(
    standin: StandinExperiment, tmp_path: Path
):
    blocked = tmp_path / "a-file"
    blocked.write_text("where wandb's directory should be")
    track_with(standin, {"backend": "wandb", "dir": str(blocked / "wandb")})
    standin.add_runs("run_a")
    standin.start()
    standin.wait_for_process("run_a", "running")
    write_steps(layout.run_dir(standin.path, "run_a"), range(2))
    warnings = wait_for(lambda: standin.state().get("warnings"), 60.0, "a tracking warning")
    assert len(warnings) == 1 and warnings[0].startswith("tracking (wandb): run_a: ")
    assert standin.process("run_a")["state"] == "running"
    assert "tracking (wandb): run_a:" in (standin.path / "logs" / "supervisor.log").read_text()

    result = CliRunner(env={"COLUMNS": "300"}).invoke(app, ["status", str(standin.path)])
    assert result.exit_code == 0
    assert "warning: tracking (wandb): run_a:" in result.output
    result = CliRunner().invoke(app, ["status", str(standin.path), "--json"])
    assert json.loads(result.output)["warnings"] == warnings
