"""One supervised child process: spawn it in its own session, log it to a file, stop its group.

`ProcessSpec` says what to run (argv, env, cwd, log file, readiness check, restart policy);
`SupervisedProcess` is the mechanism around one spec: spawning, polling for its exit,
checking readiness and a non-blocking stop (SIGTERM to the whole process group, SIGKILL
after `stop_timeout_s`). Its state is its `Lifecycle` (`workbench.supervisor.lifecycle`):
the process reports what happened to its OS process (spawned, ready, exited) as events
and carries out the `terminate` the table asks for; the supervisor sends the others.

Every child leads a process group of its own, so a signal to its group reaches the
workers it spawned (torchrun's ranks, vLLM's engine) and a Ctrl-C in the user's terminal
never reaches it. vLLM and the trainer each lead a session too (`start_new_session`);
orchestrators share the supervisor's (`ProcessSpec.own_session`), because on Linux each
session is a scheduling group of its own (autogroup, `workbench.system.priority`): a session
per run would make the experiment weigh more against the user's TUI and shell with every
run added. Membership is read from /proc
(`workbench.system.procfs`), where zombies (dead, waiting to be reaped by someone else) do not
count as alive.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import shlex
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from workbench.supervisor.lifecycle import TERMINATE, Event, ExitFacts, Lifecycle, ProcessState
from workbench.supervisor.policy import RestartPolicy
from workbench.system import procfs
from workbench.system.clock import now_iso
from workbench.system.file_tail import last_lines
from workbench.system.priority import run_as_batch

LAST_LINES = 20
# Every exit record keeps its lines in state.json: a bound, whatever the lines are like.
LAST_LINES_MAX_BYTES = 16384
MAX_EXIT_RECORDS = 100
_READY_CHECK_INTERVAL_S = 0.5
# After SIGKILL, how long to wait for the group to vanish before giving up on it (a process
# in uninterruptible sleep cannot be killed; the supervisor must not hang on it forever).
_KILL_GRACE_S = 10.0


# ---------------------------------------------------------------- readiness checks


class Readiness(Protocol):
    """Whether a started process can serve the processes that wait for it."""

    def is_ready(self) -> bool: ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class HttpReady:
    """Ready when `GET url` answers 200 (vLLM's `/health`)."""

    url: str
    timeout_s: float = 0.5

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout_s) as response:
                return response.status == 200
        except (OSError, ValueError, http.client.HTTPException, urllib.error.URLError):
            return False

    def describe(self) -> str:
        return f"GET {self.url} answers 200"


@dataclass(frozen=True)
class FileReady:
    """Ready when `path` exists (a process that announces itself with a file)."""

    path: Path

    def is_ready(self) -> bool:
        return Path(self.path).exists()

    def describe(self) -> str:
        return f"{self.path} exists"


# ---------------------------------------------------------------- spec and exit record


@dataclass
class ProcessSpec:
    """What the supervisor runs for one process, and how it looks after it.

    name: unique process name (`inference`, `trainer`, a run id).
    kind: `inference`, `trainer`, `orchestrator`, or anything else for stand-ins; the
        supervisor stops orchestrators first, then the others in reverse start order.
    env: variables added to the supervisor's own environment.
    readiness: None means the process is usable as soon as it runs.
    requires_ready: names of processes that must be ready (or running) before this starts.
    preflight: returns why the process cannot start (a missing module), or None.
    exit_cause: given its log and where this start's lines begin, what its log says ended it
        (vLLM's engine error), or None; an exit with a cause is a failure, even with status 0.
    own_session: start it in a session of its own (True) or only in a process group of its
        own inside the supervisor's session (False: orchestrators, so that the experiment is a
        handful of autogroups whatever the number of runs).
    """

    name: str
    argv: list[str]
    log_path: Path
    kind: str = "process"
    run_id: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    readiness: Readiness | None = None
    ready_timeout_s: float = 600.0
    requires_ready: tuple[str, ...] = ()
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    stop_timeout_s: float = 10.0
    preflight: Callable[[], str | None] | None = None
    exit_cause: Callable[[Path, int], str | None] | None = None
    own_session: bool = True


def describe_exit(
    code: int | None, signal_number: int | None, error: str | None, cause: str | None = None
) -> str:
    """How a process ended, in the words of logs, state.json reasons, `workbench status` and
    the TUI: the error that kept it from starting, "killed by SIGKILL", or "exit code 1",
    after what its log says ended it when it says (`vLLM's engine died: ... (exit code 0)`)."""
    if error:
        return error
    if signal_number is not None:
        try:
            how = f"killed by {signal.Signals(signal_number).name}"
        except ValueError:
            how = f"killed by signal {signal_number}"
    else:
        how = f"exit code {code}"
    return f"{cause} ({how})" if cause else how


@dataclass
class ExitRecord:
    """One exit of a process: exit code or signal, when, and, for a crash or a stop that
    had to be forced, the end of its log."""

    time: str
    code: int | None
    signal: int | None
    last_lines: list[str]
    stop_requested: bool = False  # the supervisor asked it to stop (not a crash)
    error: str | None = None  # it could not be started at all
    cause: str | None = None  # what its log says ended it (`ProcessSpec.exit_cause`)

    @property
    def ok(self) -> bool:
        return self.code == 0 and self.error is None and self.cause is None

    def describe(self) -> str:
        return describe_exit(self.code, self.signal, self.error, self.cause)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------- the supervised process


class SupervisedProcess:
    """The live side of a `ProcessSpec`: its OS process, its lifecycle, restarts and exits.

    Never blocks: `poll` and `handle` return at once, and the supervisor's loop calls
    `poll` until a stop is complete. All attributes are read by the supervisor to decide
    what comes next and to write state.json.
    """

    def __init__(self, spec: ProcessSpec):
        self.spec = spec
        self.lifecycle = Lifecycle(spec.restart, spec.log_path)
        self.pid: int | None = None
        self.restarts = 0
        self.started_at: str | None = None
        # When the kernel started it (clock ticks since boot): with the pid, what names
        # this process for a later `workbench down`, through exec (vLLM replaces
        # `python -m workbench.inference`) and despite pid reuse.
        self.start_ticks: int | None = None
        self.exits: list[ExitRecord] = []
        self._popen: subprocess.Popen[bytes] | None = None
        self._spawn_count = 0
        self._started_monotonic = 0.0
        self._terminating = False
        self._stop_deadline = 0.0
        self._killed = False
        self._next_ready_check = 0.0
        self._log_start = 0  # where the current start's lines begin in its log

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def state(self) -> ProcessState:
        return self.lifecycle.state

    @property
    def reason(self) -> str | None:
        return self.lifecycle.reason

    @property
    def held(self) -> bool:
        return self.lifecycle.held

    @property
    def has_os_process(self) -> bool:
        return self._popen is not None

    def handle(self, event: Event, now: float, reason: str | None = None) -> None:
        """Pass `event` to the lifecycle and carry out what it asks of the OS process."""
        if TERMINATE in self.lifecycle.handle(event, now, reason):
            self._terminate(now)

    def exited(self, facts: ExitFacts, now: float) -> Event:
        """Pass the exit `poll` returned, with what the supervisor knows, to the lifecycle."""
        return self.lifecycle.exited(facts, now)

    # -------------------------------------------------------------- start

    def spawn(self, now: float) -> ExitRecord | None:
        """Start the process; on failure to start, return the exit record saying why."""
        spec = self.spec
        problem = spec.preflight() if spec.preflight else None
        if problem is None and not spec.argv:
            problem = "empty command line"
        if problem is not None:
            self._append_log(f"cannot start {spec.name}: {problem}", create=True)
            return self._failed_start(problem, now)
        attempt = self._spawn_count + 1
        self._append_log(
            f"starting {spec.name} (attempt {attempt}): {shlex.join(spec.argv)}", create=True
        )
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **spec.env}
        try:
            with open(spec.log_path, "ab") as log:
                self._log_start = log.tell()
                self._popen = subprocess.Popen(
                    spec.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=spec.cwd,
                    env=env,
                    start_new_session=spec.own_session,
                    process_group=None if spec.own_session else 0,
                    close_fds=True,
                )
        except OSError as err:
            problem = f"cannot run {spec.argv[0]!r}: {err.strerror or err}"
            self._append_log(f"cannot start {spec.name}: {problem}")
            return self._failed_start(problem, now)
        # Batch work from its first import on; a child in a session of its own has an
        # autogroup of its own too, raised with it (`workbench.system.priority`).
        run_as_batch(pid=self._popen.pid)
        if self._spawn_count:
            self.restarts += 1
        self._spawn_count = attempt
        self.pid = self._popen.pid
        self.started_at = now_iso()
        stat = procfs.read_stat(self.pid)
        self.start_ticks = stat.start_ticks if stat is not None else None
        self._started_monotonic = now
        self._terminating = False
        self._killed = False
        self._next_ready_check = now
        self.handle(Event.SPAWNED if spec.readiness is not None else Event.SPAWNED_UNCHECKED, now)
        return None

    def _failed_start(self, problem: str, now: float) -> ExitRecord:
        record = self._record(ExitRecord(now_iso(), None, None, [], error=problem))
        self.handle(Event.SPAWN_FAILED, now, problem)
        return record

    # -------------------------------------------------------------- readiness

    def check_ready(self, now: float) -> bool:
        """True when this call saw the readiness check pass (the `ready` event)."""
        if self.state != ProcessState.STARTING or self.spec.readiness is None:
            return False
        if now < self._next_ready_check:
            return False
        self._next_ready_check = now + _READY_CHECK_INTERVAL_S
        if self.spec.readiness.is_ready():
            self.handle(Event.READY, now)
            return True
        return False

    def ready_overdue(self, now: float) -> bool:
        return (
            self.state == ProcessState.STARTING
            and now - self._started_monotonic > self.spec.ready_timeout_s
        )

    # -------------------------------------------------------------- exit and stop

    def poll(self, now: float) -> ExitRecord | None:
        """Reap the process if it exited (and, when stopping, its whole group is gone)."""
        if self._popen is None:
            return None
        code = self._popen.poll()
        if self._terminating:
            if code is None or family_members(self._popen.pid):
                if now >= self._stop_deadline and not self._killed:
                    self._append_log(
                        f"{self.spec.name} still running {self.spec.stop_timeout_s:g}s after "
                        "SIGTERM: sending SIGKILL to its process group"
                    )
                    signal_family(self._popen.pid, signal.SIGKILL)
                    self._killed = True
                if code is None or now < self._stop_deadline + _KILL_GRACE_S:
                    return None
            return self._finish(code, stop_requested=True)
        if code is None:
            return None
        # The leader exited by itself. Whatever it left in its group (torchrun's ranks,
        # vLLM's engine) is useless without it and may hold ports or GPU memory.
        signal_family(self._popen.pid, signal.SIGKILL)
        return self._finish(code, stop_requested=False)

    def _terminate(self, now: float) -> None:
        """SIGTERM to the whole group now; `poll` sends SIGKILL after the stop timeout."""
        if self._popen is None or self._terminating:
            return
        self._terminating = True
        self._stop_deadline = now + self.spec.stop_timeout_s
        signal_family(self._popen.pid, signal.SIGTERM)

    def kill_now(self) -> None:
        """SIGKILL the whole group at once (the supervisor itself is dying)."""
        if self._popen is not None:
            signal_family(self._popen.pid, signal.SIGKILL)

    def _finish(self, code: int | None, *, stop_requested: bool) -> ExitRecord:
        assert self._popen is not None
        signal_number = -code if code is not None and code < 0 else None
        exit_code = code if code is not None and code >= 0 else None
        self._popen = None
        self.pid = None
        self.start_ticks = None
        self._terminating = False
        cause = None
        if self.spec.exit_cause is not None and not stop_requested:
            cause = self.spec.exit_cause(self.spec.log_path, self._log_start)
        # The end of the log explains a crash, or a stop that had to be forced; a clean
        # exit or an obeyed stop explains nothing, and a sweep ends hundreds of
        # orchestrators so: state.json, rewritten at every change and read by every
        # client, stays small.
        explained = (exit_code == 0 and cause is None) or (stop_requested and not self._killed)
        record = ExitRecord(
            time=now_iso(),
            code=exit_code,
            signal=signal_number,
            last_lines=[]
            if explained
            else last_lines(self.spec.log_path, LAST_LINES, max_bytes=LAST_LINES_MAX_BYTES),
            stop_requested=stop_requested,
            cause=cause,
        )
        self._append_log(f"{self.spec.name} ended: {record.describe()}")
        return self._record(record)

    def _record(self, record: ExitRecord) -> ExitRecord:
        self.exits.append(record)
        del self.exits[:-MAX_EXIT_RECORDS]
        return record

    def _append_log(self, message: str, *, create: bool = False) -> None:
        # The supervisor's own lines in a child's log explain restarts to whoever reads it.
        # Only a start creates the log's directory: recreating it after an exit would
        # bring back a run directory that the user just deleted.
        with contextlib.suppress(OSError):
            if create:
                self.spec.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.spec.log_path, "a", encoding="utf-8") as log:
                log.write(f"[workbench supervisor {now_iso()}] {message}\n")

    # -------------------------------------------------------------- state.json

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.spec.name,
            "kind": self.spec.kind,
            "run_id": self.spec.run_id,
            "state": self.state,
            "pid": self.pid,
            "restarts": self.restarts,
            "started_at": self.started_at,
            "start_ticks": self.start_ticks,
            "log": str(self.spec.log_path),
            "reason": self.reason,
            "argv": list(self.spec.argv),
            "exits": [record.to_json() for record in self.exits],
        }


# ---------------------------------------------------------------- process families


def _family_stats(leader: int) -> list[procfs.ProcStat] | None:
    """Live processes in the process group or the session that `leader` started; None
    when /proc cannot be read."""
    stats = procfs.all_stats()
    if stats is None:
        return None
    return [
        stat
        for stat in stats
        if not stat.exited and (stat.pgrp == leader or stat.session == leader)
    ]


def family_members(leader: int) -> list[int]:
    """Live processes in the process group or the session that `leader` started."""
    stats = _family_stats(leader)
    if stats is None:  # no /proc: ask the kernel about the group alone
        try:
            os.killpg(leader, 0)
            return [leader]
        except (ProcessLookupError, PermissionError):
            return []
    return [stat.pid for stat in stats]


def signal_family(leader: int, sig: int) -> None:
    """Send `sig` to the group of `leader`, and to anything that left the group but not
    the session (a worker that called setpgid). Each process gets the signal once: a
    second SIGTERM can land while Python is exiting and kill it with the default action."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(leader, sig)
    for stat in _family_stats(leader) or []:
        if stat.pgrp != leader:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(stat.pid, sig)


def stop_families(leaders: list[int], timeout_s: float) -> list[int]:
    """Blocking stop of several process families: SIGTERM, then SIGKILL after `timeout_s`.

    For cleaning up after a supervisor that is gone. Returns the pids still alive at the
    end (normally none).
    """
    for leader in leaders:
        signal_family(leader, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    killed = False
    while True:
        alive = [pid for leader in leaders for pid in family_members(leader)]
        if not alive:
            return []
        now = time.monotonic()
        if now >= deadline:
            if killed:
                return alive
            for leader in leaders:
                signal_family(leader, signal.SIGKILL)
            killed = True
            deadline = now + 5.0
        time.sleep(0.05)
