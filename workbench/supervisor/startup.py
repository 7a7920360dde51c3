"""What an experiment is doing while it starts: the one owner of the "startup phase".

The supervisor works out the phase every tick (`StartupTracker.observe`) from its fixed
processes in start order (inference, then the trainer), the built-in model's build
progress (`model_build.json`, `workbench.models.build_progress`) and the last line of the
starting process's log, and publishes it in state.json as `startup`. `workbench status`,
`workbench up --headless` and the TUI put it into words with `StartupPhase.describe(now)`:

    building model builtin:tiny-reverse: step 2/3, warm-up update 40 of 150 (loss 0.52), 12s
    starting inference: 43s, last line: INFO Started server process [4321]
    starting inference: exit code 1; restart 1 of 3 in 2.0s; last line: error: ...
    inference failed: gave up after 3 restarts (see logs/inference.log)
    ready: up after 52s

The seconds are worked out by the reader from `since`, so state.json changes only when
the phase, its step or the log line does. Once every fixed process is up the phase is
`ready`, which readers show as their normal status (the follow lines say it once).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from workbench.models.build_progress import BuildProgress, read_build_progress
from workbench.supervisor.lifecycle import UP_STATES, ProcessState
from workbench.system.clock import format_elapsed, now_iso, unix_time
from workbench.system.file_tail import last_lines
from workbench.system.procfs import process_is_alive

BUILDING = "building model"
STARTING = "starting"
FAILED = "failed"
READY = "ready"
PHASES = (BUILDING, STARTING, FAILED, READY)

# A log line longer than this is cut: one line of a terminal says enough.
LAST_LINE_CHARS = 160
# How far back the last line is looked for: a log tail costs what it shows.
_TAIL_BYTES = 16384
_TAIL_LINES = 8
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


@dataclass(frozen=True)
class StartupPhase:
    """One phase of startup, as state.json's `startup` holds it.

    phase: building model, starting, failed or ready.
    since: when its clock started (the build's first step, the process's start, the time
        every process became ready).
    process: the process it is about (None for a build and for ready).
    step, steps, detail: a build's step k of n and what it does; for a process, why it
        waits (backoff, failure); for ready, how long startup took.
    last_line: the last line of the process's log.
    """

    phase: str
    since: str | None = None
    process: str | None = None
    step: int | None = None
    steps: int | None = None
    detail: str | None = None
    last_line: str | None = None
    model: str | None = None

    @property
    def ready(self) -> bool:
        return self.phase == READY

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, record: Any) -> StartupPhase | None:
        """The phase a state.json's `startup` holds; None when absent or malformed."""
        if not isinstance(record, dict) or record.get("phase") not in PHASES:
            return None
        fields = {name: record.get(name) for name in cls.__dataclass_fields__}
        for name in ("step", "steps"):
            if not isinstance(fields[name], int) or isinstance(fields[name], bool):
                fields[name] = None
        for name in ("since", "process", "detail", "last_line", "model"):
            if not isinstance(fields[name], str):
                fields[name] = None
        if fields["phase"] in (STARTING, FAILED) and fields["process"] is None:
            return None  # about no process: nothing to say
        return cls(**fields)

    def elapsed_s(self, now: float) -> float | None:
        """Seconds since `since` at unix time `now`; None when it has no start."""
        started = unix_time(self.since)
        return None if started is None else max(0.0, now - started)

    def describe(self, now: float) -> str:
        """The phase in one line, with the time it has taken at unix time `now`."""
        elapsed = format_elapsed(self.elapsed_s(now))
        if self.phase == BUILDING:
            model = f" {self.model}" if self.model else ""
            parts = [f"step {self.step}/{self.steps}"] if self.steps else []
            parts += [self.detail] if self.detail else []
            return f"{BUILDING}{model}: {', '.join([*parts, elapsed])}"
        if self.phase == READY:
            return f"{READY}: {self.detail}" if self.detail else READY
        if self.phase == FAILED:
            return f"{self.process} {FAILED}: {self.detail or 'see its log'}"
        text = f"{STARTING} {self.process}: {self.detail or elapsed}"
        if self.last_line:
            # A detail holds "; " already (a backoff's reason): keep to its separator.
            text += f"{'; ' if self.detail else ', '}last line: {self.last_line}"
        return text


def startup_phase(state: dict[str, Any] | None) -> StartupPhase | None:
    """The startup phase a state.json holds, or None (an older supervisor, or stopping)."""
    return StartupPhase.from_json((state or {}).get("startup"))


# ---------------------------------------------------------------- the supervisor's side


@dataclass(frozen=True)
class ProcessFacts:
    """What the phase needs to know of one fixed process."""

    name: str
    state: ProcessState
    started_at: str | None
    reason: str | None
    log_path: Path
    ended_at: str | None = None  # its last exit, for the clock of a process in backoff


def phase_of(
    processes: Sequence[ProcessFacts],
    build: BuildProgress | None,
    last_line: Callable[[Path], str | None],
) -> StartupPhase | None:
    """The phase of a starting experiment; None when every process is up.

    A build in progress comes first (the process building it only looks "starting"); then
    the first process, in start order, that is not up: failed, or starting (spawned,
    waiting to start, or waiting out its backoff).
    """
    if build is not None:
        return StartupPhase(
            BUILDING,
            since=build.started_at,
            step=build.step or None,
            steps=build.steps or None,
            detail=build.what,
            model=build.model,
        )
    for proc in processes:
        if proc.state in UP_STATES:
            continue
        if proc.state == ProcessState.FAILED:
            return StartupPhase(FAILED, process=proc.name, detail=proc.reason)
        spawned = proc.state == ProcessState.STARTING
        return StartupPhase(
            STARTING,
            since=proc.started_at if spawned else proc.ended_at,
            process=proc.name,
            # A spawned process's reason is stale (kept from before it started).
            detail=None if spawned else proc.reason,
            last_line=last_line(proc.log_path),
        )
    return None


def last_log_line(path: Path) -> str | None:
    """The last line of a log with something to read: escape codes dropped, a progress
    bar's last redraw only, cut to `LAST_LINE_CHARS`."""
    for raw in reversed(last_lines(path, _TAIL_LINES, max_bytes=_TAIL_BYTES)):
        line = _ANSI.sub("", raw).rsplit("\r", 1)[-1]
        line = "".join(char for char in line if char.isprintable()).strip()
        if line:
            return line if len(line) <= LAST_LINE_CHARS else line[: LAST_LINE_CHARS - 3] + "..."
    return None


class StartupTracker:
    """The supervisor's memory of startup: when the processes were last all up, and since
    when they have not been (for "up after 52s")."""

    def __init__(self, experiment: Path, began_at: str):
        self.experiment = experiment
        self._began_at = began_at
        self._ready: StartupPhase | None = None

    def observe(self, processes: Sequence[ProcessFacts]) -> StartupPhase:
        if all(proc.state in UP_STATES for proc in processes):
            if self._ready is None:
                took = StartupPhase(READY, since=self._began_at).elapsed_s(time.time())
                self._ready = StartupPhase(
                    READY, since=now_iso(), detail=f"up after {format_elapsed(took)}"
                )
            return self._ready
        if self._ready is not None:  # a process went down: its start is timed anew
            self._ready = None
            self._began_at = now_iso()
        build = read_build_progress(self.experiment)
        if build is not None and not process_is_alive(build.pid):
            build = None  # left by a build that was killed
        phase = phase_of(processes, build, last_log_line)
        assert phase is not None
        return phase
