"""CLI commands around the supervisor: up, status, down, restart, runs add, logs, evict.

`up` runs the stand-in plan through $WORKBENCH_SUPERVISOR_PLAN; the other commands talk to
a stand-in supervisor started by the `standin` fixture (which stops it afterwards).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers import make_run, wait_for
from tests.supervisor.conftest import StandinExperiment
from workbench import up
from workbench.cli import app
from workbench.config import load_orchestrator_config
from workbench.files import layout, run_control
from workbench.supervisor.client import SupervisorError
from workbench.supervisor.launch import PLAN_ENV
from workbench.system.procfs import process_is_alive
from workbench.testing import standins


@pytest.fixture
def cli(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(PLAN_ENV, standins.PLAN_REFERENCE)
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, [str(arg) for arg in args], catch_exceptions=False)

    return invoke


def write_recipe(standin: StandinExperiment, *run_ids: str) -> Path:
    recipe = standin.path.parent / "recipe.toml"
    runs = "".join(f'\n[[runs]]\nid = "{run_id}"\n' for run_id in run_ids)
    recipe.write_text((standin.path / "recipe.toml").read_text() + runs)
    return recipe


# ---------------------------------------------------------------- up


def test_up_detach_starts_the_supervisor_and_a_second_up_is_refused_naming_its_pid(
    cli, standin: StandinExperiment
):
    standin.configure()
    recipe = write_recipe(standin, "a")
    result = cli("up", recipe, "--detach")
    assert result.exit_code == 0, result.output
    pid = standin.client.pid()
    assert pid is not None and f"supervisor started (pid {pid})" in result.output
    assert f"workbench attach {standin.path}" in result.output
    assert f"workbench down {standin.path}" in result.output
    standin.wait_for_event("run_a", "start")

    again = cli("up", recipe, "--detach")
    assert again.exit_code == 1
    assert f"already has a supervisor (pid {pid})" in again.output
    assert standin.client.pid() == pid


def test_up_headless_follows_progress_and_exits_0_when_every_run_finished(
    cli, standin: StandinExperiment
):
    # Runs that last a few of up's looks at the state (POLL_S), so that it sees inference
    # ready before everything stops.
    standin.configure(orchestrator={"args": ["--finish-after", str(4 * up.POLL_S)]})
    result = cli("up", write_recipe(standin, "a", "b"), "--headless", "--max-steps", "3")
    assert result.exit_code == 0, result.output
    assert re.search(r"inference: (starting -> )?ready", result.output)
    assert "run_a: finished" in result.output and "run_b: finished" in result.output
    assert "every run finished (2)" in result.output
    assert standin.client.pid() is None, "headless up returns once the supervisor has exited"
    assert "max_steps = 3" in layout.orch_config_path(standin.path / "run_a").read_text()


def test_up_headless_exits_1_naming_the_runs_that_did_not_finish(cli, standin: StandinExperiment):
    standin.configure(
        orchestrator={
            "args": ["--crash-times", "99", "--crash-after", "0"],
            "restart": {"max_restarts": 0},
        }
    )
    result = cli("up", write_recipe(standin, "a"), "--headless")
    assert result.exit_code == 1
    assert "run_a did not finish" in result.output
    assert "run_a failed: exit code 3" in result.output


# ---------------------------------------------------------------- status


def test_status_lists_processes_with_state_pid_restarts_and_uptime(cli, standin: StandinExperiment):
    standin.add_runs("run_a")
    started = standin.start()
    standin.wait_for_process("run_a", "running")
    result = cli("status", standin.path, "--json")
    assert result.exit_code == 0
    report = json.loads(result.output)
    assert report["supervisor"] == {"running": True, "pid": started.pid, "status": "running"}
    processes = {p["name"]: p for p in report["processes"]}
    assert list(processes) == ["inference", "trainer", "run_a"]
    assert processes["inference"]["state"] == "ready" and processes["inference"]["pid"] > 0
    assert processes["run_a"]["restarts"] == 0 and processes["run_a"]["uptime_s"] >= 0
    assert [r["id"] for r in report["runs"]] == ["run_a"]

    table = cli("status", standin.path)
    assert f"processes (supervisor pid {started.pid}, running)" in table.output
    assert "inference" in table.output and "ready" in table.output


def test_status_says_what_startup_is_doing_until_every_process_is_up(
    cli, standin: StandinExperiment
):
    # A stand-in inference that reports a three-step model build the way the real one
    # does (model_build.json), prints two lines, and is held at each stage by a file.
    build_done = standin.path / "build-done"
    serving = standin.path / "serving"
    inference_args = ["--experiment", standin.path, "--build-steps", 3, "--build-until"]
    inference_args += [build_done, "--say", "loading weights", "--say", "INFO serving soon"]
    inference_args += ["--ready-when", serving]
    standin.configure(
        processes=[
            {
                "name": "inference",
                "kind": "inference",
                "ready": True,
                "args": [str(arg) for arg in inference_args],
            },
            {"name": "trainer", "kind": "trainer"},
        ]
    )
    standin.start()

    def startup() -> dict:
        return json.loads(cli("status", standin.path, "--json").output)["startup"] or {}

    building = wait_for(lambda: (s := startup()).get("step") == 3 and s, what="build step 3")
    assert building["text"].startswith(
        "building model builtin:stand-in: step 3/3, stand-in step 3 of 3, "
    )
    assert "building model builtin:stand-in: step 3/3" in cli("status", standin.path).output

    build_done.touch()
    starting = wait_for(
        lambda: (s := startup()).get("last_line") == "INFO serving soon" and s,
        what="the last line of the inference log",
    )
    assert starting["phase"] == "starting" and starting["process"] == "inference"
    assert re.match(r"starting inference: \d+s, last line: INFO serving soon$", starting["text"])
    table = cli("status", standin.path).output
    assert "starting inference: " in table and "last line: INFO serving soon" in table

    serving.touch()
    ready = wait_for(lambda: (s := startup()).get("phase") == "ready" and s, what="ready")
    assert ready["text"].startswith("ready: up after ")
    table = cli("status", standin.path).output
    assert "ready" in table and "starting inference" not in table
    assert "up after" not in table, "once everything is up, status shows no phase"


def test_status_without_a_supervisor_says_so(cli, standin: StandinExperiment):
    standin.add_runs("run_a")
    result = cli("status", standin.path, "--json")
    assert json.loads(result.output)["supervisor"]["running"] is False
    assert "supervisor: not running" in cli("status", standin.path).output


# ---------------------------------------------------------------- down


def test_down_stops_everything_and_returns_once_the_supervisor_exited(
    cli, standin: StandinExperiment
):
    standin.add_runs("run_a")
    started = standin.start()
    standin.wait_for_event("run_a", "start")
    children = standin.standin_pids()
    result = cli("down", standin.path)
    assert result.exit_code == 0
    assert f"stopping the supervisor of {standin.path} (pid {started.pid})" in result.output
    assert not process_is_alive(started.pid)
    assert not any(process_is_alive(pid) for pid in children)
    assert "nothing to stop" in cli("down", standin.path).output


def test_down_after_the_supervisor_was_killed_stops_the_children_it_left(
    cli, standin: StandinExperiment
):
    standin.add_runs("run_a")
    started = standin.start()
    standin.wait_for_event("run_a", "start")
    children = standin.standin_pids()
    os.kill(started.pid, signal.SIGKILL)
    started.process.wait(timeout=10)
    result = cli("down", standin.path)
    assert result.exit_code == 0
    assert "stopped 3 process group(s) left by a supervisor that was gone" in result.output
    assert not any(process_is_alive(pid) for pid in children)


# ---------------------------------------------------------------- evict and restart


def test_evict_tells_the_supervisor_and_restart_lifts_the_eviction(cli, standin: StandinExperiment):
    standin.add_runs("run_a")
    standin.start()
    standin.wait_for_event("run_a", "start")
    result = cli("evict", "run_a", "--reason", "diverged", "--experiment", standin.path)
    assert result.exit_code == 0
    assert "the supervisor is stopping run_a's orchestrator" in result.output
    assert standin.wait_for_process("run_a", "stopped")["reason"] == "evicted: diverged"

    result = cli("restart", "run_a", "-e", standin.path)
    assert result.exit_code == 0 and "restarting run_a (eviction lifted)" in result.output
    assert run_control.read_eviction(standin.path / "run_a") is None
    wait_for(
        lambda: len([e for e in standin.events() if e.name == "run_a" and e.what == "start"]) == 2,
        what="run_a to start again",
    )


def test_restart_trainer_starts_a_new_trainer(cli, standin: StandinExperiment):
    standin.start()
    old = standin.wait_for_process("trainer", "running")["pid"]
    result = cli("restart", "trainer", "-e", standin.path)
    assert result.exit_code == 0 and "restarting trainer" in result.output
    wait_for(lambda: standin.process("trainer").get("pid") not in (None, old), what="new trainer")


def test_restart_without_a_supervisor_says_how_to_start_one(cli, standin: StandinExperiment):
    standin.add_runs("run_a")
    result = cli("restart", "run_a", "-e", standin.path)
    assert result.exit_code == 1
    assert "no supervisor is running" in result.output and "workbench up" in result.output
    unknown = cli("restart", "run_zzz", "-e", standin.path)
    assert unknown.exit_code == 1 and "no run 'run_zzz'" in unknown.output


# ---------------------------------------------------------------- runs add


def test_runs_add_through_the_supervisor_starts_the_new_run(cli, standin: StandinExperiment):
    standin.start()
    result = cli(
        "runs", "add", "lr1e-2", "--set", "lr=0.01", "--set", "sampling.temperature=0.5",
        "-e", standin.path,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "added run_lr1e-2" in result.output and "starts its orchestrator" in result.output
    config = load_orchestrator_config(layout.orch_config_path(standin.path / "run_lr1e-2"))
    assert config.lr == 0.01 and config.sampling.temperature == 0.5 and config.max_steps == 7
    standin.wait_for_event("run_lr1e-2", "start")


def test_the_supervisor_refuses_a_run_that_cannot_work_and_starts_nothing(
    cli, standin: StandinExperiment
):
    standin.start()
    result = cli("runs", "add", "b", "--set", "env_args.min_len=3", "-e", standin.path)
    assert result.exit_code == 2 and "unknown env_args key 'min_len'" in result.output
    with pytest.raises(SupervisorError, match=r"lora\.rank: rank 64 is larger"):
        standin.client.add_run("b", {"lora.rank": 64})  # as the TUI asks
    assert not (standin.path / "run_b").exists()


def test_runs_add_without_a_supervisor_writes_the_run_for_the_next_up(
    cli, standin: StandinExperiment
):
    result = cli("runs", "add", "b", "--set", "batch_size=32", "-e", standin.path)
    assert result.exit_code == 0 and "next `workbench up`" in result.output
    config = load_orchestrator_config(layout.orch_config_path(standin.path / "run_b"))
    assert config.batch_size == 32


def test_runs_add_with_bad_settings_exits_2_naming_the_key_and_writes_nothing(
    cli, standin: StandinExperiment
):
    bad_value = cli("runs", "add", "b", "--set", "lr=-1", "-e", standin.path)
    assert bad_value.exit_code == 2 and "lr" in bad_value.output
    unknown = cli("runs", "add", "b", "--set", "learnin_rate=1", "-e", standin.path)
    assert unknown.exit_code == 2 and "unknown key" in unknown.output
    malformed = cli("runs", "add", "b", "--set", "lr", "-e", standin.path)
    assert malformed.exit_code == 2 and "expected KEY=VALUE" in malformed.output
    no_env = cli("runs", "add", "b", "--set", "env=nope", "-e", standin.path)
    assert no_env.exit_code == 2 and "env: unknown environment 'nope'" in no_env.output
    assert not (standin.path / "run_b").exists()
    standin.add_runs("run_a")
    taken = cli("runs", "add", "a", "-e", standin.path)
    assert taken.exit_code == 2 and "run_a already exists" in taken.output


def test_runs_add_refuses_ids_with_path_tricks_control_characters_or_huge_sizes(
    cli, standin: StandinExperiment
):
    before = sorted(p.name for p in standin.path.iterdir())
    for bad, says in (
        ("../escape", "may contain only"),
        ("a\x1b[2Jb", "may contain only"),
        ("x" * 10_000, "at most 128"),  # was a traceback: file name too long
    ):
        result = cli("runs", "add", bad, "-e", standin.path)
        assert result.exit_code == 2 and says in result.output, result.output[-500:]
    assert sorted(p.name for p in standin.path.iterdir()) == before
    assert not (standin.path.parent / "escape").exists()


# ---------------------------------------------------------------- logs


def test_logs_prints_the_last_lines_of_a_process_or_a_run(cli, standin: StandinExperiment):
    trainer_log = layout.process_log_path(standin.path, "trainer")
    trainer_log.parent.mkdir(parents=True)
    trainer_log.write_text("".join(f"trainer line {i}\n" for i in range(100)))
    run = make_run(standin.path, "run_a")
    layout.orchestrator_log_path(run).parent.mkdir()
    layout.orchestrator_log_path(run).write_text("orchestrator says hi\n")

    result = cli("logs", "trainer", "-n", "2", "-e", standin.path)
    assert result.exit_code == 0 and result.output == "trainer line 98\ntrainer line 99\n"
    assert len(cli("logs", "trainer", "-e", standin.path).output.splitlines()) == 50
    assert cli("logs", "a", "-e", standin.path).output == "orchestrator says hi\n"

    missing = cli("logs", "inference", "-e", standin.path)
    assert missing.exit_code == 1 and "no log yet" in missing.output
    unknown = cli("logs", "run_zzz", "-e", standin.path)
    assert unknown.exit_code == 1 and "no run 'run_zzz'" in unknown.output
    assert "inference, trainer, supervisor" in unknown.output


def _interruptible() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_logs_follow_prints_lines_as_they_are_written(standin: StandinExperiment):
    log = layout.process_log_path(standin.path, "inference")
    log.parent.mkdir(parents=True)
    log.write_text("old line\n")
    follower = subprocess.Popen(
        [sys.executable, "-m", "workbench.cli", "logs", "inference", "-f", "-n", "1",
         "-e", str(standin.path)],
        stdout=subprocess.PIPE,
        text=True,
        # Ctrl-C as a terminal delivers it: the suite itself may run where SIGINT is
        # ignored (a background job of a script), which a child would inherit.
        preexec_fn=_interruptible,
    )  # fmt: skip
    try:
        assert follower.stdout.readline() == "old line\n"
        with open(log, "a") as handle:
            handle.write("new line\n")
        assert follower.stdout.readline() == "new line\n"
        log.write_text("after truncation\n")  # a restarted process may start the file over
        assert follower.stdout.readline() == "after truncation\n"
    finally:
        follower.send_signal(signal.SIGINT)
        assert follower.wait(timeout=10) == 0


# ---------------------------------------------------------------- attach and help


def test_attach_without_a_supervisor_fails_saying_how_to_start_one(cli, standin: StandinExperiment):
    result = cli("attach", standin.path)
    assert result.exit_code == 1 and "workbench up" in result.output


@pytest.mark.parametrize(
    "command",
    [["up"], ["attach"], ["down"], ["status"], ["evict"], ["restart"], ["logs"], ["runs", "add"]],
)
def test_every_command_has_a_help_page(cli, command: list[str]):
    result = cli(*command, "--help")
    assert result.exit_code == 0 and "Usage" in result.output
    assert len(result.output.splitlines()) > 8


def test_headless_lines_say_the_startup_phase_when_it_moves_and_every_ten_seconds():
    from workbench.supervisor.startup import StartupPhase
    from workbench.up import Snapshot, describe_changes

    def at(phase: StartupPhase, now: float) -> Snapshot:
        return Snapshot({}, {}, phase, now)

    since = "2026-11-21T20:00:00+00:00"
    start = dt.datetime.fromisoformat(since).timestamp()
    step_1 = StartupPhase("building model", since, step=1, steps=3, detail="initial weights")
    step_2 = StartupPhase("building model", since, step=2, steps=3, detail="warm-up update 10")
    assert describe_changes(None, at(step_1, start)) == [
        "building model: step 1/3, initial weights, 0s"
    ]
    assert describe_changes(at(step_1, start), at(step_1, start + 9)) == []
    assert describe_changes(at(step_1, start + 9), at(step_2, start + 9)) == [
        "building model: step 2/3, warm-up update 10, 9s"
    ]
    step_2_later = StartupPhase("building model", since, step=2, steps=3, detail="update 20")
    assert describe_changes(at(step_2, start + 9), at(step_2_later, start + 9.5)) == []
    starting = StartupPhase("starting", since, process="inference", last_line="a")
    later = StartupPhase("starting", since, process="inference", last_line="b")
    # A new log line alone is not a change worth a line; ten more seconds are.
    assert describe_changes(at(starting, start + 1), at(later, start + 2)) == []
    assert describe_changes(at(later, start + 9), at(later, start + 10)) == [
        "starting inference: 10s, last line: b"
    ]
    ready = StartupPhase("ready", since, detail="up after 52s")
    assert describe_changes(at(later, start + 52), at(ready, start + 52)) == ["ready: up after 52s"]
    assert describe_changes(at(ready, start + 52), at(ready, start + 600)) == []


def test_headless_lines_name_each_change_once():
    from workbench.up import Snapshot, describe_changes

    before = Snapshot(
        processes={"inference": ("starting", None), "orchestrator run_a": ("waiting", "w")},
        runs={"run_a": ("waiting", 0, 5, None)},
    )
    after = Snapshot(
        processes={
            "inference": ("ready", None),
            "orchestrator run_a": ("running", None),
            "trainer": ("backoff", "exit code 1; restart 1 of 3 in 2.0s"),
        },
        runs={"run_a": ("active", 1, 5, None), "run_b": ("evicted", 0, 5, "diverged\nmore")},
    )
    assert describe_changes(before, after) == [
        "inference: starting -> ready",
        "orchestrator run_a: waiting -> running",
        "trainer: backoff (exit code 1; restart 1 of 3 in 2.0s)",
        "run_a: active, step 1/5",
        "run_b: evicted, step 0/5: diverged",
    ]
    assert describe_changes(after, after) == []
    stepped = Snapshot(after.processes, {**after.runs, "run_a": ("active", 2, 5, None)})
    assert describe_changes(after, stepped) == ["run_a: step 2/5"]
