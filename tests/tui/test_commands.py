"""The TUI's commands reach a real supervisor (on stand-in children) and report its answers."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from workbench.config import OrchestratorConfig
from workbench.experiment import write_run
from workbench.supervisor import launch
from workbench.testing import standins
from workbench.tui.commands import NOT_RUNNING, SupervisorCommands
from workbench.tui.data import ExperimentReader

RECIPE = """\
[experiment]
name = "commands"
output_dir = "{output_dir}"

[model]
base = "builtin:tiny-reverse"
"""


def _state(experiment: Path) -> dict:
    try:
        return json.loads((experiment / "supervisor" / "state.json").read_text())
    except (OSError, ValueError):
        return {}


def _wait(condition: Callable[[], object], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def supervised(tmp_path: Path) -> Iterator[Path]:
    experiment = tmp_path / "exp"
    experiment.mkdir()
    (experiment / "recipe.toml").write_text(RECIPE.format(output_dir=experiment))
    (experiment / "standins.json").write_text(
        json.dumps(
            {
                "processes": [
                    {"name": "inference", "kind": "inference", "ready": True},
                    {"name": "trainer", "kind": "trainer"},
                ],
                "orchestrator": {},
            }
        )
    )
    write_run(experiment, "run_a", OrchestratorConfig())
    launch.start_daemon(experiment, plan=standins.PLAN_REFERENCE)
    try:
        yield experiment
    finally:
        launch.stop_experiment(experiment, timeout_s=30)


def test_commands_are_answered_by_a_running_supervisor(supervised):
    commands = SupervisorCommands(supervised)
    assert commands.is_running()
    assert commands.send("ping").ok

    refused = commands.send("restart_run", run_id="run_nope")
    assert not refused.ok
    assert "run_nope" in refused.message

    added = commands.send("add_run", run_id="run_b", overrides={"lr": 1e-3})
    assert added.ok, added.message
    _wait(lambda: (supervised / "run_b" / "control" / "orch.toml").is_file(), "run_b's config")
    _wait(
        lambda: _state(supervised).get("processes", {}).get("run_b", {}).get("state") == "running",
        "run_b's orchestrator",
    )

    # The TUI's reader agrees with the supervisor about who runs.
    snapshot = ExperimentReader(supervised).poll()
    assert snapshot.supervisor.running
    assert {"trainer", "run_a", "run_b"} <= {p.name for p in snapshot.processes}

    assert commands.send("stop_all").ok
    _wait(lambda: not commands.is_running(), "the supervisor to stop")
    assert commands.send("ping").message == NOT_RUNNING
    assert not ExperimentReader(supervised).poll().supervisor.running
