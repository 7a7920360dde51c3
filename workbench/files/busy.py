"""Where a process's time goes: what it is doing now, and a rolling record of it.

A process that works with another side (the trainer waits for rollouts, an orchestrator
for an adapter or for vLLM's completions) marks what it is doing: `with doing("update"):`
or `with waiting_for("rollouts"):`. Marks nest: the innermost is the process's activity
until it ends, then the one around it resumes. From the process's start (as /proc knows
it) until `ready(...)` names its usual activity, it is starting up. Every activity is of
one kind: `busy` (its own work: an orchestrator's generation, the trainer's update),
`waiting` (for the other side) or `starting`.

The record (the activities that ended in the last `window_s` seconds, the current one, and
every activity's seconds since the process started) goes atomically to the experiment's
`busy/<process>.json` (`layout.busy_path`), at most once a second and at `flush()`.
`WORKBENCH_BUSY_WINDOW_S` widens the window: `bench e2e --vs separate` keeps whole runs.
Only processes that called `record_to` record; in any other (tests, the trainer's other
ranks) the marks cost nothing. A recording process also keeps every activity it ended, as
a span appended to `spans/<process>.jsonl` with each write (`workbench.files.spans`:
`workbench trace` reads them).

The readers (`workbench status --json`, the TUI's processes pane, the benchmark) use the
pure functions below: intervals -> shares of a window. vLLM keeps no record of its own;
it is seen from the orchestrators' requests: busy while any of them waits on a generation.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.files import layout, spans
from workbench.system.file_change import OnFileChange
from workbench.system.procfs import process_is_alive, process_started_at

BUSY, WAITING, STARTING = "busy", "waiting", "starting"
KINDS = (BUSY, WAITING, STARTING)
WINDOW_S = 60.0
WINDOW_ENV = "WORKBENCH_BUSY_WINDOW_S"
WRITE_EVERY_S = 1.0
GENERATION = "generation"  # the orchestrator's activity that is vLLM's work
INFERENCE = "inference"  # the process name vLLM has in the supervisor's state


@dataclass(frozen=True)
class Interval:
    label: str
    kind: str
    start: float  # unix seconds
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


# ---------------------------------------------------------------- accounting (pure)


def clipped(intervals: Iterable[Interval], start: float, end: float) -> list[Interval]:
    """The parts of `intervals` inside [start, end]."""
    parts = []
    for interval in intervals:
        lo, hi = max(interval.start, start), min(interval.end, end)
        if hi > lo:
            parts.append(Interval(interval.label, interval.kind, lo, hi))
    return parts


def shares(
    intervals: Iterable[Interval], start: float, end: float, *, by: str = "kind"
) -> dict[str, float]:
    """The fraction of [start, end] each kind (or `by="label"`, each activity) covers; the
    intervals of one process do not overlap, so the fractions add up to at most 1."""
    if end <= start:
        return {}
    totals: dict[str, float] = {}
    for part in clipped(intervals, start, end):
        key = part.kind if by == "kind" else part.label
        totals[key] = totals.get(key, 0.0) + part.seconds
    return {key: seconds / (end - start) for key, seconds in totals.items()}


def covered_share(intervals: Iterable[Interval], start: float, end: float) -> float:
    """The fraction of [start, end] covered by at least one interval (they may overlap:
    several orchestrators' requests to one server)."""
    if end <= start:
        return 0.0
    covered, reach = 0.0, start
    for part in sorted(clipped(intervals, start, end), key=lambda i: i.start):
        if part.end > reach:
            covered += part.end - max(part.start, reach)
            reach = part.end
    return covered / (end - start)


# ---------------------------------------------------------------- the record


@dataclass(frozen=True)
class BusyRecord:
    """One process's file: its recent activities, the current one and its totals."""

    process: str
    pid: int | None
    started_at: float
    written_at: float
    window_s: float
    current: Interval  # its end is `written_at`: as far as the file knows
    intervals: tuple[Interval, ...]  # ended ones, oldest first
    totals: dict[str, tuple[str, float]]  # label -> (kind, seconds), the current one included

    def intervals_until(self, end: float) -> list[Interval]:
        """The ended activities and the current one, taken to last until `end`."""
        current = Interval(self.current.label, self.current.kind, self.current.start, end)
        return [*self.intervals, current]

    def to_json(self) -> dict[str, Any]:
        return {
            "process": self.process,
            "pid": self.pid,
            "started_at": self.started_at,
            "written_at": self.written_at,
            "window_s": self.window_s,
            "current": {
                "label": self.current.label,
                "kind": self.current.kind,
                "since": self.current.start,
            },
            "intervals": [[i.label, i.kind, i.start, i.end] for i in self.intervals],
            "totals": {
                label: {"kind": kind, "seconds": seconds}
                for label, (kind, seconds) in self.totals.items()
            },
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BusyRecord:
        written_at = float(data["written_at"])
        current = data["current"]
        return cls(
            process=str(data["process"]),
            pid=data.get("pid") if isinstance(data.get("pid"), int) else None,
            started_at=float(data["started_at"]),
            written_at=written_at,
            window_s=float(data["window_s"]),
            current=Interval(
                str(current["label"]), str(current["kind"]), float(current["since"]), written_at
            ),
            intervals=tuple(
                Interval(str(label), str(kind), float(start), float(end))
                for label, kind, start, end in data["intervals"]
            ),
            totals={
                str(label): (str(entry["kind"]), float(entry["seconds"]))
                for label, entry in data["totals"].items()
            },
        )


def write_record(path: Path, record: BusyRecord) -> None:
    layout.atomic_write_text(path, json.dumps(record.to_json()))


def read_record(path: Path) -> BusyRecord | None:
    """The record at `path`, or None when there is none (or it cannot be read)."""
    try:
        return BusyRecord.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def recent_summary(record: BusyRecord, end: float) -> dict[str, Any]:
    """Shares of the process's last window up to `end`: by kind, and by activity."""
    start = max(end - record.window_s, record.started_at)
    intervals = record.intervals_until(end)
    return {
        "window_s": round(end - start, 1),
        **{kind: round(shares(intervals, start, end).get(kind, 0.0), 3) for kind in KINDS},
        "activities": _rounded(shares(intervals, start, end, by="label")),
    }


def whole_run_summary(record: BusyRecord) -> dict[str, Any]:
    """Shares of the process's whole life as its last write knows it, from its totals."""
    life = record.written_at - record.started_at
    if life <= 0:
        return {"seconds": 0.0, **dict.fromkeys(KINDS, 0.0), "activities": {}}
    by_kind: dict[str, float] = {}
    for kind, seconds in record.totals.values():
        by_kind[kind] = by_kind.get(kind, 0.0) + seconds
    return {
        "seconds": round(life, 1),
        **{kind: round(by_kind.get(kind, 0.0) / life, 3) for kind in KINDS},
        "activities": _rounded(
            {label: seconds / life for label, (_, seconds) in record.totals.items()}
        ),
    }


def inference_summary(records: Iterable[BusyRecord], start: float, end: float) -> dict[str, Any]:
    """vLLM as the orchestrators see it: the share of [start, end] in which at least one of
    them waited on a generation."""
    generations = [
        interval
        for record in records
        for interval in record.intervals_until(min(end, record.written_at))
        if interval.label == GENERATION
    ]
    share = covered_share(generations, start, end)
    return {"window_s": round(end - start, 1), BUSY: round(share, 3), "activities": {}}


def _rounded(values: dict[str, float]) -> dict[str, float]:
    return {key: round(value, 3) for key, value in sorted(values.items())}


class BusyReader:
    """Every busy record of an experiment, each file parsed again only when it changes:
    the TUI asks every second."""

    def __init__(self, experiment: Path) -> None:
        self.experiment = experiment
        self._files: dict[Path, OnFileChange[BusyRecord | None]] = {}
        # The record of each file at the last look: kept for the files that the change feed
        # say did not change.
        self._records: dict[Path, BusyRecord | None] | None = None
        # The summaries of processes that had ended, by process: they hold while the file
        # does not change (the same record object), so a sweep's hundreds of finished
        # orchestrators cost the TUI's poll a stat each, not a summary each.
        self._ended: dict[str, tuple[BusyRecord, dict[str, Any]]] = {}

    def records(self, changed: AbstractSet[str] | None = None) -> dict[str, BusyRecord]:
        """Every process's record. `changed`: the names of the files in `busy/` that may
        have changed since the last call, as the change feed tells
        (`workbench.files.experiment_changes`); the others are not even `stat`ed. None: any."""
        directory = layout.busy_dir(self.experiment)
        known = self._records
        if changed is None or known is None:
            try:
                paths = sorted(directory.glob("*.json"))
            except OSError:
                paths = []
            looked_at = set(paths)
        else:
            looked_at = {
                directory / name
                for name in changed
                if name.endswith(".json") and not name.startswith(".")
            }
            paths = [*known, *(path for path in looked_at if path not in known)]
        current: dict[Path, BusyRecord | None] = {}
        for path in paths:
            if known is not None and path not in looked_at:
                current[path] = known[path]
                continue
            file = self._files.setdefault(path, OnFileChange(path, lambda p=path: read_record(p)))
            record = file.get()
            if record is None and not path.exists():
                continue  # gone
            current[path] = record
        for gone in set(self._files) - set(current):
            del self._files[gone]
        self._records = current
        return {record.process: record for record in current.values() if record is not None}

    def recent(
        self, now: float, changed: AbstractSet[str] | None = None
    ) -> dict[str, dict[str, Any]]:
        """Each recording process's recent shares, up to now while it runs (else to its last
        write), and vLLM's (`inference`) from the orchestrators' generations of the same
        window. `changed` as for `records`."""
        records = self.records(changed)
        summaries, alive = {}, set()
        for name, record in records.items():
            ended = self._ended.get(name)
            if ended is not None and ended[0] is record:
                summaries[name] = ended[1]
                continue
            if record.pid is not None and process_is_alive(record.pid):
                alive.add(name)
                summaries[name] = recent_summary(record, now)
            else:
                summaries[name] = recent_summary(record, record.written_at)
                self._ended[name] = (record, summaries[name])
        for gone in set(self._ended) - set(records):
            del self._ended[gone]
        orchestrators = [r for name, r in records.items() if layout.is_run_dir_name(name)]
        if orchestrators:
            end = min(now, max(r.written_at for r in orchestrators))
            if any(r.process in alive for r in orchestrators):
                end = now
            start = max(end - WINDOW_S, min(r.started_at for r in orchestrators))
            # Only those that wrote within the window can have generated in it.
            recent = [r for r in orchestrators if r.written_at >= start or r.process in alive]
            summaries[INFERENCE] = inference_summary(recent, start, end)
        return summaries


# ---------------------------------------------------------------- recording


class Recorder:
    """Keeps one process's activities and writes its record (see the module docstring)."""

    def __init__(
        self,
        path: Path,
        process: str,
        *,
        started_at: float,
        window_s: float = WINDOW_S,
        clock=time.time,
        span_log: spans.SpanLog | None = None,
    ) -> None:
        self.path = path
        self.span_log = span_log  # where each ended activity goes, whole
        self.process = process
        self.window_s = window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._started_at = started_at
        self._stack: list[tuple[str, str]] = [(STARTING, STARTING)]
        self._since = started_at
        self._ended: deque[Interval] = deque()
        self._totals: dict[str, tuple[str, float]] = {}
        self._written_at = 0.0

    def ready(self, label: str, kind: str) -> None:
        """Starting up is over: `label` is what the process does when no mark says else."""
        with self._lock:
            self._switch(lambda: self._stack.__setitem__(0, (label, kind)))

    def push(self, label: str, kind: str) -> None:
        with self._lock:
            self._switch(lambda: self._stack.append((label, kind)))

    def pop(self) -> None:
        with self._lock:
            if len(self._stack) > 1:
                self._switch(self._stack.pop)

    def snapshot(self) -> BusyRecord:
        with self._lock:
            return self._snapshot(self._clock())

    def flush(self) -> None:
        """Write the record now."""
        record = self.snapshot()
        with contextlib.suppress(OSError):  # a full disk must not stop training
            write_record(self.path, record)
            self._written_at = record.written_at
        if self.span_log is not None:
            self.span_log.write()

    def _switch(self, change) -> None:
        now = self._clock()
        label, kind = self._stack[-1]
        change()
        if self._stack[-1] == (label, kind):
            return  # the same activity goes on
        self._end(Interval(label, kind, self._since, now))
        self._since = now
        if now - self._written_at >= WRITE_EVERY_S:
            record = self._snapshot(now)
            with contextlib.suppress(OSError):
                write_record(self.path, record)
                self._written_at = now
            if self.span_log is not None:
                self.span_log.write()

    def _end(self, interval: Interval) -> None:
        if interval.end <= interval.start:
            return
        kind, seconds = self._totals.get(interval.label, (interval.kind, 0.0))
        self._totals[interval.label] = (kind, seconds + interval.seconds)
        if self.span_log is not None:
            self.span_log.add(
                spans.Span(interval.label, interval.kind, interval.start, interval.end)
            )
        self._ended.append(interval)
        while self._ended and self._ended[0].end < interval.end - self.window_s:
            self._ended.popleft()

    def _snapshot(self, now: float) -> BusyRecord:
        label, kind = self._stack[-1]
        current = Interval(label, kind, self._since, now)
        totals = dict(self._totals)
        seconds = totals.get(label, (kind, 0.0))[1]
        totals[label] = (totals.get(label, (kind, 0.0))[0], seconds + current.seconds)
        return BusyRecord(
            process=self.process,
            pid=os.getpid(),
            started_at=self._started_at,
            written_at=now,
            window_s=self.window_s,
            current=current,
            intervals=tuple(self._ended),
            totals=totals,
        )


_recorder: Recorder | None = None


def record_to(experiment: Path, process: str) -> Recorder:
    """Record this process's activities into the experiment's `busy/<process>.json`; the
    record is written once more at a normal exit (`os._exit` skips that: `flush()` first)."""
    global _recorder
    started_at = process_started_at(os.getpid()) or time.time()
    try:
        window_s = float(os.environ.get(WINDOW_ENV, WINDOW_S))
    except ValueError:
        window_s = WINDOW_S
    _recorder = Recorder(
        layout.busy_path(experiment, process),
        process,
        started_at=started_at,
        window_s=window_s,
        span_log=spans.record_to(experiment, process),
    )
    _recorder.flush()
    atexit.register(flush)
    return _recorder


def ready(label: str, kind: str = BUSY) -> None:
    if _recorder is not None:
        _recorder.ready(label, kind)


@contextlib.contextmanager
def doing(label: str, kind: str = BUSY) -> Iterator[None]:
    """Mark the block as the process's activity `label` (its own work, by default)."""
    if _recorder is None:
        yield
        return
    _recorder.push(label, kind)
    try:
        yield
    finally:
        _recorder.pop()


def waiting_for(what: str) -> contextlib.AbstractContextManager[None]:
    """Mark the block as waiting for the other side: `waiting for <what>`."""
    return doing(f"waiting for {what}", WAITING)


def flush() -> None:
    """Write the record now (at exit: the last seconds count too)."""
    if _recorder is not None:
        _recorder.flush()


# ---------------------------------------------------------------- a whole experiment


def experiment_breakdown(
    records: dict[str, BusyRecord], inference_started_at: float | None = None
) -> dict[str, Any]:
    """Where an experiment's time went, each process's whole life from its record: the
    trainer's shares, the orchestrators' (their mean), and vLLM's as the orchestrators saw
    it: starting from its own start (`inference_started_at`, when known) until the first
    orchestrator started (they start once it answers), then busy while any orchestrator
    waited on a generation. Whole runs need records whose window holds them
    (`WORKBENCH_BUSY_WINDOW_S`)."""
    breakdown: dict[str, Any] = {}
    if "trainer" in records:
        breakdown["trainer"] = whole_run_summary(records["trainer"])
    orchestrators = [r for name, r in records.items() if layout.is_run_dir_name(name)]
    if not orchestrators:
        return breakdown
    breakdown["orchestrators"] = mean_summary([whole_run_summary(r) for r in orchestrators])
    ready = min(r.started_at for r in orchestrators)
    start = ready if inference_started_at is None else min(inference_started_at, ready)
    end = max(r.written_at for r in records.values())
    if end > start:
        generations = [
            interval
            for record in orchestrators
            for interval in record.intervals_until(record.written_at)
            if interval.label == GENERATION
        ]
        busy_s = covered_share(generations, ready, end) * (end - ready)
        breakdown[INFERENCE] = {
            "seconds": round(end - start, 1),
            BUSY: round(busy_s / (end - start), 3),
            WAITING: round((end - ready - busy_s) / (end - start), 3),
            STARTING: round((ready - start) / (end - start), 3),
            "activities": {GENERATION: round(busy_s / (end - start), 3)},
        }
    return breakdown


def mean_summary(summaries: list[dict[str, Any]], counted: str = "processes") -> dict[str, Any]:
    """The mean of several summaries (of processes, or of experiments: `counted` names the
    count), kind by kind and activity by activity."""
    if not summaries:
        return {}
    count = len(summaries)
    labels = sorted({label for s in summaries for label in s.get("activities", {})})
    return {
        counted: count,
        "seconds": round(sum(s.get("seconds", 0.0) for s in summaries) / count, 1),
        **{kind: round(sum(s.get(kind, 0.0) for s in summaries) / count, 3) for kind in KINDS},
        "activities": {
            label: round(sum(s["activities"].get(label, 0.0) for s in summaries) / count, 3)
            for label in labels
        },
    }
