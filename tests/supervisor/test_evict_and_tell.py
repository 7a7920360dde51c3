"""Evicting from outside the supervisor (the CLI, the TUI): the file, then the supervisor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers import make_run
from workbench.files import layout, run_control
from workbench.supervisor.client import SupervisorError, evict_and_tell


class Listener:
    """A supervisor of `experiment` that records what it is told; `refuse` makes it not
    take it."""

    def __init__(self, experiment: Path, running: bool = True, refuse: str | None = None):
        self.experiment = experiment
        self.running = running
        self.refuse = refuse
        self.told: list[tuple[str, str, str]] = []

    def is_running(self) -> bool:
        return self.running

    def evict(self, run_id: str, reason: str, by: str) -> dict[str, Any]:
        assert layout.evicted_path(layout.run_dir(self.experiment, run_id)).exists(), (
            "the file is written before the supervisor is told"
        )
        self.told.append((run_id, reason, by))
        if self.refuse is not None:
            raise SupervisorError(self.refuse)
        return {"ok": True, "stopped": True}


def test_the_file_is_written_then_a_running_supervisor_is_told(experiment: Path):
    make_run(experiment, "run_a")
    listener = Listener(experiment)
    evicted = evict_and_tell(experiment, "run_a", "diverged", by="tui", supervisor=listener)
    assert not evicted.already and evicted.stopping and evicted.not_taken is None
    assert run_control.read_eviction(experiment / "run_a") == evicted.eviction
    assert evicted.eviction.evicted_by == "tui"
    assert listener.told == [("run_a", "diverged", "tui")]


def test_without_a_supervisor_the_file_is_the_eviction(experiment: Path):
    make_run(experiment, "run_a")
    listener = Listener(experiment, running=False)
    evicted = evict_and_tell(experiment, "run_a", "diverged", by="user", supervisor=listener)
    assert evicted.eviction.reason == "diverged" and not evicted.stopping
    assert listener.told == []


def test_a_supervisor_that_does_not_take_it_leaves_the_eviction_in_force(experiment: Path):
    make_run(experiment, "run_a")
    listener = Listener(experiment, refuse="cannot talk to the supervisor")
    evicted = evict_and_tell(experiment, "run_a", "diverged", by="user", supervisor=listener)
    assert evicted.not_taken == "cannot talk to the supervisor"
    assert run_control.read_eviction(experiment / "run_a") is not None


def test_an_evicted_run_keeps_its_first_eviction_and_the_supervisor_is_told_again(
    experiment: Path,
):
    make_run(experiment, "run_a")
    run_control.write_eviction(experiment / "run_a", "reward collapsed", by="trainer")
    listener = Listener(experiment)
    evicted = evict_and_tell(experiment, "run_a", "again", by="user", supervisor=listener)
    assert evicted.already and evicted.eviction.reason == "reward collapsed"
    assert listener.told == [("run_a", "again", "user")]


def test_a_deleted_run_is_not_brought_back_and_nobody_is_told(experiment: Path):
    listener = Listener(experiment)
    with pytest.raises(FileNotFoundError):
        evict_and_tell(experiment, "run_gone", "late", by="tui", supervisor=listener)
    assert not (experiment / "run_gone").exists() and listener.told == []
