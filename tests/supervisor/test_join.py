"""`workbench join` before it starts anything: which node it may join as, where node 0's
store is, and when the experiment has a trainer to join (the loop itself runs in
tests/trainer/rl/test_multi_node.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from workbench.config import ModelSection, TrainerConfig, TrainerSection, model_to_toml
from workbench.files import layout
from workbench.supervisor import paths
from workbench.supervisor.join import (
    AgentInterrupted,
    JoinError,
    JoiningNode,
    join,
    joining_node,
    run_agent,
    trainer_phase,
    wait_for_supervisor,
)
from workbench.supervisor.plan import Rendezvous, write_rendezvous


def node_0_started(experiment: Path, nnodes: int = 2, output_dir: Path | None = None) -> None:
    """What `workbench up` on node 0 leaves for the other nodes."""
    port = 29400 if nnodes > 1 else 0
    config = TrainerConfig(
        output_dir=output_dir or experiment,
        model=ModelSection(base="builtin:tiny-reverse"),
        trainer=TrainerSection(nproc_per_node=3, nnodes=nnodes, rendezvous_port=port),
    )
    paths.trainer_config_path(experiment).parent.mkdir(parents=True)
    paths.trainer_config_path(experiment).write_text(model_to_toml(config))
    write_rendezvous(experiment, Rendezvous("10.1.2.3", port, nnodes))


def test_a_node_joins_with_node_0s_config_and_store_address(experiment: Path):
    node_0_started(experiment, nnodes=3)
    node = joining_node(experiment, 2, interface="lo")
    argv = node.argv
    assert argv[argv.index("--nproc_per_node") + 1] == "3"
    assert argv[argv.index("--nnodes") + 1] == "3"
    assert argv[argv.index("--rdzv-endpoint") + 1] == "10.1.2.3:29400"
    assert argv[argv.index("--rdzv-conf") + 1] == "node_rank=2"
    assert argv[-1] == str(paths.trainer_config_path(experiment))
    assert node.env["GLOO_SOCKET_IFNAME"] == node.env["NCCL_SOCKET_IFNAME"] == "lo"
    assert node.log_path.name == "trainer-node2.log"


@pytest.mark.parametrize(
    ("nnodes", "node_rank", "refusal"),
    [
        (1, 1, "runs on one node"),
        (2, 2, "--node-rank 2 is not one of 1..1"),
    ],
)
def test_a_rank_the_experiment_has_no_room_for_is_refused(
    experiment: Path, nnodes: int, node_rank: int, refusal: str
):
    node_0_started(experiment, nnodes=nnodes)
    with pytest.raises(JoinError, match=refusal):
        joining_node(experiment, node_rank)


def test_an_experiment_not_started_or_mounted_elsewhere_is_refused(tmp_path: Path):
    with pytest.raises(JoinError, match="start the experiment with `workbench up`"):
        joining_node(tmp_path, 1)
    elsewhere = tmp_path / "mnt" / "exp"
    elsewhere.mkdir(parents=True)
    node_0_started(tmp_path, output_dir=elsewhere)
    with pytest.raises(JoinError, match="at the same path on every node"):
        joining_node(tmp_path, 1)


def test_an_interface_this_node_lacks_is_refused(experiment: Path):
    node_0_started(experiment)
    with pytest.raises(JoinError, match="no network interface 'nosuch0'"):
        joining_node(experiment, 1, interface="nosuch0")


def test_the_join_runs_while_the_supervisor_runs_and_its_trainer_may_restart():
    def state(status: str, trainer: str) -> dict:
        return {"status": status, "processes": {"trainer": {"state": trainer}}}

    assert trainer_phase(state("running", "backoff"))[0] == "running"
    assert trainer_phase(state("starting", "waiting"))[0] == "running"
    assert trainer_phase(state("stopping", "stopping"))[0] == "stopped"
    assert trainer_phase(None)[0] == "stopped"
    assert trainer_phase(state("running", "failed")) == (
        "failed",
        "its trainer has failed and will not be restarted",
    )


def write_supervisor_state(experiment: Path, status: str, stamp: str) -> None:
    state = {"status": status, "processes": {"trainer": {"state": "running"}}, "updated_at": stamp}
    paths.state_path(experiment).parent.mkdir(parents=True, exist_ok=True)
    paths.state_path(experiment).write_text(json.dumps(state))


def agent_standing_in(experiment: Path, seconds: float) -> JoiningNode:
    """This node as `join` runs it, with a process that sleeps in place of torchrun's agent
    (a real agent needs node 0's trainer)."""
    return JoiningNode(
        experiment=experiment,
        node_rank=1,
        nnodes=2,
        argv=[sys.executable, "-c", f"import time; time.sleep({seconds})"],
        env=dict(os.environ),
        log_path=experiment / "logs" / "trainer-node1.log",
        endpoint="127.0.0.1:29400",
    )


def test_a_join_whose_supervisor_went_silent_stops_its_agent_and_leaves(experiment: Path):
    # Killed outright, node 0's supervisor leaves a state.json that says "running" for ever.
    write_supervisor_state(experiment, "running", "2026-01-01T00:00:00.000Z")
    said: list[str] = []
    started = time.monotonic()
    code = join(agent_standing_in(experiment, 60), said.append, silent_s=1.0, watch_s=0.1)
    assert code == 1 and time.monotonic() - started < 30, "the agent was stopped, not awaited"
    assert "its supervisor has not written" in said[-1] and "killed outright" in said[-1]


def test_a_join_whose_supervisor_keeps_writing_its_state_runs_until_the_experiment_stops(
    experiment: Path,
):
    write_supervisor_state(experiment, "running", "0")
    stop = threading.Event()

    def supervisor_heartbeat() -> None:  # as the daemon does, more often than `silent_s`
        for beat in range(1, 1000):
            if stop.wait(0.2):
                return
            write_supervisor_state(experiment, "running" if beat < 15 else "stopping", str(beat))

    beating = threading.Thread(target=supervisor_heartbeat)
    beating.start()
    said: list[str] = []
    try:
        code = join(
            agent_standing_in(experiment, 0.5), said.append, pause_s=0.1, silent_s=1.0, watch_s=0.1
        )
    finally:
        stop.set()
        beating.join()
    assert code == 0 and said[-1].endswith("leaving: its supervisor is stopping"), said
    assert sum("exited with status 0" in line for line in said) >= 2, "agents ran to their end"


def node_file(experiment: Path) -> dict:
    return json.loads(layout.node_status_path(experiment, 1).read_text())


def test_a_join_reports_its_node_restarts_and_leaving_in_its_node_file(experiment: Path):
    write_supervisor_state(experiment, "running", "0")
    stop = threading.Event()

    def supervisor_heartbeat() -> None:
        for beat in range(1, 1000):
            if stop.wait(0.2):
                return
            write_supervisor_state(experiment, "running" if beat < 10 else "stopping", str(beat))

    beating = threading.Thread(target=supervisor_heartbeat)
    beating.start()
    seen: list[str] = []
    try:
        code = join(
            agent_standing_in(experiment, 0.5),
            lambda line: seen.append(node_file(experiment)["state"]),
            pause_s=0.1,
            silent_s=1.0,
            watch_s=0.1,
        )
    finally:
        stop.set()
        beating.join()
    assert code == 0
    record = node_file(experiment)
    assert record["state"] == "left" and record["host"] == socket.gethostname()
    assert record["restarts"] >= 1 and record["node_rank"] == 1 and record["nnodes"] == 2
    assert seen[0] == "running", seen


def test_a_join_that_finds_no_experiment_running_reports_it_failed(experiment: Path):
    write_supervisor_state(experiment, "stopped", "0")
    assert join(agent_standing_in(experiment, 0.1), lambda _: None) == 1
    assert node_file(experiment)["state"] == "failed"


def test_a_node_started_with_node_0_waits_for_a_live_supervisor_not_a_stale_file(
    experiment: Path,
):
    # The state.json of an earlier supervisor, killed outright: it says "running".
    write_supervisor_state(experiment, "running", "old")
    said: list[str] = []
    assert not wait_for_supervisor(experiment, 0.5, said.append, poll_s=0.05)
    write_rendezvous(experiment, Rendezvous("127.0.0.1", 29400, 2))

    def supervisor_starts() -> None:
        time.sleep(0.3)
        write_supervisor_state(experiment, "starting", "new")

    threading.Thread(target=supervisor_starts).start()
    started = time.monotonic()
    assert wait_for_supervisor(experiment, 10, said.append, poll_s=0.05)
    assert time.monotonic() - started < 5


def agent_that_leaves_after(experiment: Path, seconds: float) -> JoiningNode:
    """A stand-in agent that ignores SIGTERM, as a rank of a node other than 0 does, and
    leaves `seconds` later, as it does once node 0's trainer has checkpointed; it marks a
    file when it leaves by itself."""
    left = experiment / "left-by-itself"
    script = (
        "import signal, time, pathlib; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"time.sleep({seconds}); pathlib.Path({str(left)!r}).touch()"
    )
    node = agent_standing_in(experiment, 0)
    return dataclasses.replace(node, argv=[sys.executable, "-c", script])


def interrupt() -> bool:
    raise KeyboardInterrupt  # Ctrl-C or SIGTERM (`sigterm_as_interrupt`), as the join sees it


def test_a_join_stopped_with_node_0_lets_its_ranks_leave_after_node_0_checkpoints(
    experiment: Path,
):
    # scancel signals every node at once: killing this node's ranks then would break the
    # collective node 0's trainer checkpoints after, losing its last update.
    experiment.mkdir(parents=True, exist_ok=True)
    node = agent_that_leaves_after(experiment, 1.5)
    with pytest.raises(AgentInterrupted) as stopped:
        run_agent(node, stop_when=interrupt, watch_s=0.1, node_0_stopping=lambda: True)
    assert not stopped.value.ranks_killed
    assert (experiment / "left-by-itself").exists()


def test_a_join_stopped_alone_kills_its_ranks_without_waiting_long(experiment: Path):
    experiment.mkdir(parents=True, exist_ok=True)
    node = agent_that_leaves_after(experiment, 30)
    started = time.monotonic()
    with pytest.raises(AgentInterrupted) as stopped:
        run_agent(
            node, stop_when=interrupt, watch_s=0.1, node_0_stopping=lambda: False, alone_s=0.5
        )
    assert stopped.value.ranks_killed and time.monotonic() - started < 10
    assert not (experiment / "left-by-itself").exists()
