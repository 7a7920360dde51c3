"""The supervisor's tracking: follow every run's metrics.jsonl, forward each record.

`MetricsForwarder` runs on a thread of its own, so a slow library (wandb's start, a full
disk, a network) never holds up the supervisor's loop. Every `interval_s` it reads what
each run's metrics.jsonl gained (`workbench.system.file_tail.AppendedLines`), opens the run's
tracker run when the first record comes (resuming the one its progress file names), sends
each record, and writes the progress file. A run that is finished or evicted and has
nothing new gets its tracker run finished; a record that comes later reopens it. On stop
it forwards what is left, finishes every tracker run and releases the library.

Alerts (`workbench.alerts`) come through `alert`, from the supervisor's loop: each is sent
on the next pass as the tracker's own alert, to its run's tracker run (reopened if it was
finished), or to every open one for an alert of the inference server or the trainer. One
still queued when the supervisor is killed is not sent (alerts.jsonl keeps it).

Any failure (the library missing or failing, a disk error) is logged as a warning, listed
in `warnings()` (the supervisor puts them into state.json, where `workbench status` and the
TUI show them), and retried after `retry_s`. It never reaches the runs.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.config import ConfigError, load_orchestrator_config
from workbench.files import layout, run_control
from workbench.files.alerts import Alert
from workbench.files.metrics import parse_record
from workbench.sweep.values import flatten_values
from workbench.system.file_tail import AppendedLines
from workbench.tracking.backend import Backend, TrackedRun, TrackerRun
from workbench.tracking.progress import Progress, read_progress, write_progress
from workbench.tracking.target import TrackingTarget

log = logging.getLogger("workbench.tracking")

POLL_INTERVAL_S = 1.0
RETRY_S = 30.0
STOP_TIMEOUT_S = 60.0
LOG_AGAIN_S = 60.0
BACKEND = "(backend)"  # the problems key of the library itself, beside the runs'
# Alerts of these rules are errors to a tracker; the others warnings.
ERROR_RULES = frozenset({"non_finite", "restarts"})
# Fields of every record that say where it comes from, not what was measured.
RECORD_FIELDS = frozenset({"source", "step", "time"})


def tracked_values(record: dict[str, Any]) -> tuple[str, int, dict[str, float]] | None:
    """(source, step, numbers keyed `<source>/<key>`) of one metrics.jsonl record; None for
    a record without a source, an integer step or any number. Booleans count as 0 or 1 (a
    dashboard plots those); strings (an adapter's name) are left out."""
    source, step = record.get("source"), record.get("step")
    if not isinstance(source, str) or not isinstance(step, int) or isinstance(step, bool):
        return None
    values = {
        f"{source}/{key}": float(value)
        for key, value in record.items()
        if key not in RECORD_FIELDS and isinstance(value, int | float)
    }
    return (source, step, values) if values else None


@dataclass
class _FollowedRun:
    metrics: AppendedLines
    progress: Progress | None  # None until its tracker run is opened
    tracker: TrackerRun | None = None
    retry_at: float = 0.0


@dataclass
class _Problems:
    """Current problems by key (a run id, or BACKEND), shared with the supervisor's thread."""

    current: dict[str, str] = field(default_factory=dict)
    logged: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def report(self, key: str, message: str) -> None:
        now = time.monotonic()
        with self.lock:
            self.current[key] = message
            # Once a minute per distinct message: a failing disk must not fill the log.
            if self.logged.get(message, -LOG_AGAIN_S) + LOG_AGAIN_S <= now:
                self.logged[message] = now
                log.warning("%s", message)

    def clear(self, key: str) -> None:
        with self.lock:
            self.current.pop(key, None)

    def listed(self) -> list[str]:
        with self.lock:
            return [self.current[key] for key in sorted(self.current)]


def open_backend(target: TrackingTarget, experiment: Path) -> Backend:
    """The adapter of the library `target` names, imported only now."""
    if target.backend == "trackio":
        from workbench.tracking.trackio_backend import TrackioBackend

        return TrackioBackend(target.dir, target.project)
    if target.backend == "wandb":
        from workbench.tracking.wandb_backend import WandbBackend

        return WandbBackend(target.dir or experiment, mode=target.mode, entity=target.entity)
    raise ValueError(f"unknown tracking backend {target.backend!r}")


class MetricsForwarder:
    """Forwards every run of `experiment` to `target` (see the module docstring)."""

    def __init__(
        self,
        experiment: Path,
        target: TrackingTarget,
        *,
        interval_s: float = POLL_INTERVAL_S,
        retry_s: float = RETRY_S,
        backend_factory: Callable[[TrackingTarget, Path], Backend] = open_backend,
    ):
        self.experiment = Path(experiment)
        self.target = target
        self.interval_s = interval_s
        self.retry_s = retry_s
        self._backend_factory = backend_factory
        self._backend: Backend | None = None
        self._backend_retry_at = 0.0
        self._runs: dict[str, _FollowedRun] = {}
        self._problems = _Problems()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._restore_showwarning: Callable[[], None] | None = None
        self._alerts: deque[Alert] = deque()  # appended by the supervisor's thread

    # ---------------------------------------------------------------- the thread

    def start(self) -> None:
        log.info(
            "tracking: forwarding every run's metrics to %s, project %r",
            self.target.backend,
            self.target.project,
        )
        self._thread = threading.Thread(target=self._follow, name="tracking", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Forward what is left, finish every tracker run and wait (at most `timeout_s`)."""
        self._stop.set()
        if self._thread is None:
            return
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning(
                "tracking: not done after %gs (a slow %s?); the last records may be missing",
                timeout_s,
                self.target.backend,
            )

    def alert(self, alert: Alert) -> None:
        """Send `alert` to the tracker on the next pass (safe from another thread)."""
        self._alerts.append(alert)

    def warnings(self) -> list[str]:
        """What is wrong with tracking now, one line each (for state.json)."""
        return self._problems.listed()

    def _follow(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.interval_s)
        self.poll()
        self.close()

    # ---------------------------------------------------------------- one pass

    def poll(self, now: float | None = None) -> None:
        """Forward what every run's metrics.jsonl gained since the last pass."""
        now = time.monotonic() if now is None else now
        try:
            backend = self._ensure_backend(now)
            if backend is None:
                return
            runs = {run.name: run for run in layout.list_run_dirs(self.experiment)}
            for run_id in [run_id for run_id in self._runs if run_id not in runs]:
                self._finish(run_id)  # its directory was deleted
                del self._runs[run_id]
            for run_id, run in runs.items():
                self._poll_run(backend, run_id, run, now)
            self._send_alerts(backend, runs)
        except Exception as err:  # a bug here must not end tracking, let alone training
            self._problems.report(BACKEND, self._describe(f"tracking failed: {err!r}"))

    def close(self) -> None:
        """Finish every tracker run and release the library."""
        for run_id in list(self._runs):
            self._finish(run_id)
        if self._backend is not None:
            try:
                self._backend.close()
            except Exception as err:
                self._problems.report(BACKEND, self._describe(f"closing failed: {err!r}"))
            self._backend = None
        if self._restore_showwarning is not None:
            self._restore_showwarning()
            self._restore_showwarning = None

    def _ensure_backend(self, now: float) -> Backend | None:
        if self._backend is not None or now < self._backend_retry_at:
            return self._backend
        try:
            self._backend = self._backend_factory(self.target, self.experiment)
        except Exception as err:
            self._backend_retry_at = now + self.retry_s
            self._problems.report(
                BACKEND,
                self._describe(f"cannot start: {err!r}; trying again in {self.retry_s:g}s"),
            )
            return None
        self._problems.clear(BACKEND)
        self._watch_library_warnings(self._backend.library)
        return self._backend

    def _poll_run(self, backend: Backend, run_id: str, run: Path, now: float) -> None:
        followed = self._runs.get(run_id)
        if followed is None:
            followed = self._runs[run_id] = self._resume_point(run_id, run)
        if now < followed.retry_at:
            return
        try:
            sent = self._forward(backend, run_id, run, followed)
        except Exception as err:
            followed.retry_at = now + self.retry_s
            self._finish(run_id)  # a failed tracker run is reopened (resumed) at the retry
            # Read again whatever was not sent.
            followed.metrics = _follow_from(run, followed.progress)
            self._problems.report(
                run_id,
                self._describe(f"{run_id}: {err!r}; trying again in {self.retry_s:g}s"),
            )
            return
        self._problems.clear(run_id)
        if not sent and followed.tracker is not None and _is_over(run):
            self._finish(run_id)

    def _send_alerts(self, backend: Backend, runs: dict[str, Path]) -> None:
        while self._alerts:
            alert = self._alerts[0]
            if alert.run is not None:
                targets = [alert.run] if alert.run in runs else []
            else:  # the inference server or the trainer: every run's concern
                targets = [run_id for run_id, f in self._runs.items() if f.tracker is not None]
            for run_id in targets:
                followed = self._runs.setdefault(run_id, self._resume_point(run_id, runs[run_id]))
                if followed.tracker is None:
                    self._open(backend, run_id, runs[run_id], followed)
                assert followed.tracker is not None
                level = "error" if alert.rule in ERROR_RULES else "warn"
                title = f"{alert.run or alert.process}: {alert.rule}"
                followed.tracker.alert(title, alert.message, level, alert.step)
            self._alerts.popleft()  # sent (or nowhere to send): a failure above retries it

    def _resume_point(self, run_id: str, run: Path) -> _FollowedRun:
        progress = read_progress(self.experiment, run_id)
        if progress is not None and (progress.backend, progress.project) != (
            self.target.backend,
            self.target.project,
        ):
            progress = None  # never sent there: from the start
        return _FollowedRun(_follow_from(run, progress), progress)

    def _forward(self, backend: Backend, run_id: str, run: Path, followed: _FollowedRun) -> int:
        """Send the run's new records, a slice of the file at a time (`AppendedLines` bounds
        one read), until none is left; returns how many were sent."""
        sent = 0
        while True:
            restarts = followed.metrics.restarts
            lines = followed.metrics.read_with_ends()
            if followed.metrics.restarts != restarts:
                # A new metrics.jsonl (the run directory was replaced): a new tracker run.
                self._finish(run_id)
                followed.progress = None
            if not lines:
                return sent
            sent += self._send(backend, run_id, run, followed, lines)

    def _send(
        self,
        backend: Backend,
        run_id: str,
        run: Path,
        followed: _FollowedRun,
        lines: list[tuple[bytes, int]],
    ) -> int:
        items = [(_tracked_line(line), end) for line, end in lines]
        if followed.tracker is None:
            if all(item is None for item, _ in items):
                return 0  # nothing to send: no tracker run for it (yet)
            self._open(backend, run_id, run, followed)
        assert followed.tracker is not None and followed.progress is not None
        progress = followed.progress
        sent = 0
        try:
            for item, end in items:
                if item is not None:
                    followed.tracker.log(*item)
                    sent += 1
                progress.offset = end
        finally:
            progress.records += sent
            write_progress(self.experiment, run_id, progress)
        return sent

    def _open(self, backend: Backend, run_id: str, run: Path, followed: _FollowedRun) -> None:
        resumed = followed.progress
        tracked = TrackedRun(
            project=self.target.project,
            name=self.target.tracker_run_name(run_id),
            group=self.target.experiment,
            config=_run_config(run),
        )
        followed.tracker = backend.open_run(tracked, resumed.tracker_id if resumed else None)
        followed.progress = Progress(
            backend=self.target.backend,
            project=self.target.project,
            tracker_id=followed.tracker.id,
            inode=followed.metrics.inode,
            offset=resumed.offset if resumed else 0,
            records=resumed.records if resumed else 0,
        )
        # Written before anything is sent: a crash from here on resumes this tracker run
        # rather than opening a second one.
        write_progress(self.experiment, run_id, followed.progress)
        log.info(
            "tracking: %s -> %s run %r (%s)",
            run_id,
            self.target.backend,
            tracked.name,
            "resumed" if resumed else "new",
        )

    def _finish(self, run_id: str) -> None:
        followed = self._runs.get(run_id)
        if followed is None or followed.tracker is None:
            return
        tracker, followed.tracker = followed.tracker, None
        try:
            tracker.finish()
        except Exception as err:
            self._problems.report(run_id, self._describe(f"{run_id}: finishing: {err!r}"))

    def _describe(self, message: str) -> str:
        return f"tracking ({self.target.backend}): {message}"

    def _watch_library_warnings(self, library: str) -> None:
        """Count the library's own Python warnings as problems: trackio reports a failed
        write (full disk, unwritable directory) only so, from its sender thread."""
        spec = importlib.util.find_spec(library)
        if spec is None or spec.origin is None:
            return
        package = str(Path(spec.origin).parent)
        previous = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):  # type: ignore[no-untyped-def]
            if str(filename).startswith(package):
                self._problems.report(BACKEND, self._describe(str(message)))  # logs it too
            else:
                previous(message, category, filename, lineno, file, line)

        warnings.showwarning = show

        def restore() -> None:
            if warnings.showwarning is show:
                warnings.showwarning = previous

        self._restore_showwarning = restore


def _run_config(run: Path) -> dict[str, Any]:
    """The run's orch.toml values by dotted key; empty when it has none readable."""
    try:
        config = load_orchestrator_config(layout.orch_config_path(run))
    except ConfigError:
        return {}
    return flatten_values(config.model_dump(mode="json"))


def _is_over(run: Path) -> bool:
    return run_control.is_finished(run) or run_control.read_eviction(run) is not None


def _follow_from(run: Path, progress: Progress | None) -> AppendedLines:
    """The run's metrics.jsonl followed from just past the last record `progress` counts as
    sent, or from its start."""
    path = layout.metrics_path(run)
    if progress is None or progress.inode is None:
        return AppendedLines(path)
    return AppendedLines.resuming(path, progress.inode, progress.offset)


def _tracked_line(line: bytes) -> tuple[str, int, dict[str, float]] | None:
    record = parse_record(line)
    return None if record is None else tracked_values(record)


def start_forwarding(experiment: Path, target: TrackingTarget | None) -> MetricsForwarder | None:
    """The supervisor's hook: a running forwarder, or None when the recipe tracks nothing."""
    if target is None:
        return None
    forwarder = MetricsForwarder(experiment, target)
    forwarder.start()
    return forwarder
