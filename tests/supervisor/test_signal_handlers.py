"""SIGTERM and SIGINT stop a busy supervisor: the handler never waits on a lock that the
interrupted main thread holds."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# The main thread holds the wake Event's lock (as inside Event.wait, set or clear) when
# the signal arrives; the handler then runs on that same thread. Setting the Event from
# the handler waited on that lock forever (seen: the supervisor hung in Event.clear).
SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, threading
    from pathlib import Path
    from workbench.supervisor.daemon import Supervisor, _install_signal_handlers
    from workbench.supervisor.plan import Plan

    supervisor = Supervisor(Path(sys.argv[1]), Plan(processes=[], orchestrator=None))
    _install_signal_handlers(supervisor)
    with supervisor._wake._cond:
        os.kill(os.getpid(), int(sys.argv[2]))
        for _ in range(1000):  # bytecodes, so the handler runs while the lock is held
            pass
    assert supervisor._wake.wait(60), "the handler never woke the loop"
    print(supervisor._stop_reason)
    """
)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_while_the_loop_holds_its_lock_requests_a_stop(tmp_path: Path, sig):
    try:
        result = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(tmp_path), str(int(sig))],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the supervisor deadlocked in its signal handler")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == f"received {sig.name}"
