"""The supervisor's early stopping: follow each run's metrics, ask ASHA, hand back evictions.

(`schedulers.start_scheduler` picks this or population-based training, `workbench.sweep.pbt_scheduler`,
by the recipe's `[sweep.scheduler]` kind; both answer the supervisor's `Scheduler` calls.)

`EarlyStopping.poll` runs on the supervisor's loop (at most once a second). It reads what
each `run_*/metrics.jsonl` gained since the last poll (complete lines only), builds each
run's curve of the metric, lets `workbench.sweep.asha.advance` decide, and writes every
new decision to `sweep/asha.json` before returning the evictions to carry out. The
supervisor evicts through its one eviction path and reports back with `evicted`, which
is written down too; a supervisor that restarts reads the file, so decisions already made
stand, and a stop decided but not carried out (a crash in between) is carried out then.
A run the trainer evicted because it diverged is handed to ASHA as such (`diverged_at`,
from its `evicted.txt`): the worst at its next rung, rather than a run that never gets
there.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from workbench.config import ConfigError, load_orchestrator_config
from workbench.files import layout, run_control
from workbench.files.metrics import parse_record
from workbench.sweep.asha import MetricPoint, RunCurve, RungResult, advance
from workbench.sweep.files import AshaRecord, read_asha, write_asha
from workbench.sweep.spec import AshaSpec
from workbench.system.clock import unix_time
from workbench.system.file_tail import AppendedLines

log = logging.getLogger("workbench.supervisor")

POLL_INTERVAL_S = 1.0
EVICTED_BY = "asha"


class Scheduler(Protocol):
    """What the supervisor asks of a scheduler, ASHA's or PBT's, on its loop."""

    evicted_by: str

    def poll(self, now: float) -> list[EarlyEviction]: ...

    def evicted(self, eviction: EarlyEviction) -> None: ...


@dataclass(frozen=True)
class EarlyEviction:
    run_id: str
    rung: int  # ASHA: the rung it was stopped at; PBT: the step it was judged at
    reason: str


@dataclass
class _FollowedRun:
    """One run's metrics.jsonl as read so far, and the metric's points in it."""

    metrics: AppendedLines
    points: list[MetricPoint] = field(default_factory=list)
    last_step: int = -1  # of any record, to tell "no such metric" from "not there yet"
    config_signature: tuple[int, int] | None = None
    max_steps: int | None = None
    # What ASHA saw last time; a run with the same points and flags has nothing new.
    seen: tuple[int, int | None, bool, bool, float | None] | None = None


class EarlyStopping:
    def __init__(self, experiment: Path, spec: AshaSpec, *, interval_s: float = POLL_INTERVAL_S):
        self.experiment = Path(experiment)
        self.spec = spec
        self.evicted_by = EVICTED_BY
        self.interval_s = interval_s
        self._runs: dict[str, _FollowedRun] = {}
        self._next_poll = 0.0
        self._warned: set[str] = set()
        self.record = self._load()

    def _load(self) -> AshaRecord:
        record = read_asha(self.experiment)
        if record is None:
            return AshaRecord(self.spec, [], {})
        if record.spec != self.spec:
            # Ranks under other rungs or another metric would not compare: start afresh.
            # Runs evicted under the old settings stay evicted (their evicted.txt stays).
            log.warning(
                "early stopping settings changed (%s -> %s): earlier rung decisions are set aside",
                record.spec.model_dump(),
                self.spec.model_dump(),
            )
            return AshaRecord(self.spec, [], {})
        return record

    # ---------------------------------------------------------------- each tick

    def poll(self, now: float) -> list[EarlyEviction]:
        """New evictions to carry out (at most every `interval_s` of `now`, a monotonic time)."""
        if now < self._next_poll:
            return []
        self._next_poll = now + self.interval_s
        actions = dict(self.record.actions)
        # A stop not carried out yet counts as evicted: the run is out of the race.
        pending = {e.run_id for e in self._due_evictions()}
        curves = []
        for run in layout.list_run_dirs(self.experiment):
            followed = self._runs.get(run.name)
            if followed is None:
                followed = self._runs[run.name] = _FollowedRun(
                    AppendedLines(layout.metrics_path(run))
                )
            self._read_new_records(followed)
            max_steps = self._max_steps(run, followed)
            if max_steps is None:
                continue  # no valid orch.toml: not a run the trainer would take
            self._warn_if_metric_missing(run.name, followed, max_steps)
            finished = run_control.is_finished(run)
            eviction = run_control.read_eviction(run)
            evicted = run.name in pending or eviction is not None
            diverged_at = _diverged_at(eviction, followed)
            seen = (len(followed.points), max_steps, finished, evicted, diverged_at)
            if seen == followed.seen:
                continue  # nothing new: whatever it could be judged on, it was
            followed.seen = seen
            points = tuple(followed.points)
            curves.append(RunCurve(run.name, points, max_steps, finished, evicted, diverged_at))
        new = advance(self.record.results, curves, self.spec)
        for result in new:
            self._log_decision(result)
        self.record.results.extend(new)
        evictions = self._due_evictions()
        if new or evictions or actions != self.record.actions:
            write_asha(self.experiment, self.record)  # decisions are on disk before any act
        return evictions

    def evicted(self, eviction: EarlyEviction) -> None:
        """The supervisor carried out `eviction`."""
        self.record.actions[(eviction.run_id, eviction.rung)] = "evicted"
        write_asha(self.experiment, self.record)

    def _due_evictions(self) -> list[EarlyEviction]:
        """Stops not yet carried out; those with nothing to do are marked done here."""
        due: list[EarlyEviction] = []
        for result in self.record.results:
            key = (result.run_id, result.rung)
            if result.decision != "stop" or key in self.record.actions:
                continue
            run = layout.run_dir(self.experiment, result.run_id)
            if run_control.read_eviction(run) is not None:
                self.record.actions[key] = "already evicted"
            elif run_control.is_finished(run) or not run.is_dir():
                self.record.actions[key] = "finished" if run.is_dir() else "run deleted"
            else:
                reason = result.reason(self.spec.metric, self.spec.mode)
                due.append(EarlyEviction(result.run_id, result.rung, reason))
        return due

    # ---------------------------------------------------------------- reading a run

    def _read_new_records(self, followed: _FollowedRun) -> None:
        restarts = followed.metrics.restarts
        lines = followed.metrics.read()
        if followed.metrics.restarts != restarts:
            # A new file (the run directory was replaced) or a truncated one: read afresh.
            followed.points.clear()
            followed.last_step = -1
        for line in lines:
            self._take_record(line, followed)

    def _take_record(self, line: bytes, followed: _FollowedRun) -> None:
        record = parse_record(line)
        if record is None or not isinstance(record.get("step"), int):
            return
        followed.last_step = max(followed.last_step, record["step"])
        point = metric_point(record, self.spec.metric)
        if point is not None:
            followed.points.append(point)

    def _max_steps(self, run: Path, followed: _FollowedRun) -> int | None:
        path = layout.orch_config_path(run)
        try:
            stat = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        signature = (stat.st_mtime_ns, stat.st_size)
        if signature != followed.config_signature:
            followed.config_signature = signature
            try:
                followed.max_steps = load_orchestrator_config(path).max_steps
            except (ConfigError, OSError):
                followed.max_steps = None
        return followed.max_steps

    def _warn_if_metric_missing(self, run_id: str, followed: _FollowedRun, max_steps: int) -> None:
        rungs = self.spec.rung_steps(max_steps)
        if not rungs or followed.points or run_id in self._warned:
            return
        # Records well past the first rung and none of the metric: a typo, or no eval.
        if followed.last_step >= 2 * rungs[0]:
            self._warned.add(run_id)
            log.warning(
                "%s: step %d and no %r in its metrics.jsonl yet: early stopping cannot judge "
                "it (is evaluation on? [sweep.scheduler] metric names the key to rank by)",
                run_id,
                followed.last_step,
                self.spec.metric,
            )

    def _log_decision(self, result: RungResult) -> None:
        if result.decision == "diverged":
            log.info(
                "%s: asha rung %d (step %d): diverged before it, counted there as the worst",
                result.run_id,
                result.rung,
                result.step,
            )
            return
        if result.decision == "stop":
            log.info("%s: %s", result.run_id, result.reason(self.spec.metric, self.spec.mode))
            return
        shown = "no value" if result.value is None else f"{self.spec.metric} {result.value:.4g}"
        rank = f", rank {result.rank}/{result.of}" if result.rank is not None else ""
        log.info(
            "%s: asha rung %d (step %d): %s%s: %s",
            result.run_id,
            result.rung,
            result.step,
            shown,
            rank,
            result.decision.replace("_", " "),
        )


def metric_point(record: dict, metric: str) -> MetricPoint | None:
    """A metrics record's value of `metric` at its step (and its time), or None when the
    record has no finite number for it. `record["step"]` must be an int."""
    value = record.get(metric)
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        return None
    stamp = record.get("time")
    when = float(stamp) if isinstance(stamp, int | float) else 0.0
    return MetricPoint(record["step"], float(value), when)


def describe(spec: AshaSpec, max_steps: int) -> str:
    """One line for logs and `workbench sweep plan`: what is ranked and where."""
    steps = spec.rung_steps(max_steps)
    where = ", ".join(str(s) for s in steps) if steps else f"none below max_steps {max_steps}"
    keep = f"top 1/{spec.reduction_factor}"
    return (
        f"asha on {spec.metric} ({spec.mode}), rungs at steps {where}; {keep} of the runs at "
        f"a rung go on once {spec.min_runs} have reached it"
    )


def _diverged_at(eviction: run_control.Eviction | None, followed: _FollowedRun) -> float | None:
    """When the run was evicted for divergence (unix seconds), or None if it was not: its
    `evicted_at`, else (a file written by hand) the time of its last record of the metric."""
    if eviction is None or not run_control.is_divergence(eviction.reason):
        return None
    when = unix_time(eviction.evicted_at)
    if when is None:
        when = followed.points[-1].time if followed.points else 0.0
    return when
