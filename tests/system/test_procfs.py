"""`workbench.system.procfs`: the one reader of /proc/PID, on real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from workbench.system import procfs


def test_a_process_reads_its_own_fields():
    stat = procfs.read_stat(os.getpid())
    assert stat is not None
    assert (stat.ppid, stat.pgrp, stat.session) == (os.getppid(), os.getpgrp(), os.getsid(0))
    assert not stat.exited and stat.cpu_seconds > 0
    assert procfs.process_is_alive(os.getpid())


def test_a_command_name_with_spaces_and_parentheses_is_read_past(tmp_path):
    odd = tmp_path / "a) b (c"
    odd.symlink_to(sys.executable)
    argv = [str(odd), "-c", "import time; time.sleep(30)"]
    child = subprocess.Popen(argv)
    try:
        stat = procfs.read_stat(child.pid)
        assert stat is not None and stat.ppid == os.getpid()
        deadline = time.monotonic() + 10  # empty until the new program is set up
        while not procfs.process_cmdline(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert procfs.process_cmdline(child.pid) == argv
        assert child.pid in procfs.child_pids(os.getpid())
    finally:
        child.kill()
        child.wait()


def test_an_exited_child_is_not_alive_before_or_after_it_is_reaped():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while (stat := procfs.read_stat(child.pid)) is not None and not stat.exited:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert not procfs.process_is_alive(child.pid)  # a zombie
    child.wait()
    assert not procfs.process_is_alive(child.pid)
    assert procfs.read_stat(child.pid) is None and procfs.process_cmdline(child.pid) == []
    with pytest.raises(ProcessLookupError):
        procfs.cpu_seconds(child.pid)


def test_a_process_knows_when_it_started_its_memory_and_the_machines():
    started = procfs.process_started_at(os.getpid())
    assert started is not None and started <= time.time()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        child_started = procfs.process_started_at(child.pid)
        assert child_started is not None and child_started >= started
    finally:
        child.kill()
        child.wait()
    assert procfs.read_stat(os.getpid()).rss_bytes > 1 << 20
    assert procfs.memory_available_bytes() > 0
