"""Fixtures for supervisor tests: an experiment whose processes are stand-ins.

`standin` gives a `StandinExperiment`: a real experiment directory (recipe.toml, run
directories) whose plan (`workbench/testing/standins.py`) runs `standin_child.py` instead
of vLLM, torchrun and orchestrators. The supervisor itself is the real daemon. Teardown always stops it and
kills anything a stand-in left, then fails the test if a graceful stop had left anything
running: tests must not leave orphans, and the supervisor must not either.
"""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import wait_for
from workbench.config import OrchestratorConfig
from workbench.experiment import write_run
from workbench.supervisor.client import SupervisorClient, read_state
from workbench.supervisor.launch import StartedSupervisor, start_daemon, stop_experiment
from workbench.supervisor.process import family_members, signal_family
from workbench.system.procfs import process_cmdline, process_is_alive
from workbench.testing import standins

RECIPE = """\
[experiment]
name = "standins"
output_dir = "{output_dir}"

[model]
base = "builtin:tiny-reverse"

[defaults]
max_steps = 7
lr = 0.0003
"""

# inference is ready 0.3 s after it starts; the trainer has no readiness check.
DEFAULT_PROCESSES = standins.DEFAULT_PROCESSES
FAST_RESTART = {"backoff_initial_s": 0.2, "backoff_factor": 2.0, "max_restarts": 3}


@dataclass(frozen=True)
class Event:
    time: float
    name: str
    what: str
    detail: str


@dataclass
class StandinExperiment:
    path: Path
    started: list[StartedSupervisor] = field(default_factory=list)

    def configure(
        self,
        processes: list[dict[str, Any]] | None = None,
        orchestrator: dict[str, Any] | None = None,
    ) -> None:
        config = {
            "processes": DEFAULT_PROCESSES if processes is None else processes,
            "orchestrator": orchestrator or {},
        }
        (self.path / "standins.json").write_text(json.dumps(config))

    def add_runs(self, *run_ids: str) -> list[Path]:
        return [write_run(self.path, run_id, OrchestratorConfig()) for run_id in run_ids]

    def start(self, *, exit_when_done: bool = False) -> StartedSupervisor:
        if not (self.path / "standins.json").exists():
            self.configure()
        started = start_daemon(
            self.path, exit_when_done=exit_when_done, plan=standins.PLAN_REFERENCE
        )
        self.started.append(started)
        return started

    @property
    def client(self) -> SupervisorClient:
        return SupervisorClient(self.path)

    def state(self) -> dict[str, Any]:
        return read_state(self.path) or {}

    def process(self, name: str) -> dict[str, Any]:
        return self.state().get("processes", {}).get(name) or {}

    def wait_for_process(self, name: str, *states: str, timeout_s: float = 10.0) -> dict:
        return wait_for(
            lambda: (record := self.process(name)).get("state") in states and record,
            timeout_s,
            f"{name} to be {' or '.join(states)} (now: {self.process(name).get('state')})",
        )

    def events(self) -> list[Event]:
        path = standins.events_path(self.path)
        if not path.exists():
            return []
        events = []
        for line in path.read_text().splitlines():
            stamp, name, what, *rest = line.split()
            events.append(Event(float(stamp), name, what, " ".join(rest)))
        return events

    def wait_for_event(self, name: str, what: str, timeout_s: float = 10.0) -> Event:
        return wait_for(
            lambda: next((e for e in self.events() if e.name == name and e.what == what), None),
            timeout_s,
            f"'{name} {what}'",
        )

    def first(self, name: str, what: str) -> Event:
        matches = [e for e in self.events() if e.name == name and e.what == what]
        assert matches, f"no '{name} {what}' event in {self.events()}"
        return matches[0]

    def standin_pids(self) -> list[int]:
        return [int(e.detail) for e in self.events() if e.what == "start"]


def _is_standin(pid: int) -> bool:
    return any(
        "standin_child.py" in part or "time.sleep(600)" in part for part in process_cmdline(pid)
    )


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[StandinExperiment]:
    path = tmp_path / "exp"
    path.mkdir()
    (path / "recipe.toml").write_text(RECIPE.format(output_dir=path))
    experiment = StandinExperiment(path)
    yield experiment
    # Stop whatever a test left running, the graceful way first.
    with contextlib.suppress(Exception):
        stop_experiment(path, timeout_s=20)
    for started in experiment.started:
        with contextlib.suppress(Exception):
            started.process.kill()
            started.process.wait(timeout=5)
    survivors = [
        pid
        for leader in experiment.standin_pids()
        for pid in family_members(leader)
        if process_is_alive(pid) and _is_standin(pid)
    ]
    for leader in experiment.standin_pids():
        if family_members(leader):
            signal_family(leader, signal.SIGKILL)
    assert not survivors, f"stand-ins still running after `down`: {survivors}"
