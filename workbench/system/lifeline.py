"""Tie a process's life to its parent's: when the parent dies, the kernel sends SIGTERM.

Every child of the supervisor runs in its own session (so a Ctrl-C or a closed terminal
never reaches it), which also means nothing stops it when the supervisor itself is killed
with SIGKILL (the OOM killer, a stray `kill -9`): it would go on training, generating and
holding ports and memory with nobody watching it. torchrun starts its workers in new
sessions too, so a killed torchrun agent leaves its workers running beside the trainer
that replaces it.

So the children die with their parent rather than being adopted by the next supervisor:
a process that is not our child cannot be waited on or restarted, and a supervisor that
is gone has stopped restarting and checking them anyway. SIGTERM (not SIGKILL) lets each
one stop as it does on `workbench down`: the trainer checkpoints every run, orchestrators
and vLLM exit cleanly. `workbench up` on the experiment then starts everything again from
the latest checkpoints.

Linux only (prctl PR_SET_PDEATHSIG); elsewhere this does nothing. The setting survives
execve, so `python -m workbench.inference` sets it before it becomes vLLM's server.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

# The supervisor puts its pid here for its children; a child compares it with its parent
# after arming the death signal, which closes the race of a parent dying before that.
PARENT_PID_ENV = "WORKBENCH_PARENT_PID"
_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM, *, expected_parent: int | None = None) -> bool:
    """Ask the kernel for `sig` when this process's parent exits; returns whether it could.

    `expected_parent` defaults to $WORKBENCH_PARENT_PID (removed from the environment, so
    that this process's own children do not take it for theirs). If the parent is already
    gone, `sig` is sent at once.
    """
    if expected_parent is None:
        raw = os.environ.pop(PARENT_PID_ENV, "")
        expected_parent = int(raw) if raw.isdigit() else None
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if expected_parent is not None and os.getppid() != expected_parent:
        os.kill(os.getpid(), sig)  # the parent died before the death signal was armed
    return True
