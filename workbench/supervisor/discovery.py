"""Which runs should have an orchestrator: scanning run directories, deciding, watching.

Three layers, so the decisions are tested without processes:

- `scan_runs(experiment)`: what each `run_*` directory says about its orchestrator
  (`RunScan`): runnable, finished, or held back with a reason. Evicted, rejected and
  finished are the run's condition (`run_control.run_condition`, which the trainer and
  `workbench status` read too); an open run is held back while its `control/orch.toml` is
  invalid or missing.
- `reconcile(scans, orchestrators)`: the actions (start, stop) that bring the running
  orchestrators in line with the directories. A run that is deleted, evicted or rejected
  has its orchestrator stopped; once the condition clears (the directory comes back, the
  eviction is lifted) it is started again and resumes from its checkpoint.
- `RunDirectoryWatcher`: a watchdog observer that calls back when anything that matters
  changes, so a new run gets its orchestrator within a second. It watches only the
  experiment directory, each run directory and each run's `control/`, never recursively:
  logs and rollouts change all the time and are none of discovery's business.
  The supervisor also rescans every few seconds as a safety net against missed events.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.api import ObservedWatch

from workbench import layout, run_control
from workbench.config import ConfigError, load_orchestrator_config
from workbench.run_control import Condition
from workbench.supervisor.lifecycle import TERMINAL_STATES, ProcessState

log = logging.getLogger(__name__)

CONTROL_FILES = frozenset(
    path.name
    for path in (
        layout.orch_config_path(Path("run")),
        layout.evicted_path(Path("run")),
        layout.validation_error_path(Path("run")),
        layout.finished_path(Path("run")),
    )
)
RUN_DELETED = "run directory deleted"


# ---------------------------------------------------------------- what a run directory says


@dataclass(frozen=True)
class RunScan:
    """What one run directory says about whether its orchestrator may run."""

    run_id: str
    path: Path
    hold_reason: str | None = None  # why no orchestrator may run now
    finished: bool = False

    @property
    def runnable(self) -> bool:
        return self.hold_reason is None and not self.finished


class OrchConfigValidator:
    """Validates `control/orch.toml`, re-reading a file only when it changed."""

    def __init__(self) -> None:
        self._cache: dict[Path, tuple[tuple[int, int, int], str | None]] = {}

    def problem(self, path: Path) -> str | None:
        """None if the file is a valid orchestrator config, else what is wrong."""
        try:
            stat = path.stat()
        except FileNotFoundError:
            return f"no {_relative(path)} yet"
        signature = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        cached = self._cache.get(path)
        if cached is not None and cached[0] == signature:
            return cached[1]
        try:
            load_orchestrator_config(path)
            problem = None
        except ConfigError as err:
            problem = f"{_relative(path)} is invalid: {err}"
        except OSError as err:
            problem = f"cannot read {_relative(path)}: {err}"
        self._cache[path] = (signature, problem)
        return problem


def scan_run(run: Path, validator: OrchConfigValidator | None = None) -> RunScan:
    """One run directory, by its condition: evicted or rejected holds it (a rejection until
    the trainer clears it, even for an orch.toml edited since); finished is left to end;
    an open run is held while its orch.toml is invalid or missing, else runnable."""
    condition = run_control.run_condition(run)
    if condition.kind in (Condition.EVICTED, Condition.REJECTED):
        return RunScan(run.name, run, hold_reason=f"{condition.kind}: {condition.reason}")
    if condition.kind is Condition.FINISHED:
        return RunScan(run.name, run, finished=True)
    problem = (validator or OrchConfigValidator()).problem(layout.orch_config_path(run))
    return RunScan(run.name, run, hold_reason=problem)


def scan_runs(experiment: Path, validator: OrchConfigValidator | None = None) -> dict[str, RunScan]:
    validator = validator or OrchConfigValidator()
    return {run.name: scan_run(run, validator) for run in layout.list_run_dirs(experiment)}


# ---------------------------------------------------------------- deciding


@dataclass(frozen=True)
class OrchestratorView:
    """What `reconcile` needs to know about an orchestrator the supervisor already has."""

    state: ProcessState
    held: bool = False
    reason: str | None = None


@dataclass(frozen=True)
class StartOrchestrator:
    run_id: str
    path: Path


@dataclass(frozen=True)
class StopOrchestrator:
    """Stop (or, if already down, mark held with) `reason`; started again once it clears."""

    run_id: str
    reason: str


ReconcileAction = StartOrchestrator | StopOrchestrator


def reconcile(
    scans: dict[str, RunScan], orchestrators: dict[str, OrchestratorView]
) -> list[ReconcileAction]:
    """The starts and stops that make the orchestrators match the run directories.

    An orchestrator that exited or failed by itself is never restarted here (its restart
    policy already had its say; `restart_run` starts it again). A finished run is left to
    exit by itself.
    """
    actions: list[ReconcileAction] = []
    for run_id in sorted(set(scans) | set(orchestrators)):
        scan = scans.get(run_id)
        view = orchestrators.get(run_id)
        hold = RUN_DELETED if scan is None else scan.hold_reason
        if hold is not None:
            if view is not None and (
                view.state not in TERMINAL_STATES or (view.held and view.reason != hold)
            ):
                actions.append(StopOrchestrator(run_id, hold))
            continue
        assert scan is not None
        if scan.finished:
            continue
        if view is None or (view.state == ProcessState.STOPPED and view.held):
            actions.append(StartOrchestrator(run_id, scan.path))
    return actions


# ---------------------------------------------------------------- watching


_WATCHED_EVENTS: list[type[FileSystemEvent]] = [
    FileCreatedEvent,
    DirCreatedEvent,
    FileDeletedEvent,
    DirDeletedEvent,
    FileMovedEvent,
    DirMovedEvent,
    FileModifiedEvent,
    FileClosedEvent,  # an editor saving orch.toml in place
]


class _RelevantChangeHandler(FileSystemEventHandler):
    def __init__(self, experiment: Path, on_change: Callable[[], None]):
        self._experiment = os.fsdecode(experiment)
        self._on_change = on_change

    def on_any_event(self, event: FileSystemEvent) -> None:
        paths = [event.src_path, getattr(event, "dest_path", "")]
        if any(path and self._matters(os.fsdecode(path)) for path in paths):
            self._on_change()

    def _matters(self, path: str) -> bool:
        parent, name = os.path.split(path)
        if parent == self._experiment:
            return layout.is_run_dir_name(name)
        grandparent, parent_name = os.path.split(parent)
        if name == "control":  # run_x/control itself
            return grandparent == self._experiment and layout.is_run_dir_name(parent_name)
        return parent_name == "control" and name in CONTROL_FILES


class RunDirectoryWatcher:
    """Calls `on_change` (from watchdog's thread) when a run appears, goes, or changes its
    control files. `sync` (from the supervisor's loop) keeps the set of watched directories
    in line with the run directories that exist."""

    def __init__(self, experiment: Path, on_change: Callable[[], None]):
        self._experiment = experiment
        self._handler = _RelevantChangeHandler(experiment, on_change)
        self._observer = Observer()
        self._observer.daemon = True
        self._watches: dict[Path, tuple[ObservedWatch, int]] = {}

    def start(self) -> None:
        self._observer.start()
        self.sync()

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._observer.stop()
            self._observer.join(timeout=2)

    def sync(self) -> None:
        wanted = [self._experiment]
        for run in layout.list_run_dirs(self._experiment):
            wanted.append(run)
            wanted.append(layout.control_dir(run))
        inodes = {path: _inode(path) for path in wanted}
        for path, (watch, inode) in list(self._watches.items()):
            # A directory that was deleted (or replaced by a new one of the same name)
            # has a dead inotify watch: drop it and watch the new directory afresh.
            if inodes.get(path) != inode:
                with contextlib.suppress(Exception):
                    self._observer.unschedule(watch)
                del self._watches[path]
        for path, inode in inodes.items():
            if inode is None or path in self._watches:
                continue
            try:
                watch = self._observer.schedule(
                    self._handler, os.fspath(path), recursive=False, event_filter=_WATCHED_EVENTS
                )
            except OSError as err:  # gone again, or out of inotify watches: rescans cover it
                log.debug("cannot watch %s: %s", path, err)
                continue
            self._watches[path] = (watch, inode)

    @property
    def watched(self) -> list[Path]:
        return sorted(self._watches)


def _inode(path: Path) -> int | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_ino if path.is_dir() else None


def _relative(path: Path) -> str:
    """`control/orch.toml` rather than a long absolute path, in messages about one run."""
    return f"{path.parent.name}/{path.name}"
