"""The supervisor daemon around stand-in children: order, readiness, restarts, stop, state.

Each test runs the real `python -m workbench.supervisor` (own session, lock, socket,
file watcher) with the stand-in plan of `standins.py`; see conftest.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from tests.helpers import make_run, wait_for
from tests.supervisor.conftest import FAST_RESTART, StandinExperiment
from workbench.files import run_control
from workbench.status import run_statuses
from workbench.supervisor import paths
from workbench.supervisor.daemon import RESCAN_S
from workbench.supervisor.launch import SupervisorStartError, start_daemon
from workbench.system.procfs import process_is_alive


def test_processes_start_in_order_inference_then_trainer_then_orchestrators(
    standin: StandinExperiment,
):
    standin.add_runs("run_a", "run_b")
    standin.start()
    standin.wait_for_event("run_a", "start")
    standin.wait_for_event("run_b", "start")
    log = (standin.path / "logs" / "supervisor.log").read_text().splitlines()
    spawned = [line.split()[3].rstrip(":") for line in log if ": started (pid" in line]
    assert spawned[:2] == ["inference", "trainer"]
    assert sorted(spawned[2:]) == ["run_a", "run_b"]
    ready = standin.first("inference", "ready").time
    assert all(standin.first(run, "start").time >= ready for run in ("run_a", "run_b"))
    assert standin.state()["status"] == "running"


def test_the_supervisor_and_its_children_are_batch_work_from_their_start(
    standin: StandinExperiment, monkeypatch
):
    # Stand-ins never lower their own priority: only `up` and the supervisor do it here.
    monkeypatch.setenv("WORKBENCH_NICE", "9")
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    standin.add_runs("run_a")
    started = standin.start()
    standin.wait_for_event("run_a", "start")
    for pid in [started.pid, *standin.standin_pids()]:
        assert os.getpriority(os.PRIO_PROCESS, pid) >= 9, pid
        autogroup = Path(f"/proc/{pid}/autogroup")
        if autogroup.exists():
            assert int(autogroup.read_text().split()[-1]) >= 9, pid
    assert os.getpriority(os.PRIO_PROCESS, 0) == mine, "the user's own shell is left alone"


def test_orchestrators_wait_until_inference_is_ready(standin: StandinExperiment):
    standin.configure(
        processes=[
            {
                "name": "inference",
                "kind": "inference",
                "ready": True,
                "args": ["--ready-after", "1.5"],
            },
            {"name": "trainer", "kind": "trainer"},
        ]
    )
    standin.add_runs("run_a")
    standin.start()
    waiting = standin.wait_for_process("run_a", "waiting")
    assert waiting["reason"] == "waiting for inference to be ready"
    assert standin.process("inference")["state"] == "starting"
    time.sleep(0.8)
    assert standin.process("run_a")["state"] == "waiting", "started before inference was ready"
    started = standin.wait_for_event("run_a", "start")
    assert started.time >= standin.first("inference", "ready").time


def test_crashed_child_restarts_with_backoff(standin: StandinExperiment):
    standin.configure(
        processes=[
            {"name": "inference", "kind": "inference", "ready": True},
            {
                "name": "trainer",
                "kind": "trainer",
                "args": ["--crash-times", "2", "--crash-after", "0"],
                "restart": FAST_RESTART,
            },
        ]
    )
    standin.start()
    wait_for(
        lambda: (
            len([e for e in standin.events() if e.name == "trainer" and e.what == "start"]) == 3
        ),
        what="3 trainer starts",
    )
    trainer = standin.wait_for_process("trainer", "running")
    starts = [e.time for e in standin.events() if e.name == "trainer" and e.what == "start"]
    crashes = [e.time for e in standin.events() if e.name == "trainer" and e.what == "crash"]
    # Backoff 0.2 s, then 0.4 s: each restart waits at least that long after the crash.
    assert starts[1] - crashes[0] >= 0.2 and starts[2] - crashes[1] >= 0.4
    assert trainer["restarts"] == 2
    assert [x["code"] for x in trainer["exits"]] == [3, 3]
    assert "stand-in trainer crashing with exit code 3" in trainer["exits"][0]["last_lines"]


def test_crashed_child_restarts_with_backoff_until_max_restarts_then_fails(
    standin: StandinExperiment,
):
    standin.configure(
        processes=[
            {"name": "inference", "kind": "inference", "ready": True},
            {
                "name": "trainer",
                "kind": "trainer",
                "args": ["--crash-times", "99", "--crash-after", "0"],
                "restart": {**FAST_RESTART, "backoff_initial_s": 0.05, "max_restarts": 2},
            },
        ]
    )
    standin.start()
    trainer = standin.wait_for_process("trainer", "failed")
    assert trainer["restarts"] == 2
    assert len(trainer["exits"]) == 3
    assert all(x["code"] == 3 and x["signal"] is None and x["time"] for x in trainer["exits"])
    assert "gave up after 2 restarts" in trainer["reason"]
    assert "exit code 3" in trainer["reason"]
    assert standin.client.ping()["ok"], "a failed child does not take the supervisor down"
    standin.wait_for_process("inference", "ready")


def test_a_missing_module_is_a_failed_process_not_a_supervisor_crash(standin: StandinExperiment):
    standin.configure(
        processes=[
            {"name": "inference", "kind": "inference", "ready": True},
            {
                "name": "trainer",
                "kind": "trainer",
                "argv": [sys.executable, "-m", "workbench.no_such_trainer"],
                "module": "workbench.no_such_trainer",
            },
        ]
    )
    standin.start()
    trainer = standin.wait_for_process("trainer", "failed")
    assert "module workbench.no_such_trainer not found" in trainer["reason"]
    assert trainer["exits"][-1]["error"] == trainer["reason"]
    assert trainer["restarts"] == 0 and trainer["pid"] is None
    assert "cannot start trainer" in (standin.path / "logs" / "trainer.log").read_text()
    assert standin.client.ping()["ok"], "the supervisor runs on"
    standin.wait_for_process("inference", "ready")


def test_down_stops_every_process_group_and_leaves_no_orphans(standin: StandinExperiment):
    pid_file = standin.path / "grandchild.pid"
    standin.configure(
        processes=[
            {"name": "inference", "kind": "inference", "ready": True},
            {
                "name": "trainer",
                "kind": "trainer",
                "args": ["--grandchild-pid-file", str(pid_file)],
            },
        ]
    )
    standin.add_runs("run_a")
    standin.start()
    standin.wait_for_process("run_a", "running")
    grandchild = int(
        wait_for(lambda: pid_file.exists() and pid_file.read_text(), what="grandchild")
    )
    children = standin.standin_pids()
    assert process_is_alive(grandchild)

    from workbench.supervisor.launch import stop_experiment

    report = stop_experiment(standin.path, timeout_s=20)

    assert report.graceful and report.leftovers == []
    for pid in [*children, grandchild]:
        assert not process_is_alive(pid), (
            f"pid {pid} survived `down` ({Path(f'/proc/{pid}/stat').exists()})"
        )
    state = standin.state()
    assert state["status"] == "stopped"
    assert {p["state"] for p in state["processes"].values()} == {"stopped"}


def test_down_removes_what_a_process_killed_mid_write_left_of_its_activity_record(
    tmp_path: Path,
):
    # A child of a killed supervisor is SIGKILLed by `down` if it does not stop in time,
    # perhaps in the middle of rewriting its busy record: after `down` nothing would.
    from workbench.files import layout
    from workbench.supervisor.launch import stop_experiment

    busy = layout.busy_dir(tmp_path)
    busy.mkdir()
    record = layout.busy_path(tmp_path, "run_a")
    record.write_text("{}")
    killed_write = busy / f".{record.name}.d4qfgof8.tmp"
    killed_write.write_text('{"pro')
    stop_experiment(tmp_path, timeout_s=1)
    assert not killed_write.exists() and record.read_text() == "{}"


def test_a_second_supervisor_for_the_same_experiment_refuses_naming_the_first(
    standin: StandinExperiment,
):
    first = standin.start()
    with pytest.raises(
        SupervisorStartError, match=f"already has a supervisor \\(pid {first.pid}\\)"
    ):
        start_daemon(standin.path)
    # The daemon itself refuses too (its lock), even when asked directly.
    second = subprocess.run(
        [sys.executable, "-m", "workbench.supervisor", "--experiment", str(standin.path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert second.returncode == 3
    assert f"pid {first.pid}" in second.stderr and "workbench down" in second.stderr
    assert standin.state()["pid"] == first.pid, "the refused supervisor left state.json alone"


def test_state_json_is_rewritten_atomically_after_every_change(standin: StandinExperiment):
    standin.configure(
        processes=[
            {
                "name": "inference",
                "kind": "inference",
                "ready": True,
                "args": ["--ready-after", "0.5"],
            },
            {"name": "trainer", "kind": "trainer"},
        ]
    )
    standin.add_runs("run_a")
    seen: list[tuple[str, str]] = []
    errors: list[str] = []
    stop = threading.Event()
    state_file = paths.state_path(standin.path)

    def watch() -> None:
        while not stop.is_set():
            try:
                text = state_file.read_text()
            except FileNotFoundError:
                continue
            try:
                state = json.loads(text)
            except json.JSONDecodeError:
                errors.append(text)
                continue
            for name, record in state["processes"].items():
                if (name, record["state"]) not in seen:
                    seen.append((name, record["state"]))

    reader = threading.Thread(target=watch)
    reader.start()
    try:
        standin.start()
        standin.wait_for_process("run_a", "running")
        standin.client.evict("run_a", reason="testing")
        wait_for(lambda: ("run_a", "stopped") in seen, what="the reader to see run_a stopped")
        stopped = standin.process("run_a")
    finally:
        stop.set()
        reader.join()
    assert not errors, "a reader saw a half-written state.json"
    for expected in [
        ("inference", "starting"),
        ("inference", "ready"),
        ("trainer", "running"),
        ("run_a", "waiting"),
        ("run_a", "running"),
        ("run_a", "stopped"),
    ]:
        assert expected in seen, f"state.json never showed {expected}: {seen}"
    assert seen.index(("inference", "ready")) < seen.index(("run_a", "running"))
    assert stopped["reason"] == "evicted: testing"
    assert stopped["exits"][-1]["stop_requested"] is True
    state = standin.state()
    assert state["pid"] == standin.started[0].pid and state["experiment"] == str(standin.path)


def test_sigterm_to_the_supervisor_stops_children_in_order_and_exits(
    standin: StandinExperiment,
):
    standin.add_runs("run_a", "run_b")
    started = standin.start()
    standin.wait_for_event("run_a", "start")
    standin.wait_for_event("run_b", "start")
    children = standin.standin_pids()

    os.kill(started.pid, signal.SIGTERM)
    assert started.process.wait(timeout=30) == 0

    sigterms = {e.name: e.time for e in standin.events() if e.what == "sigterm"}
    assert set(sigterms) == {"inference", "trainer", "run_a", "run_b"}, "each child got SIGTERM"
    assert max(sigterms["run_a"], sigterms["run_b"]) <= sigterms["trainer"] <= sigterms["inference"]
    assert not any(process_is_alive(pid) for pid in children)
    state = standin.state()
    assert state["status"] == "stopped" and state["stop_reason"] == "received SIGTERM"
    for record in state["processes"].values():
        assert record["state"] == "stopped" and record["exits"][-1]["code"] == 0
    assert not paths.socket_path(standin.path).exists()


def test_a_new_supervisor_cleans_up_children_left_by_one_that_was_killed(
    standin: StandinExperiment,
):
    standin.add_runs("run_a")
    first = standin.start()
    standin.wait_for_event("run_a", "start")
    orphans = standin.standin_pids()
    os.kill(first.pid, signal.SIGKILL)
    first.process.wait(timeout=10)
    assert all(process_is_alive(pid) for pid in orphans), "children live on in their sessions"

    standin.start()
    standin.wait_for_process("run_a", "running")
    assert not any(process_is_alive(pid) for pid in orphans)
    assert "left by an earlier supervisor" in (standin.path / "logs" / "supervisor.log").read_text()


# ---------------------------------------------------------------- discovery


def test_a_run_directory_created_by_hand_gets_an_orchestrator_within_a_second(
    standin: StandinExperiment,
):
    standin.start()
    standin.wait_for_process("inference", "ready")
    time.sleep(0.3)  # let the first periodic rescan pass: the watcher must do the work
    created = time.time()
    make_run(standin.path, "run_by_hand", "lr = 0.001\n")
    standin.wait_for_process("run_by_hand", "running", timeout_s=5)
    latency = standin.wait_for_event("run_by_hand", "start").time - created
    assert latency < 1.0, f"discovered after {latency:.2f}s"


def test_a_run_directory_made_before_its_orch_toml_gets_an_orchestrator_within_a_second_of_it(
    standin: StandinExperiment,
):
    standin.start()
    standin.wait_for_process("inference", "ready")
    run = standin.path / "run_config_later"
    (run / "control").mkdir(parents=True)
    time.sleep(RESCAN_S + 0.5)  # its directory's event and a rescan have come and gone
    assert "run_config_later" not in standin.state()["processes"]
    written = time.time()
    make_run(standin.path, "run_config_later", "lr = 0.001\n")
    standin.wait_for_process("run_config_later", "running", timeout_s=5)
    latency = standin.wait_for_event("run_config_later", "start").time - written
    assert latency < 1.0, f"started {latency:.2f}s after its orch.toml"


# Loaded by the supervisor (through PYTHONPATH) in the test below: a fake kernel answer, as
# the real limit is the machine's and lowering it would starve every other file watcher.
NO_INOTIFY_WATCH_LEFT = """
import ctypes, errno
from watchdog.observers import inotify_c

def _no_watch_left(fd, path, mask):
    ctypes.set_errno(errno.ENOSPC)
    return -1

inotify_c.inotify_add_watch = _no_watch_left
"""


def test_out_of_inotify_watches_the_rescans_find_new_and_evicted_runs_after_a_warning(
    standin: StandinExperiment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    fake = tmp_path / "no_inotify_watch_left"
    fake.mkdir()
    (fake / "sitecustomize.py").write_text(NO_INOTIFY_WATCH_LEFT)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(fake), os.environ.get("PYTHONPATH")]))
    )
    standin.start()
    standin.wait_for_process("inference", "ready")
    time.sleep(0.3)  # past the first rescan: the next one must find the run
    created = time.time()
    run = make_run(standin.path, "run_found_by_rescan", "lr = 0.001\n")
    standin.wait_for_process("run_found_by_rescan", "running", timeout_s=10)
    latency = standin.wait_for_event("run_found_by_rescan", "start").time - created
    assert latency < RESCAN_S + 1.0, f"found after {latency:.2f}s"
    run_control.write_eviction(run, "found by a rescan too", by="user")
    stopped = standin.wait_for_process("run_found_by_rescan", "stopped", timeout_s=10)
    assert stopped["reason"] == "evicted: found by a rescan too"
    log_text = (standin.path / "logs" / "supervisor.log").read_text()
    assert "out of inotify watches (fs.inotify.max_user_watches" in log_text
    assert "sudo sysctl fs.inotify.max_user_watches=" in log_text


def test_deleting_a_run_directory_stops_its_orchestrator(standin: StandinExperiment):
    (run,) = standin.add_runs("run_a")
    standin.start()
    pid = standin.wait_for_process("run_a", "running")["pid"]
    # Like `rm -rf` while a process still writes its log: retry until the tree is gone.
    wait_for(lambda: shutil.rmtree(run, ignore_errors=True) or not run.exists(), 5, "rm -rf")
    # rmtree removes orch.toml before the directory: the reason settles once it is gone.
    wait_for(
        lambda: (
            (record := standin.process("run_a"))["state"] == "stopped"
            and record["reason"] == "run directory deleted"
        ),
        5,
        "the orchestrator to be stopped as deleted",
    )
    assert not process_is_alive(pid)


def test_evicted_txt_stops_the_orchestrator_and_state_shows_the_reason(
    standin: StandinExperiment,
):
    (run,) = standin.add_runs("run_a")
    standin.start()
    pid = standin.wait_for_process("run_a", "running")["pid"]
    evicted = time.time()
    run_control.write_eviction(run, "reward collapsed", by="trainer")
    stopped = standin.wait_for_process("run_a", "stopped", timeout_s=5)
    assert stopped["reason"] == "evicted: reward collapsed"
    # Found by the periodic rescan (no event from inside a run reaches discovery).
    assert time.time() - evicted < RESCAN_S + 1.0
    assert not process_is_alive(pid)
    time.sleep(0.5)
    assert standin.process("run_a")["state"] == "stopped", "an evicted run is not restarted"


def test_a_run_with_an_invalid_orch_toml_gets_no_orchestrator(standin: StandinExperiment):
    make_run(standin.path, "run_bad", "lr = -1\n")
    standin.add_runs("run_good")
    standin.start()
    standin.wait_for_process("run_good", "running")
    time.sleep(0.3)
    assert "run_bad" not in standin.state()["processes"]
    assert not [e for e in standin.events() if e.name == "run_bad"]


def test_a_run_whose_orchestrator_rejects_its_config_is_rejected_after_one_attempt(
    standin: StandinExperiment,
):
    # The real orchestrator, for a run directory written by hand with an environment that
    # does not exist: the supervisor's own check (the config's keys and types) passes it.
    standin.configure(orchestrator={"argv": [sys.executable, "-m", "workbench.orchestrator"]})
    run = make_run(standin.path, "run_bad", 'env = "nope"\n')
    standin.start()
    stopped = standin.wait_for_process("run_bad", "stopped", timeout_s=120)
    assert stopped["reason"].startswith("rejected: ") and stopped["restarts"] == 0
    assert "env: unknown environment 'nope'" in stopped["reason"]
    assert "unknown environment 'nope'" in run_control.read_validation_error(run)
    (status,) = run_statuses(standin.path)
    assert status.status == "rejected" and "unknown environment 'nope'" in status.reason
    time.sleep(1.0)
    record = standin.process("run_bad")
    assert record["state"] == "stopped" and record["restarts"] == 0, "it is not restarted"


def test_with_exit_when_done_the_supervisor_stops_once_every_run_finished(
    standin: StandinExperiment,
):
    standin.configure(orchestrator={"args": ["--finish-after", "0.2"]})
    standin.add_runs("run_a", "run_b")
    started = standin.start(exit_when_done=True)
    assert started.process.wait(timeout=30) == 0
    state = standin.state()
    assert state["status"] == "stopped" and state["stop_reason"] == "every run is done"
    assert state["processes"]["run_a"]["state"] == "exited"
    assert state["processes"]["run_a"]["reason"] == "run finished"
    assert run_control.is_finished(standin.path / "run_b")


def test_a_state_json_that_cannot_be_written_does_not_stop_training(
    standin: StandinExperiment,
):
    standin.add_runs("run_a")
    standin.start()
    standin.wait_for_event("run_a", "start")
    state_file = paths.state_path(standin.path)
    state_file.unlink()
    state_file.mkdir()  # every write of state.json now fails, as on a full disk
    try:
        standin.client.evict("run_a", reason="while the disk is full")
        log = standin.path / "logs" / "supervisor.log"
        wait_for(
            lambda: "supervisor tick failed (children keep running)" in log.read_text(),
            what="the failed write to be logged",
        )
        assert standin.client.ping()["ok"]
        assert process_is_alive(int(standin.first("trainer", "start").detail))
    finally:
        state_file.rmdir()
    record = standin.wait_for_process("run_a", "stopped")
    assert record["reason"] == "evicted: while the disk is full"


def test_an_orchestrator_killed_with_sigkill_is_restarted_and_the_signal_recorded(
    standin: StandinExperiment,
):
    standin.configure(orchestrator={"restart": FAST_RESTART})
    standin.add_runs("run_a")
    standin.start()
    pid = int(standin.wait_for_event("run_a", "start").detail)
    os.kill(pid, signal.SIGKILL)
    record = wait_for(
        lambda: (r := standin.process("run_a"))["restarts"] == 1 and r["state"] == "running" and r,
        what="run_a to be restarted",
    )
    last = record["exits"][-1]
    assert last["signal"] == signal.SIGKILL and last["code"] is None
    assert not last["stop_requested"]


def test_what_a_killed_orchestrator_left_half_written_is_removed_once_it_exited(
    standin: StandinExperiment,
):
    standin.add_runs("run_a")
    standin.start()
    pid = int(standin.wait_for_event("run_a", "start").detail)
    run = standin.path / "run_a"
    # Where a write was when the kill came: samples.jsonl's temp file, a staged rollout step.
    half_written = [run / ".samples.jsonl.k1ll3d.tmp", run / "rollouts" / ".step_3.k1ll3d.tmp"]
    half_written[0].write_text('{"step": 3, "gro')
    half_written[1].mkdir(parents=True)
    kept = run / "rollouts" / "step_2"
    kept.mkdir()
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: standin.process("run_a")["exits"], what="the exit of run_a")
    wait_for(lambda: not any(path.exists() for path in half_written), what="the removal")
    assert kept.is_dir()


def test_state_json_is_rewritten_at_least_every_heartbeat_though_nothing_changed(
    tmp_path: Path, monkeypatch
):
    # The heartbeat by which `workbench join` on another node tells a live supervisor from
    # one killed outright (tests/supervisor/test_join.py).
    from workbench.supervisor import daemon
    from workbench.supervisor.client import STATE_HEARTBEAT_S, read_state
    from workbench.supervisor.plan import Plan

    now = [1000.0]
    monkeypatch.setattr(daemon, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    supervisor = daemon.Supervisor(tmp_path, Plan(processes=[], orchestrator=None))
    supervisor._publish_state()
    first = read_state(tmp_path)["updated_at"]
    time.sleep(0.01)  # the stamps have millisecond resolution
    now[0] += STATE_HEARTBEAT_S / 2
    supervisor._publish_state()
    assert read_state(tmp_path)["updated_at"] == first, "nothing changed, no beat due yet"
    now[0] += STATE_HEARTBEAT_S / 2
    supervisor._publish_state()
    assert read_state(tmp_path)["updated_at"] > first
