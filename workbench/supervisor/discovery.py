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
- `RunDirectoryWatcher`: calls back when anything that matters changes, so a new run gets
  its orchestrator within a second. It watches only the experiment directory, each run
  directory and each run's `control/`, never recursively: logs and rollouts change all
  the time and are none of discovery's business. One inotify descriptor holds every
  watch, read by one thread, whatever the number of runs (watchdog's observer, used
  before, ran a thread per watched directory: 204 threads for a 100-run sweep).
  The supervisor also rescans every few seconds as a safety net against missed events,
  and without inotify (not Linux, or no descriptor left) the rescans do it all.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

try:  # Linux only: elsewhere the supervisor's rescans find every change.
    from inotify_simple import flags
except ImportError:  # pragma: no cover - not on the Linux machines this is tested on
    flags = None  # type: ignore[assignment]

from workbench.config import ConfigError, load_orchestrator_config
from workbench.files import layout, run_control
from workbench.files.experiment_changes import DirectoryWatches, open_inotify
from workbench.files.run_control import Condition
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


# How long the watcher's thread waits for events before it looks whether to stop.
READ_TIMEOUT_MS = 200


def _watch_mask() -> int:
    if flags is None:
        return 0
    # Made, deleted, renamed, written (an editor saving orch.toml in place), closed after
    # writing; directories only. Reads are not events.
    return (
        flags.CREATE
        | flags.DELETE
        | flags.MOVED_FROM
        | flags.MOVED_TO
        | flags.MODIFY
        | flags.CLOSE_WRITE
        | flags.ONLYDIR
    )


class RunDirectoryWatcher:
    """Calls `on_change` (from its own thread) when a run appears, goes, or changes its
    control files. `sync` (from the supervisor's loop) keeps the set of watched directories
    in line with the run directories that exist."""

    def __init__(self, experiment: Path, on_change: Callable[[], None]):
        self._experiment = os.fsdecode(experiment)
        self._experiment_path = experiment
        self._on_change = on_change
        self._inotify = open_inotify()
        self._lock = threading.Lock()  # the watches: `sync` changes them, the thread reads
        # Each watch notes its directory's inode.
        self._watches = DirectoryWatches(self._inotify, _watch_mask())
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._follow, name="run-directory-watcher", daemon=True
        )

    def start(self) -> None:
        if self._inotify is not None:
            self._thread.start()
        self.sync()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        if self._inotify is not None:
            with contextlib.suppress(OSError):
                self._inotify.close()

    def sync(self) -> None:
        if self._inotify is None:
            return
        wanted = [self._experiment_path]
        for run in layout.list_run_dirs(self._experiment_path):
            wanted.append(run)
            wanted.append(layout.control_dir(run))
        inodes = {os.fsdecode(path): _inode(path) for path in wanted}
        with self._lock:
            for path in self._watches.paths():
                # A directory that was deleted (or replaced by a new one of the same name)
                # has a dead watch: drop it and watch the new directory afresh.
                if inodes.get(path) != self._watches.note_of(path):
                    self._watches.remove(path)
            for path, inode in inodes.items():
                if inode is not None:  # gone again, or out of watches: rescans cover it
                    self._watches.add(path, inode)

    @property
    def watched(self) -> list[Path]:
        with self._lock:
            return sorted(Path(path) for path in self._watches.paths())

    def _follow(self) -> None:
        assert self._inotify is not None
        while not self._stopping.is_set():
            try:
                events = self._inotify.read(timeout=READ_TIMEOUT_MS)
            except (OSError, ValueError) as err:  # closed: the rescans go on alone
                log.debug("run directory watcher stops: %s", err)
                return
            if any(self._matters(event) for event in events):
                self._on_change()

    def _matters(self, event) -> bool:
        if event.mask & flags.Q_OVERFLOW:  # events were lost: any of them may have mattered
            return True
        with self._lock:
            directory = self._watches.path(event.wd)
        if directory is None or not event.name:
            return False
        return self._matters_at(os.path.join(directory, event.name))

    def _matters_at(self, path: str) -> bool:
        parent, name = os.path.split(path)
        if parent == self._experiment:
            return layout.is_run_dir_name(name)
        grandparent, parent_name = os.path.split(parent)
        if name == "control":  # run_x/control itself
            return grandparent == self._experiment and layout.is_run_dir_name(parent_name)
        return parent_name == "control" and name in CONTROL_FILES


def _inode(path: Path) -> int | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_ino if path.is_dir() else None


def _relative(path: Path) -> str:
    """`control/orch.toml` rather than a long absolute path, in messages about one run."""
    return f"{path.parent.name}/{path.name}"
