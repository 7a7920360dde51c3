"""Running `workbench up RECIPE --headless` for a benchmark (one, or several at once): wall
time and CPU-seconds.

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
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO

from workbench.system.procfs import child_pids

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


def up_command(recipe: Path, max_steps: int | None = None) -> list[str]:
    """`workbench up RECIPE --headless [--max-steps N]`, run by this Python."""
    command = [sys.executable, "-m", "workbench.cli", "up", str(recipe), "--headless"]
    if max_steps is not None:
        command += ["--max-steps", str(max_steps)]
    return command


def as_typed(command: list[str]) -> list[str]:
    """The command as a user would type it."""
    return ["workbench", *command[3:]]


def run_up_headless(
    recipe: Path, cwd: Path, *, max_steps: int | None = None, timeout_s: float
) -> HeadlessRun:
    """`workbench up RECIPE --headless [--max-steps N]` in `cwd`; Ctrl-C (SIGINT) stops it
    gracefully after `timeout_s`, as a user would."""
    command = up_command(recipe, max_steps)
    run = run_accounted(command, cwd, timeout_s=timeout_s)
    return replace(run, command=as_typed(command))


@dataclass(frozen=True)
class Launch:
    command: list[str]
    cwd: Path
    output: Path | None = None  # where its stdout and stderr go; None: this terminal


def run_accounted(
    command: list[str],
    cwd: Path,
    *,
    timeout_s: float,
    env: dict[str, str] | None = None,
    on_start: Callable[[int], None] | None = None,
) -> HeadlessRun:
    """Run `command` to its end (SIGINT after `timeout_s`): its wall time, and the CPU time
    of it and every descendant, orphans included. `on_start(pid)` is told its pid."""
    runs, cpu_s, unreaped = run_accounted_together(
        [Launch(command, cwd)], timeout_s=timeout_s, env=env, on_start=on_start
    )
    return replace(runs[0], cpu_s=cpu_s, unreaped=unreaped)


def _start(
    launch: Launch, env: dict[str, str] | None, output: IO[bytes] | None
) -> subprocess.Popen:
    """`launch`'s command, its output (stdout and stderr) to `output` or inherited."""
    return subprocess.Popen(
        launch.command,
        cwd=launch.cwd,
        env=None if env is None else {**os.environ, **env},
        stdout=output,
        stderr=None if output is None else subprocess.STDOUT,
    )


def _wait_for_all(
    processes: list[subprocess.Popen],
    ended: dict[int, tuple[int, bool, float]],
    started_at: float,
    deadline: float,
) -> None:
    """Fill `ended` (index -> exit code, timed out, wall seconds since `started_at`) as the
    processes end; at `deadline` (monotonic), SIGINT each one still running and wait."""
    while len(ended) < len(processes):
        for index, process in enumerate(processes):
            if index not in ended and process.poll() is not None:
                ended[index] = (process.returncode, False, time.time() - started_at)
        if len(ended) < len(processes) and time.monotonic() >= deadline:
            for index, process in enumerate(processes):
                if index not in ended:
                    process.send_signal(signal.SIGINT)  # `up --headless` stops gracefully
                    ended[index] = (process.wait(), True, time.time() - started_at)
        time.sleep(0.05)


def run_accounted_together(
    launches: list[Launch],
    *,
    timeout_s: float,
    env: dict[str, str] | None = None,
    on_start: Callable[[int], None] | None = None,
) -> tuple[list[HeadlessRun], float | None, int]:
    """Start every command at once and wait for all (SIGINT to those still running after
    `timeout_s`). Returns each one's run (its `cpu_s` None: the kernel sums the CPU time of
    all of them together), that sum, and how many descendants still ran at the end."""
    subreaper = _set_subreaper(True)
    before, busy_before = _children_cpu_s(), _machine_busy_s()
    started_at = time.time()
    processes: list[subprocess.Popen] = []
    outputs = []
    ended: dict[int, tuple[int, bool, float]] = {}  # index -> exit code, timed out, wall
    try:
        for launch in launches:
            output = None if launch.output is None else open(launch.output, "wb")  # noqa: SIM115
            outputs.append(output)
            processes.append(_start(launch, env, output))
            if on_start is not None:
                on_start(processes[-1].pid)
        _wait_for_all(processes, ended, started_at, time.monotonic() + timeout_s)
    except KeyboardInterrupt:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
        for process in processes:
            process.wait()
        raise
    finally:
        unreaped = _reap_orphans() if subreaper else 0
        _set_subreaper(False)
        for output in outputs:
            if output is not None:
                output.close()
    busy_after = _machine_busy_s()
    cpu_s = _children_cpu_s() - before if subreaper else None
    machine_busy_s = None if busy_before is None or busy_after is None else busy_after - busy_before
    runs = [
        HeadlessRun(
            command=launch.command,
            started_at=started_at,
            exit_code=ended[index][0],
            timed_out=ended[index][1],
            wall_s=ended[index][2],
            cpu_s=None,
            unreaped=unreaped,
            machine_busy_s=machine_busy_s,
        )
        for index, launch in enumerate(launches)
    ]
    return runs, cpu_s, unreaped


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
