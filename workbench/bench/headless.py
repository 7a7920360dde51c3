"""Running `workbench up RECIPE --headless` for a benchmark: wall time and CPU-seconds.

The clock starts just before `up` is launched and stops when it exits, so it covers all
a user waits for (vLLM and trainer start, every run to its end). CPU-seconds are the
user + system time of every process of the experiment: `up`, the supervisor it starts
and waits for, and everything below (vLLM and its engine, torchrun and its ranks, the
orchestrators). They are read with getrusage(RUSAGE_CHILDREN) before and after: the kernel
adds a process's times, and those of the descendants it reaped, to its parent's when the
parent reaps it, so the chain up -> supervisor -> children sums the whole tree. A process
orphaned on the way (its parent gone first) would leave the chain; while the experiment
runs, this process is made the "child subreaper" (Linux prctl) so that orphans come to it,
and it reaps them afterwards so their time counts too.

The machine's busy CPU time over the same interval (/proc/stat) is read as well: what it
has beyond the experiment's own is other processes' work, which slowed the experiment
down (a wall time measured beside someone else's test suite is not the experiment's).
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from workbench.procfs import child_pids

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
ORPHAN_REAP_S = 10.0  # how long orphans may take to exit after `up` did


@dataclass(frozen=True)
class HeadlessRun:
    command: list[str]  # as a user would type it
    started_at: float  # unix time just before the launch
    exit_code: int
    timed_out: bool
    wall_s: float
    cpu_s: float | None  # None where the process tree cannot be accounted (not Linux)
    unreaped: int  # descendants still running when accounting stopped (their time is missing)
    machine_busy_s: float | None = None  # every process's CPU time meanwhile (/proc/stat)

    @property
    def foreign_cpu_s(self) -> float | None:
        """CPU time other processes took while the experiment ran."""
        if self.cpu_s is None or self.machine_busy_s is None:
            return None
        return max(0.0, self.machine_busy_s - self.cpu_s)


def run_up_headless(
    recipe: Path, cwd: Path, *, max_steps: int | None = None, timeout_s: float
) -> HeadlessRun:
    """`workbench up RECIPE --headless [--max-steps N]` in `cwd`; Ctrl-C (SIGINT) stops it
    gracefully after `timeout_s`, as a user would."""
    command = [sys.executable, "-m", "workbench.cli", "up", str(recipe), "--headless"]
    if max_steps is not None:
        command += ["--max-steps", str(max_steps)]
    run = run_accounted(command, cwd, timeout_s=timeout_s)
    return replace(run, command=["workbench", *command[3:]])


def run_accounted(command: list[str], cwd: Path, *, timeout_s: float) -> HeadlessRun:
    """Run `command` to its end (SIGINT after `timeout_s`): its wall time, and the CPU time
    of it and every descendant, orphans included."""
    subreaper = _set_subreaper(True)
    before, busy_before = _children_cpu_s(), _machine_busy_s()
    started_at = time.time()
    # `up --headless` prints one line per change: passed through so progress shows.
    process = subprocess.Popen(command, cwd=cwd)
    try:
        exit_code = process.wait(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGINT)  # how `up --headless` is told to stop gracefully
        exit_code = process.wait()
        timed_out = True
    except KeyboardInterrupt:
        process.send_signal(signal.SIGINT)
        process.wait()
        raise
    finally:
        unreaped = _reap_orphans() if subreaper else 0
        _set_subreaper(False)
    wall_s = time.time() - started_at
    busy_after = _machine_busy_s()
    return HeadlessRun(
        command=command,
        started_at=started_at,
        exit_code=exit_code,
        timed_out=timed_out,
        wall_s=wall_s,
        cpu_s=_children_cpu_s() - before if subreaper else None,
        unreaped=unreaped,
        machine_busy_s=None
        if busy_before is None or busy_after is None
        else busy_after - busy_before,
    )


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _machine_busy_s() -> float | None:
    """CPU seconds every core spent busy since boot (all but idle and iowait)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except (OSError, IndexError):
        return None
    ticks = [int(x) for x in fields]
    # user nice system idle iowait irq softirq steal (guest time is inside user already)
    busy = sum(ticks[:8]) - ticks[3] - ticks[4]
    return busy / os.sysconf("SC_CLK_TCK")


def _set_subreaper(on: bool) -> bool:
    """Make this process the subreaper of its descendants' orphans; False if unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _reap_orphans() -> int:
    """Reap the orphans that came to this process; how many still run after the wait.

    Only called once the launched `up` was waited for, and benchmarks start nothing else
    alongside, so every child left is one of the experiment's orphans."""
    deadline = time.monotonic() + ORPHAN_REAP_S
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return 0  # no children left
        if pid:
            continue
        if time.monotonic() >= deadline:
            return len(child_pids(os.getpid()))
        time.sleep(0.1)
