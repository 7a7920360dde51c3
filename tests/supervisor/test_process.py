"""One supervised process: spawning, exit records, readiness and stopping its whole group.

These run small `python -c` stand-ins directly (no supervisor daemon). A fixture stops
every process a test started, whatever the test did.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import wait_for
from workbench.inference.engine_errors import engine_fatal_error
from workbench.supervisor.client import describe_last_exit
from workbench.supervisor.daemon import write_state
from workbench.supervisor.launch import kill_leftovers
from workbench.supervisor.lifecycle import Event
from workbench.supervisor.process import (
    ExitRecord,
    FileReady,
    ProcessSpec,
    SupervisedProcess,
    family_members,
    signal_family,
)
from workbench.system.procfs import process_cmdline, process_is_alive

AUTOGROUP = Path("/proc/self/autogroup")


@pytest.fixture
def spawned():
    processes: list[SupervisedProcess] = []
    yield processes
    for proc in processes:
        if proc.pid is not None:
            signal_family(proc.pid, signal.SIGKILL)
            deadline = time.monotonic() + 5
            while proc.poll(time.monotonic()) is None and time.monotonic() < deadline:
                time.sleep(0.01)


def standin(tmp_path: Path, code: str, **spec: object) -> ProcessSpec:
    return ProcessSpec(
        name="stand-in",
        argv=[sys.executable, "-c", code],
        log_path=tmp_path / "logs" / "stand-in.log",
        **spec,
    )


def start(spawned: list, spec: ProcessSpec) -> SupervisedProcess:
    proc = SupervisedProcess(spec)
    assert proc.spawn(time.monotonic()) is None
    spawned.append(proc)
    return proc


def wait_exit(proc: SupervisedProcess, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        record = proc.poll(time.monotonic())
        if record is not None:
            return record
        time.sleep(0.01)
    pytest.fail(f"{proc.name} did not exit within {timeout_s}s")


def test_exit_is_recorded_with_code_time_and_last_log_lines(tmp_path: Path, spawned):
    code = "import sys\nfor i in range(30): print('line', i)\nsys.exit(4)"
    proc = start(spawned, standin(tmp_path, code))
    assert proc.state == "running" and proc.pid is not None
    record = wait_exit(proc)
    assert record.code == 4 and record.signal is None and not record.stop_requested
    assert record.last_lines[-1] == "line 29" and len(record.last_lines) == 20
    assert record.time.endswith("+00:00")
    assert proc.exits == [record] and proc.pid is None


def test_an_exit_0_after_vllms_engine_died_is_a_failure_named_by_the_engines_error(
    tmp_path: Path, spawned
):
    """vLLM's API server exits cleanly after its engine core died; the engine's error, in
    the log of this start only, names the exit."""
    engine_log = Path(__file__).parents[1] / "inference" / "data" / "engine_fatal_error.log"
    dies = f"import sys; sys.stdout.write(open({str(engine_log)!r}).read())"
    proc = start(spawned, standin(tmp_path, dies, exit_cause=engine_fatal_error))
    record = wait_exit(proc)
    assert record.code == 0 and not record.ok
    assert record.describe() == (
        "vLLM's engine died: RuntimeError: CPU Generator does not use offset (exit code 0)"
    )
    assert record.last_lines and describe_last_exit({"exits": [record.to_json()]}) == (
        record.describe()
    )
    # The next start appends to the same log: its clean exit is its own.
    again = wait_exit(
        start(spawned, standin(tmp_path, "print('served')", exit_cause=engine_fatal_error))
    )
    assert again.ok and again.describe() == "exit code 0"


def test_a_child_runs_in_its_own_session_and_process_group(tmp_path: Path, spawned):
    proc = start(spawned, standin(tmp_path, "import time; time.sleep(30)"))
    assert os.getpgid(proc.pid) == proc.pid and os.getsid(proc.pid) == proc.pid
    assert os.getsid(proc.pid) != os.getsid(0)


def test_a_child_without_a_session_of_its_own_leads_a_group_in_the_supervisors(
    tmp_path: Path, spawned, monkeypatch
):
    # An orchestrator: out of reach of the terminal's Ctrl-C, but no autogroup of its own,
    # so a run added does not make the experiment weigh more against the user's TUI.
    monkeypatch.setenv("WORKBENCH_NICE", "9")
    ours = AUTOGROUP.read_text() if AUTOGROUP.exists() else None
    proc = start(spawned, standin(tmp_path, "import time; time.sleep(30)", own_session=False))
    assert os.getpgid(proc.pid) == proc.pid != os.getpgrp()
    assert os.getsid(proc.pid) == os.getsid(0)
    assert os.getpriority(os.PRIO_PROCESS, proc.pid) >= 9
    if ours is not None:  # its session's scheduling group is ours, left as it was
        assert Path(f"/proc/{proc.pid}/autogroup").read_text() == ours
        assert AUTOGROUP.read_text() == ours


def test_a_child_is_batch_work_from_its_start_without_asking(tmp_path: Path, spawned, monkeypatch):
    # An orchestrator starts with every run and spends half a second of CPU importing
    # before it could lower its own priority: the supervisor lowers it at the start.
    monkeypatch.setenv("WORKBENCH_NICE", "9")
    proc = start(spawned, standin(tmp_path, "import time; time.sleep(30)"))
    autogroup = Path(f"/proc/{proc.pid}/autogroup")
    assert os.getpriority(os.PRIO_PROCESS, proc.pid) >= 9
    if autogroup.exists():  # a kernel with autogroup: the child's session yields as a whole
        assert int(autogroup.read_text().split()[-1]) >= 9


def test_a_missing_command_is_a_failed_start_with_the_reason(tmp_path: Path, spawned):
    proc = SupervisedProcess(
        ProcessSpec(name="ghost", argv=["/no/such/binary"], log_path=tmp_path / "ghost.log")
    )
    record = proc.spawn(time.monotonic())
    assert record is not None and "cannot run '/no/such/binary'" in record.error
    assert "cannot start ghost" in (tmp_path / "ghost.log").read_text()


def test_preflight_problem_prevents_the_start(tmp_path: Path, spawned):
    spec = standin(tmp_path, "print('never')", preflight=lambda: "module x not found")
    record = SupervisedProcess(spec).spawn(time.monotonic())
    assert record is not None and record.error == "module x not found"


def test_file_readiness_turns_starting_into_ready(tmp_path: Path, spawned):
    flag = tmp_path / "ready"
    code = f"import time, pathlib; time.sleep(0.3); pathlib.Path({str(flag)!r}).touch(); time.sleep(30)"
    proc = start(spawned, standin(tmp_path, code, readiness=FileReady(flag)))
    assert proc.state == "starting"
    deadline = time.monotonic() + 5
    while not proc.check_ready(time.monotonic()):
        assert time.monotonic() < deadline, "never became ready"
        time.sleep(0.05)
    assert proc.state == "ready"


GRANDPARENT = """
import subprocess, sys, time, pathlib
child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])
pathlib.Path({pid_file!r}).write_text(str(child.pid))
time.sleep(600)
"""


@pytest.mark.parametrize("own_session", [True, False], ids=["own session", "group only"])
def test_stop_terminates_the_whole_group_and_leaves_no_orphans(
    tmp_path: Path, spawned, own_session: bool
):
    pid_file = tmp_path / "grandchild.pid"
    code = GRANDPARENT.format(pid_file=str(pid_file))
    proc = start(spawned, standin(tmp_path, code, own_session=own_session))
    deadline = time.monotonic() + 10
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    grandchild = int(pid_file.read_text())
    assert process_is_alive(grandchild)

    leader = proc.pid
    proc.handle(Event.STOP, time.monotonic(), "test")
    record = wait_exit(proc)

    assert record.stop_requested and record.signal == signal.SIGTERM
    assert record.last_lines == [], "an obeyed stop explains nothing: state.json stays small"
    assert not process_is_alive(grandchild), "the grandchild survived (see /proc)"
    assert not Path(f"/proc/{grandchild}").exists() or _zombie(grandchild)
    assert family_members(leader) == []


def test_a_child_ignoring_sigterm_is_killed_after_its_stop_timeout(tmp_path: Path, spawned):
    code = (
        "import signal, time, sys\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)"
    )
    proc = start(spawned, standin(tmp_path, code, stop_timeout_s=0.5))
    log = tmp_path / "logs" / "stand-in.log"
    deadline = time.monotonic() + 10
    while "ready" not in log.read_text().splitlines():  # the line, not the logged argv
        assert time.monotonic() < deadline
        time.sleep(0.02)
    began = time.monotonic()
    proc.handle(Event.STOP, began, "test")
    record = wait_exit(proc)
    assert record.signal == signal.SIGKILL
    assert time.monotonic() - began >= 0.5
    assert "sending SIGKILL" in log.read_text()
    assert "ready" in record.last_lines, "a forced stop keeps what the process last said"


def test_a_clean_exit_keeps_no_log_lines(tmp_path: Path, spawned):
    # Hundreds of orchestrators end cleanly in a sweep: their records stay small.
    proc = start(spawned, standin(tmp_path, "print('done')"))
    record = wait_exit(proc)
    assert record.ok and record.last_lines == []


def test_leftovers_of_a_leader_that_exited_by_itself_are_killed(tmp_path: Path, spawned):
    pid_file = tmp_path / "grandchild.pid"
    code = GRANDPARENT.format(pid_file=str(pid_file)).replace("time.sleep(600)\n", "sys.exit(1)\n")
    proc = start(spawned, standin(tmp_path, code))
    record = wait_exit(proc)
    assert record.code == 1
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while process_is_alive(grandchild):
        assert time.monotonic() < deadline, "the orphaned grandchild was not killed"
        time.sleep(0.02)


@pytest.mark.parametrize(
    ("record", "words"),
    [
        (ExitRecord("t", code=None, signal=signal.SIGKILL, last_lines=[]), "killed by SIGKILL"),
        (ExitRecord("t", code=None, signal=200, last_lines=[]), "killed by signal 200"),
        (ExitRecord("t", code=1, signal=None, last_lines=[]), "exit code 1"),
        (ExitRecord("t", None, None, [], error="module x not found"), "module x not found"),
    ],
)
def test_an_exit_is_worded_alike_in_the_log_in_state_json_and_in_status(record, words):
    assert record.describe() == words
    assert describe_last_exit({"exits": [record.to_json()]}) == words


def test_a_process_that_never_ended_has_no_last_exit():
    assert describe_last_exit({"exits": []}) is None


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


# A stand-in for `python -m workbench.inference`, which replaces itself with vLLM's server.
EXECS_INTO_A_SERVER = (
    "import os, sys\n"
    "os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(600)'])"
)


def test_down_after_a_killed_supervisor_stops_a_child_without_a_session_of_its_own(
    tmp_path: Path, spawned
):
    # An orchestrator that outlived its supervisor: it leads its group, not a session.
    pid_file = tmp_path / "grandchild.pid"
    code = GRANDPARENT.format(pid_file=str(pid_file))
    proc = start(spawned, standin(tmp_path, code, own_session=False))
    wait_for(lambda: pid_file.exists() and pid_file.read_text(), what="the grandchild")
    write_state(tmp_path, {"processes": {"run_a": proc.to_json()}})

    assert kill_leftovers(tmp_path, timeout_s=5) == [proc.pid]
    assert family_members(proc.pid) == []


def test_down_after_a_killed_supervisor_stops_a_child_that_replaced_itself_by_exec(
    tmp_path: Path, spawned
):
    from workbench.supervisor.daemon import write_state
    from workbench.supervisor.launch import kill_leftovers

    proc = start(spawned, standin(tmp_path, EXECS_INTO_A_SERVER))
    wait_for(lambda: "time.sleep" in " ".join(process_cmdline(proc.pid)), what="the exec")
    write_state(tmp_path, {"processes": {"inference": proc.to_json()}})

    assert kill_leftovers(tmp_path, timeout_s=5) == [proc.pid]
    assert family_members(proc.pid) == []


def test_down_leaves_alone_a_process_that_reused_a_recorded_pid(tmp_path: Path, spawned):
    proc = start(spawned, standin(tmp_path, "import time; time.sleep(600)"))
    record = {**proc.to_json(), "start_ticks": proc.to_json()["start_ticks"] - 1}
    write_state(tmp_path, {"processes": {"inference": record}})

    assert kill_leftovers(tmp_path, timeout_s=5) == []
    assert process_is_alive(proc.pid)
