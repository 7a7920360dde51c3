"""The control socket: owner-only, one JSON request and reply per connection, every command."""

from __future__ import annotations

import json
import stat
import threading
from pathlib import Path

import pytest

from tests.helpers import wait_for
from tests.supervisor.conftest import StandinExperiment
from workbench.config import load_orchestrator_config
from workbench.files import layout, run_control
from workbench.supervisor import paths
from workbench.supervisor.client import SupervisorClient, SupervisorError, SupervisorUnavailable
from workbench.supervisor.control_socket import ControlServer
from workbench.system.procfs import process_is_alive


@pytest.fixture
def running(standin: StandinExperiment) -> StandinExperiment:
    standin.add_runs("run_a")
    standin.start()
    standin.wait_for_event("run_a", "start")
    return standin


def test_the_socket_is_owner_only_and_no_tcp_port_is_involved(running: StandinExperiment):
    mode = paths.socket_path(running.path).stat().st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    assert stat.S_IMODE(layout.supervisor_dir(running.path).stat().st_mode) == 0o700
    reply = running.client.ping()
    assert reply["ok"] and reply["pid"] == running.started[0].pid


def test_a_raw_json_request_gets_one_json_reply(running: StandinExperiment):
    with paths.connect_unix(paths.socket_path(running.path), timeout_s=10) as sock:
        sock.sendall(b'{"cmd": "ping"}\n')
        reply = json.loads(sock.makefile().readline())
    assert reply["ok"] is True and reply["status"] in ("starting", "running")


def test_unknown_commands_and_bad_json_are_answered_with_an_error(running: StandinExperiment):
    reply = running.client.request("fly")
    assert (
        reply == {"ok": False, "error": reply["error"]}
        and "unknown command 'fly'" in reply["error"]
    )
    with paths.connect_unix(paths.socket_path(running.path), timeout_s=10) as sock:
        sock.sendall(b"not json\n")
        assert "bad request" in json.loads(sock.makefile().readline())["error"]
    reply = running.client.request("evict")
    assert not reply["ok"] and "needs 'run_id'" in reply["error"]


def test_evict_writes_the_file_and_stops_the_orchestrator(running: StandinExperiment):
    pid = running.process("run_a")["pid"]
    reply = running.client.evict("run_a", reason="diverged")
    assert reply == {"ok": True, "run_id": "run_a", "already_evicted": False, "stopped": True}
    eviction = run_control.read_eviction(running.path / "run_a")
    assert eviction.reason == "diverged" and eviction.evicted_by == "user"
    stopped = running.wait_for_process("run_a", "stopped")
    assert stopped["reason"] == "evicted: diverged"
    assert not process_is_alive(pid)
    assert running.client.evict("run_a", reason="again")["already_evicted"] is True


def test_evicting_an_unknown_run_names_the_runs_there(running: StandinExperiment):
    with pytest.raises(SupervisorError, match=r"no run 'run_zzz' .*runs: run_a"):
        running.client.evict("run_zzz")


def test_restart_run_clears_the_eviction_and_starts_the_orchestrator_again(
    running: StandinExperiment,
):
    running.client.evict("run_a", reason="diverged")
    running.wait_for_process("run_a", "stopped")
    reply = running.client.restart_run("a")  # the run_ prefix may be left out
    assert reply == {"ok": True, "run_id": "run_a", "cleared_eviction": True}
    assert run_control.read_eviction(running.path / "run_a") is None
    wait_for(
        lambda: len([e for e in running.events() if e.name == "run_a" and e.what == "start"]) == 2,
        what="a second start of run_a",
    )
    record = running.wait_for_process("run_a", "running")
    assert record["restarts"] == 1 and record["reason"] is None


def test_restart_process_stops_and_starts_the_trainer_with_a_new_pid(
    running: StandinExperiment,
):
    old_pid = running.wait_for_process("trainer", "running")["pid"]
    assert running.client.restart_process("trainer") == {"ok": True, "name": "trainer"}
    record = wait_for(
        lambda: (
            (r := running.process("trainer"))["pid"] not in (None, old_pid)
            and r["state"] == "running"
            and r
        ),
        what="a new trainer",
    )
    assert record["restarts"] == 1 and record["exits"][-1]["stop_requested"]
    assert not process_is_alive(old_pid)
    with pytest.raises(SupervisorError, match="no process 'vllm'"):
        running.client.restart_process("vllm")


def test_restart_process_of_an_evicted_run_points_to_restart_run(running: StandinExperiment):
    running.client.evict("run_a")
    running.wait_for_process("run_a", "stopped")
    with pytest.raises(SupervisorError, match=r"evicted.*workbench restart run_a"):
        running.client.restart_process("run_a")


def test_add_run_writes_the_recipe_defaults_with_overrides_and_starts_it(
    running: StandinExperiment,
):
    reply = running.client.add_run("lr1e-2", {"lr": 0.01, "sampling.temperature": 0.5})
    assert reply["ok"] and reply["run_id"] == "run_lr1e-2"
    config = load_orchestrator_config(layout.orch_config_path(running.path / "run_lr1e-2"))
    assert config.lr == 0.01 and config.sampling.temperature == 0.5
    assert config.max_steps == 7, "the recipe's [defaults] are the base"
    running.wait_for_event("run_lr1e-2", "start")


def test_add_run_refuses_bad_settings_and_taken_ids_writing_nothing(running: StandinExperiment):
    with pytest.raises(SupervisorError, match=r"lr.*greater than 0"):
        running.client.add_run("bad", {"lr": -1})
    with pytest.raises(SupervisorError, match="unknown key"):
        running.client.add_run("bad", {"learning_rate": 1})
    assert not (running.path / "run_bad").exists()
    with pytest.raises(SupervisorError, match="run_a already exists"):
        running.client.add_run("a")
    with pytest.raises(SupervisorError, match="may contain only"):
        running.client.add_run("a b")


def test_stop_all_stops_everything_and_the_supervisor_exits(running: StandinExperiment):
    children = running.standin_pids()
    assert running.client.stop_all()["ok"]
    assert running.started[0].process.wait(timeout=30) == 0
    assert not any(process_is_alive(pid) for pid in children)
    assert running.state()["status"] == "stopped"
    with pytest.raises(SupervisorUnavailable, match="no supervisor is running"):
        SupervisorClient(running.path).ping()


def test_a_socket_path_longer_than_the_unix_limit_still_works(tmp_path: Path):
    deep = tmp_path.joinpath(*["a_rather_long_directory_name"] * 5) / "supervisor"
    deep.mkdir(parents=True)
    socket_file = deep / "control.sock"
    assert len(str(socket_file)) > 108
    server = ControlServer(socket_file, threading.Event())
    server.start()

    def answer() -> None:
        pending = server.pending.get(timeout=10)
        pending.finish({"ok": True, "echo": pending.request["cmd"]})

    answering = threading.Thread(target=answer)
    answering.start()
    try:
        with paths.connect_unix(socket_file, timeout_s=10) as sock:
            sock.sendall(b'{"cmd": "ping"}\n')
            assert json.loads(sock.makefile().readline()) == {"ok": True, "echo": "ping"}
        assert stat.S_IMODE(socket_file.stat().st_mode) == 0o600
    finally:
        answering.join()
        server.close()
    assert not socket_file.exists()
