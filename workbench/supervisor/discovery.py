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
- `RunDirectoryWatcher`: calls back when a run directory appears, goes or is renamed, so
  a new run gets its orchestrator within a second. One watchdog schedule of the
  experiment directory itself, not recursive (`workbench.system.tree_events`: three
  threads and one kernel watch whatever the number of runs): nothing a run writes
  (logs, metrics, rollouts, checkpoints, broadcasts) reaches discovery's handler.
  A run whose directory came before its `control/orch.toml` waits for it
  (`RunScan.awaiting_config`): the supervisor looks at those few runs again at every
  tick of its loop. A control file written into a running run (`evicted.txt`, a
  rejection, `finished.txt`) is found by the rescan every few seconds, which also
  catches whatever no event told (NFS writes from another machine send none); without
  a watch (out of inotify watches or instances: warned, naming the limit) the rescans
  and the ticks do it all. Measured against a recursive schedule in docs/discovery.md.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileSystemEvent,
)
from watchdog.observers.api import BaseObserver

from workbench.config import ConfigError, load_orchestrator_config
from workbench.files import layout, run_control
from workbench.files.run_control import Condition
from workbench.files.tinker_work import SOURCE_TINKER
from workbench.supervisor.lifecycle import TERMINAL_STATES, ProcessState
from workbench.system import tree_events

log = logging.getLogger(__name__)

RUN_DELETED = "run directory deleted"


# ---------------------------------------------------------------- what a run directory says


@dataclass(frozen=True)
class RunScan:
    """What one run directory says about whether its orchestrator may run."""

    run_id: str
    path: Path
    hold_reason: str | None = None  # why no orchestrator may run now
    finished: bool = False
    awaiting_config: bool = False  # held only for a missing or invalid control/orch.toml
    # `source = "tinker"`: a Tinker client drives it through the service; no orchestrator.
    client_driven: bool = False

    @property
    def runnable(self) -> bool:
        return self.hold_reason is None and not self.finished


class OrchConfigValidator:
    """Validates `control/orch.toml`, re-reading a file only when it changed."""

    def __init__(self) -> None:
        self._cache: dict[Path, tuple[tuple[int, int, int], str | None, str | None]] = {}

    def problem(self, path: Path) -> str | None:
        """None if the file is a valid orchestrator config, else what is wrong."""
        return self._read(path)[0]

    def source(self, path: Path) -> str | None:
        """The valid file's `source` (`recipe`, `tinker`); None while it is invalid."""
        return self._read(path)[1]

    def _read(self, path: Path) -> tuple[str | None, str | None]:
        try:
            stat = path.stat()
        except FileNotFoundError:
            return f"no {_relative(path)} yet", None
        signature = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        cached = self._cache.get(path)
        if cached is not None and cached[0] == signature:
            return cached[1], cached[2]
        problem = source = None
        try:
            source = load_orchestrator_config(path).source
        except ConfigError as err:
            problem = f"{_relative(path)} is invalid: {err}"
        except OSError as err:
            problem = f"cannot read {_relative(path)}: {err}"
        self._cache[path] = (signature, problem, source)
        return problem, source


def scan_run(run: Path, validator: OrchConfigValidator | None = None) -> RunScan:
    """One run directory, by its condition: evicted or rejected holds it (a rejection until
    the trainer clears it, even for an orch.toml edited since); finished is left to end;
    an open run is held while its orch.toml is invalid or missing, else runnable."""
    condition = run_control.run_condition(run)
    if condition.kind in (Condition.EVICTED, Condition.REJECTED):
        return RunScan(run.name, run, hold_reason=f"{condition.kind}: {condition.reason}")
    if condition.kind is Condition.FINISHED:
        return RunScan(run.name, run, finished=True)
    validator = validator or OrchConfigValidator()
    problem = validator.problem(layout.orch_config_path(run))
    client_driven = validator.source(layout.orch_config_path(run)) == SOURCE_TINKER
    return RunScan(
        run.name,
        run,
        hold_reason=problem,
        awaiting_config=problem is not None,
        client_driven=client_driven,
    )


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
        # A Tinker client's run has no orchestrator: the trainer takes its work items.
        if scan.finished or scan.client_driven:
            continue
        if view is None or (view.state == ProcessState.STOPPED and view.held):
            actions.append(StartOrchestrator(run_id, scan.path))
    return actions


# ---------------------------------------------------------------- watching


# A run directory made, deleted or renamed (in or out: watchdog tells a rename from or to
# elsewhere as deleted or made).
WATCHED_EVENTS: tuple[type[FileSystemEvent], ...] | None = (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
)


class RunDirectoryWatcher:
    """Calls `on_change` (from watchdog's thread) when a run directory appears, goes or is
    renamed. `sync` (from the supervisor's loop, at every rescan) starts watching if the
    experiment directory was not there before or the observer stopped."""

    def __init__(self, experiment: Path, on_change: Callable[[], None]):
        self._experiment = os.fsdecode(experiment)
        self._experiment_path = experiment
        self._on_change = on_change
        self._observer: BaseObserver | None = None
        self._lock = threading.Lock()  # `sync` (supervisor's loop) against `stop`
        self._stopped = False
        self._gave_up = False  # out of watches or instances: warned, not tried again
        self.events_seen = 0  # every event the filter let through (for benchmarks)

    def start(self) -> None:
        self.sync()

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            observer, self._observer = self._observer, None
        tree_events.stop_following(observer)

    def sync(self) -> None:
        with self._lock:
            if self._stopped or self._gave_up or not self._experiment_path.is_dir():
                return
            if self._observer is not None and self._observer.is_alive():
                return
            tree_events.stop_following(self._observer)
            self._observer = tree_events.follow_tree(
                self._experiment_path,
                self._notice,
                WATCHED_EVENTS,
                "run discovery",
                recursive=False,
            )
            self._gave_up = self._observer is None

    @property
    def watching(self) -> bool:
        """Whether events are followed at all (else the rescans do everything)."""
        with self._lock:
            return self._observer is not None and self._observer.is_alive()

    def _notice(self, event: FileSystemEvent) -> None:
        self.events_seen += 1
        for path in (event.src_path, event.dest_path):
            if path:
                parent, name = os.path.split(os.fsdecode(path))
                if parent == self._experiment and layout.is_run_dir_name(name):
                    self._on_change()
                    return


def _relative(path: Path) -> str:
    """`control/orch.toml` rather than a long absolute path, in messages about one run."""
    return f"{path.parent.name}/{path.name}"
