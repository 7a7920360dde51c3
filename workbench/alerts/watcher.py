"""The supervisor's alert watcher: the rules (`workbench.alerts.rules`) applied as records come.

Every `interval_s` (on the supervisor's loop: the reads are a few `stat`s and what the files
gained) it reads what each run's metrics.jsonl gained and hands every record to the run's
rules, checks each open run for a stall, and each process's failed exits for a burst. A new
alert is appended to `alerts.jsonl` and handed to `on_alert` (experiment tracking).

Deduplicated by episode: the alerts already in the file are read first, and a finding whose
(run, process, rule, key) is among them is not written again. A restarted supervisor reads
every metrics.jsonl from its start and finds the same episodes under the same keys.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from workbench.alerts.rules import (
    Finding,
    RecordRule,
    failure_burst,
    number,
    record_rules,
    stalled,
)
from workbench.config.alerts import AlertsSection
from workbench.files import layout, run_control
from workbench.files.alerts import Alert, append_alert, json_values, read_alerts
from workbench.files.metrics import parse_record
from workbench.system.clock import format_duration
from workbench.system.file_tail import AppendedLines

log = logging.getLogger("workbench.alerts")

POLL_INTERVAL_S = 1.0


@dataclass
class _FollowedRun:
    metrics: AppendedLines
    rules: list[RecordRule]
    last_time: float | None = None  # unix time of its newest record
    last_step: int | None = None
    stall_active: bool = False


@dataclass
class _FollowedProcess:
    burst_active: bool = False


@dataclass
class AlertWatcher:
    """Checks the rules of `section` over the runs and processes of `experiment`."""

    experiment: Path
    section: AlertsSection
    on_alert: Callable[[Alert], None] | None = None
    interval_s: float = POLL_INTERVAL_S
    clock: Callable[[], float] = time.time
    _runs: dict[str, _FollowedRun] = field(default_factory=dict)
    _processes: dict[str, _FollowedProcess] = field(default_factory=dict)
    _raised: set[tuple] = field(default_factory=set)
    _started: float = 0.0
    _next_poll: float = 0.0

    def __post_init__(self) -> None:
        self.experiment = Path(self.experiment)
        self._raised = {alert.identity for alert in read_alerts(self.experiment)}
        # Time before the watcher ran is nobody's stall: a supervisor started after a
        # long pause does not blame the runs for it.
        self._started = self.clock()

    def poll(self, failures: Mapping[str, Sequence[float]] | None = None) -> list[Alert]:
        """Check every rule now, if `interval_s` has passed since the last check; the new
        alerts. `failures`: each process's failed exits (unix times), by name."""
        now = self.clock()
        if not self.section.enabled or now < self._next_poll:
            return []
        self._next_poll = now + self.interval_s
        raised: list[Alert] = []
        runs = {run.name: run for run in layout.list_run_dirs(self.experiment)}
        for run_id in [run_id for run_id in self._runs if run_id not in runs]:
            del self._runs[run_id]
        for run_id, run in runs.items():
            raised += self._check_run(run_id, run, now)
        for name, times in (failures or {}).items():
            raised += self._check_process(name, times, now)
        return raised

    def _check_run(self, run_id: str, run: Path, now: float) -> list[Alert]:
        followed = self._runs.get(run_id)
        if followed is None:
            followed = self._runs[run_id] = self._follow(run)
        raised = []
        # One slice of the file a poll (`AppendedLines` bounds a read): a long backlog is
        # spread over a few polls rather than holding up the supervisor's loop.
        for line in self._read(followed):
            record = parse_record(line)
            if record is not None:
                raised += self._observe(run_id, followed, record, now)
        if self.section.checks("stall"):
            raised += self._check_stall(run_id, run, followed, now)
        return raised

    def _follow(self, run: Path) -> _FollowedRun:
        return _FollowedRun(AppendedLines(layout.metrics_path(run)), record_rules(self.section))

    def _read(self, followed: _FollowedRun) -> list[bytes]:
        restarts = followed.metrics.restarts
        lines = followed.metrics.read()
        if followed.metrics.restarts != restarts:  # a new metrics.jsonl: a new history
            followed.rules = record_rules(self.section)
            followed.last_time = followed.last_step = None
        return lines

    def _observe(
        self, run_id: str, followed: _FollowedRun, record: dict, now: float
    ) -> list[Alert]:
        record_time = number(record, "time")
        if record_time is not None and (
            followed.last_time is None or record_time >= followed.last_time
        ):
            followed.last_time = record_time
            step = record.get("step")
            followed.last_step = step if isinstance(step, int) else followed.last_step
            followed.stall_active = False
        raised = []
        for rule in followed.rules:
            finding = rule.observe(record)
            if finding is not None:
                raised += self._raise(finding, now, run=run_id)
        return raised

    def _check_stall(
        self, run_id: str, run: Path, followed: _FollowedRun, now: float
    ) -> list[Alert]:
        last = None if followed.last_time is None else max(followed.last_time, self._started)
        if not stalled(last, now, self.section.stall_s) or followed.stall_active:
            return []
        if run_control.run_condition(run).kind is not run_control.Condition.OPEN:
            return []  # finished, evicted or rejected: it records nothing on purpose
        followed.stall_active = True
        quiet = now - followed.last_time  # type: ignore[operator]
        finding = Finding(
            "stall",
            f"after step {followed.last_step} at {followed.last_time}",
            f"no record for {format_duration(quiet)}: its last was step {followed.last_step}",
            followed.last_step,
            {"quiet_s": round(quiet, 1), "last_step": followed.last_step},
        )
        return self._raise(finding, now, run=run_id)

    def _check_process(self, name: str, times: Sequence[float], now: float) -> list[Alert]:
        if not self.section.checks("restarts"):
            return []
        followed = self._processes.setdefault(name, _FollowedProcess())
        burst = failure_burst(times, now, self.section.restarts, self.section.restarts_window_s)
        was_active, followed.burst_active = followed.burst_active, bool(burst)
        if not burst or was_active:
            return []
        window = self.section.restarts_window_s
        finding = Finding(
            "restarts",
            f"failed at {burst[0]}",
            f"{name} failed {len(burst)} times in {window / 60:.0f} min and keeps restarting",
            None,
            {"failures": len(burst), "window_s": window},
        )
        is_run = layout.is_run_dir_name(name)
        return self._raise(finding, now, run=name if is_run else None, process=name)

    def _raise(
        self, finding: Finding, now: float, *, run: str | None, process: str | None = None
    ) -> list[Alert]:
        alert = Alert(
            time=round(now, 3),
            run=run,
            rule=finding.rule,
            message=finding.message,
            key=finding.key,
            step=finding.step,
            process=process,
            values=json_values(finding.values),
        )
        if alert.identity in self._raised:
            return []
        append_alert(self.experiment, alert)
        self._raised.add(alert.identity)
        log.warning("alert: %s: %s", run or process, alert.message)
        if self.on_alert is not None:
            self.on_alert(alert)
        return [alert]
