"""Workbench's processes yield the CPU as batch work, without touching a shell's session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import autogroup_nice

AUTOGROUP = Path("/proc/self/autogroup")
RUN_AS_BATCH = (
    "import os; from workbench.system.priority import run_as_batch; run_as_batch(7); "
    "print(os.getpriority(os.PRIO_PROCESS, 0), open('/proc/self/autogroup').read().split()[-1])"
)


@pytest.mark.skipif(not AUTOGROUP.exists(), reason="a kernel without autogroup")
def test_a_process_in_its_own_session_lowers_its_sessions_autogroup():
    out = subprocess.run(
        [sys.executable, "-c", RUN_AS_BATCH], capture_output=True, text=True,
        start_new_session=True, check=True,
    ).stdout.split()  # fmt: skip
    assert [int(value) for value in out] == [7, 7]


@pytest.mark.skipif(not AUTOGROUP.exists(), reason="a kernel without autogroup")
def test_a_process_started_from_a_shells_session_leaves_the_shells_autogroup_alone():
    # Run in a session of its own, standing in for a person's shell, with a child in it
    # that runs as batch work: the child's own nice value rises, the session's does not.
    shell = (
        "import subprocess, sys; "
        f"out = subprocess.run([sys.executable, '-c', {RUN_AS_BATCH!r}], "
        "capture_output=True, text=True, check=True).stdout; "
        "print(out.strip(), open('/proc/self/autogroup').read().split()[-1])"
    )
    before = autogroup_nice(os.getpid())
    out = subprocess.run(
        [sys.executable, "-c", shell], capture_output=True, text=True,
        start_new_session=True, check=True,
    ).stdout.split()  # fmt: skip
    child_nice, child_group, shell_group = (int(value) for value in out)
    assert child_nice == 7
    assert child_group == shell_group == 0, "the shell's session kept its priority"
    assert autogroup_nice(os.getpid()) == before
