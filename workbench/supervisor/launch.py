"""The outside of the supervisor daemon: start one in its own session, stop one.

- `start_daemon` spawns `python -m workbench.supervisor` in a new session (so closing the
  terminal or the TUI never reaches it) and returns once it has written its state, or
  raises `SupervisorStartError` with the reason (already running, bad recipe, ...).
- `stop_experiment` stops it gracefully through the control socket (SIGTERM when the socket
  does not answer, SIGKILL as a last resort), then removes any child a dead supervisor
  left behind (`kill_leftovers`, process groups recorded in state.json).

`workbench up` as a whole (the recipe, the experiment directory, following it) is
`workbench.up`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from workbench.files import layout
from workbench.supervisor.client import (
    SupervisorClient,
    SupervisorError,
    read_state,
    running_supervisor_pid,
)
from workbench.supervisor.lifecycle import SupervisorStatus
from workbench.supervisor.process import family_members, stop_families
from workbench.system.file_tail import last_lines
from workbench.system.priority import run_as_batch
from workbench.system.procfs import process_cmdline, process_is_alive, read_stat

# Names the plan (MODULE:FUNCTION or FILE.py:FUNCTION) when no `plan` is passed; unset means
# the real one. For tests and development: `workbench up` then runs stand-ins.
PLAN_ENV = "WORKBENCH_SUPERVISOR_PLAN"
# Exit codes of `python -m workbench.supervisor` that the launcher explains.
EXIT_PLAN_FAILED = 2
EXIT_ALREADY_RUNNING = 3


class SupervisorStartError(Exception):
    """The supervisor did not start; the message says why and what to do."""


def already_running_message(experiment: Path, pid: int | None) -> str:
    who = f"pid {pid}" if pid else "pid unknown"
    return (
        f"experiment {experiment} already has a supervisor ({who}); attach with "
        f"`workbench attach {experiment}` or stop it with `workbench down {experiment}`"
    )


@dataclass
class StartedSupervisor:
    pid: int
    process: subprocess.Popen[bytes]


def start_daemon(
    experiment: Path,
    *,
    exit_when_done: bool = False,
    plan: str | None = None,
    timeout_s: float = 60.0,
) -> StartedSupervisor:
    """Start the experiment's supervisor in its own session; return once it runs.

    `plan` defaults to $WORKBENCH_SUPERVISOR_PLAN, then to the real plan.
    """
    experiment = Path(experiment).resolve()
    plan = plan or os.environ.get(PLAN_ENV) or None
    running = running_supervisor_pid(experiment)
    if running is not None:
        raise SupervisorStartError(already_running_message(experiment, running))
    log_path = layout.process_log_path(experiment, "supervisor")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "workbench.supervisor", "--experiment", str(experiment)]
    if exit_when_done:
        argv.append("--exit-when-done")
    if plan:
        argv += ["--plan", plan]
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    # Its bookkeeping is the experiment's work too: it yields to the user's terminal as
    # its children do (`workbench.system.priority`).
    run_as_batch(pid=process.pid)
    deadline = time.monotonic() + timeout_s
    while True:
        code = process.poll()
        state = read_state(experiment)
        ours = state is not None and state.get("pid") == process.pid
        if code is not None:
            if code == 0 and ours:  # it ran and was already done (nothing to train)
                return StartedSupervisor(process.pid, process)
            raise SupervisorStartError(
                _start_failure(experiment, code, state if ours else None, log_path)
            )
        if ours and state is not None and state.get("status") != SupervisorStatus.STOPPED:
            return StartedSupervisor(process.pid, process)
        if time.monotonic() >= deadline:
            process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
            raise SupervisorStartError(
                f"the supervisor did not start within {timeout_s:g}s; see {log_path}"
            )
        time.sleep(0.05)


def _start_failure(experiment: Path, code: int, state: dict | None, log_path: Path) -> str:
    if code == EXIT_ALREADY_RUNNING:
        return already_running_message(experiment, running_supervisor_pid(experiment))
    if state is not None and state.get("error"):
        return str(state["error"])
    tail = "\n".join(f"  {line}" for line in last_lines(log_path, 10))
    return f"the supervisor exited at once (exit code {code}); end of {log_path}:\n{tail}"


# ---------------------------------------------------------------- stopping


@dataclass
class StopReport:
    supervisor_pid: int | None
    graceful: bool = True
    leftovers: list[int] = field(default_factory=list)


def stop_experiment(experiment: Path, timeout_s: float = 300.0) -> StopReport:
    """Stop the supervisor and every child; nothing of the experiment runs afterwards.

    The graceful path is the control socket's stop_all (children get SIGTERM in order and
    time to checkpoint). A supervisor that does not answer gets SIGTERM, and SIGKILL after
    `timeout_s`. Children a dead supervisor left behind are stopped from state.json.
    """
    experiment = Path(experiment).resolve()
    client = SupervisorClient(experiment)
    pid = client.pid()
    report = StopReport(supervisor_pid=pid)
    if pid is not None:
        try:
            client.stop_all()
        except SupervisorError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        if not client.wait_until_stopped(timeout_s):
            report.graceful = False
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            client.wait_until_stopped(10.0)
    report.leftovers = kill_leftovers(experiment)
    if report.leftovers:
        report.graceful = False
    # Nothing of the experiment runs now: the temp files of activity records whose writer
    # was killed mid-write (a child of a killed supervisor, SIGKILLed above) are garbage
    # that no later process of the same name would otherwise find.
    layout.remove_staging(layout.busy_dir(experiment))
    return report


def kill_leftovers(experiment: Path, timeout_s: float = 10.0) -> list[int]:
    """Stop the process groups recorded in state.json whose supervisor is gone.

    Only call this when no supervisor runs for the experiment. A recorded pid counts only
    if it is still the process-group leader we started (every child leads its group; an
    orchestrator leads no session): pids are reused. That is the process
    that started at the recorded time (`start_ticks`, which survives exec: vLLM's server
    replaces `python -m workbench.inference` in the same process), or, for a state.json
    written without it, one with the recorded command line. Returns the leaders stopped.
    """
    state = read_state(experiment)
    if not state:
        return []
    leaders = []
    for record in (state.get("processes") or {}).values():
        pid = record.get("pid") if isinstance(record, dict) else None
        if not isinstance(pid, int) or pid <= 1 or pid == os.getpid():
            continue
        if not family_members(pid):
            continue
        if process_is_alive(pid) and not _is_the_recorded_leader(pid, record):
            continue
        leaders.append(pid)
    if leaders:
        stop_families(leaders, timeout_s)
    return leaders


def _is_the_recorded_leader(pid: int, record: dict) -> bool:
    stat = read_stat(pid)
    if stat is None or stat.pgrp != pid:
        return False
    start_ticks = record.get("start_ticks")
    if isinstance(start_ticks, int):
        return stat.start_ticks == start_ticks
    argv = record.get("argv") or []
    return not argv or _same_command(process_cmdline(pid), argv)


def _same_command(cmdline: list[str], argv: list[str]) -> bool:
    """Whether a /proc cmdline is `argv`; a `#!` script shows up as `interpreter script ...`."""
    if not cmdline or cmdline == argv:
        return bool(cmdline)
    if len(argv) > 1:
        return cmdline[-(len(argv) - 1) :] == argv[1:]
    return Path(cmdline[-1]).name == Path(argv[0]).name
