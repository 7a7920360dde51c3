"""Training yields the CPU to the person at the keyboard: workbench's processes run as batch work.

On a machine where the experiment's processes fill every core (a CPU-only machine always),
the TUI, a shell over SSH or an editor must still answer. A process's nice value alone does
not do it on Linux: with autogroup (on by default in most distributions) the scheduler first
shares the CPU between sessions, equally, and a nice value acts only among the processes of
one session. The supervisor runs in a session of its own (so a closed terminal never
reaches it), vLLM and the trainer in others, and torchrun starts each trainer worker in
another: five sessions or so to the TUI's one, which would get a sixth of the CPU. (The
orchestrators share the supervisor's session: with a session each, the TUI's share would
shrink with every run, to a thirty-fifth at 32 runs.)

So each of workbench's long-running processes raises its session's autogroup nice value and
its own nice value to `$WORKBENCH_NICE` (10 unless set where `workbench up` runs, whose
processes inherit it; 0 keeps the usual priority): the supervisor for each child as it
starts it, and the child again itself (torchrun's workers are not the supervisor's).
Against an interactive process they yield. Among themselves they keep the shares they had,
all being at the same value, except that on a machine of two CPUs vLLM takes a value a
little higher, to leave the trainer its core (`inference_nice`). Raising a nice value needs
no privilege, and where there is no autogroup (`/proc/self/autogroup` missing, or a kernel
without it) or the process's session never left the boot session's group (the file is empty,
as for a child of a container's init that never called setsid) the process's own nice value
does the work.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

NICE_ENV = "WORKBENCH_NICE"
DEFAULT_NICE = 10
AUTOGROUP = Path("/proc/self/autogroup")
# How much further vLLM yields to the trainer where the two share two cores
# (`inference_nice`).
INFERENCE_YIELDS_BY = 5


def batch_nice() -> int:
    """The nice value workbench's processes take: `$WORKBENCH_NICE`, else DEFAULT_NICE."""
    raw = os.environ.get(NICE_ENV, "").strip()
    try:
        return max(0, min(19, int(raw))) if raw else DEFAULT_NICE
    except ValueError:
        return DEFAULT_NICE


def inference_nice(small_machine: bool) -> int:
    """The nice value of the vLLM server: on a machine of two CPUs, `INFERENCE_YIELDS_BY`
    above the others, so that the trainer gets its core whenever it has work.

    There the trainer is every run's critical path: one process on one thread, busy for the
    whole of a 4-run experiment's steady state, while vLLM generates the next step's
    rollouts ahead of it (async_level >= 1). When vLLM's two processes and the trainer
    want both cores at once, the trainer is the one every run waits for. Measured on 2
    cores, 4 runs x 20 steps of reverse_text, alternating, the same rewards every time:
    82, 69, 64 and 75 s with vLLM at the trainer's nice value; 74, 63, 64 and 72 s with vLLM
    5 above it. At 32 runs vLLM's engine is what the runs wait for instead, and the nice
    values made no difference there: 32 runs x 20 steps took 231.7 and 225.1 s at the
    trainer's value, 226.2 and 239.0 s at 5 above (docs/benchmarks/many-runs.md).
    """
    return min(19, batch_nice() + INFERENCE_YIELDS_BY) if small_machine else batch_nice()


def run_as_batch(nice: int | None = None, pid: int = 0) -> None:
    """Raise the nice value of process `pid` (0: this one) and, where it leads its session,
    of that session's autogroup to `nice` (default: `batch_nice()`); a value already higher
    is kept; failures change nothing. The supervisor does it for each child as soon as it is
    started, so that the child's imports (half a second of CPU for an orchestrator, which
    starts with every run) are batch work too; the child does it again itself, which costs
    nothing. A process started in someone else's session (an orchestrator or a trainer run
    by hand from a shell, a test's) leaves that session's autogroup alone: raising it would
    lower the priority of the shell, and of a TUI started from it later, as well."""
    nice = batch_nice() if nice is None else nice
    with contextlib.suppress(OSError):
        if os.getpriority(os.PRIO_PROCESS, pid) < nice:
            os.setpriority(os.PRIO_PROCESS, pid, nice)
    if not _leads_its_session(pid):
        return
    autogroup = AUTOGROUP if pid == 0 else Path(f"/proc/{pid}/autogroup")
    with contextlib.suppress(OSError, ValueError, IndexError):
        # "/autogroup-123 nice 0": this session's group and its nice value.
        if int(autogroup.read_text().split()[-1]) < nice:
            autogroup.write_text(str(nice))


def _leads_its_session(pid: int) -> bool:
    """Whether process `pid` (0: this one) is its session's leader: a session workbench
    started for it (`start_new_session`), whose autogroup is the process's own."""
    own = pid or os.getpid()
    try:
        return os.getsid(own) == own
    except OSError:
        return False
