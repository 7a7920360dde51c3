"""The trainer across nodes: torchrun agents started as separate nodes (`--nnodes 2`), here
both on this machine's loopback interface, meet at node 0's store and train as one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import random_batch
from tests.trainer.rl.test_multi_process import (
    WORKER,
    assert_two_ranks_trained_as_one,
    experiment_with_batches,
    torchrun,
    wait_for,
    worker_environment,
    write_trainer_config,
)
from workbench.config import model_to_toml
from workbench.files import layout
from workbench.files.rollouts import write_rollouts
from workbench.supervisor import paths
from workbench.supervisor.plan import Rendezvous, trainer_argv, write_rendezvous
from workbench.system.ports import free_port
from workbench.trainer.parallel.launch import rendezvous_args


def start_node(node_rank: int, port: int, log: Path, *worker_args: str) -> subprocess.Popen:
    """One node's launcher (torchrun's agent) with one rank running the step worker."""
    env = {k: v for k, v in worker_environment().items() if k not in ("RANK", "WORLD_SIZE")}
    return subprocess.Popen(
        [
            sys.executable, "-m", "workbench.trainer.parallel.launch", "--nproc_per_node", "1",
            *rendezvous_args("127.0.0.1", port, nnodes=2, node_rank=node_rank),
            str(WORKER), *worker_args,
        ],
        stdout=log.open("w"), stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip


def test_two_nodes_of_one_rank_train_the_same_adapters_as_one_node(tmp_path, tiny_llama):
    nodes = experiment_with_batches(tmp_path / "nodes", steps=1, lr=0.05)
    one = experiment_with_batches(tmp_path / "one", steps=1, lr=0.05)
    (tmp_path / "out_nodes").mkdir()
    (tmp_path / "out_one").mkdir()
    port = free_port()
    args = (str(nodes), str(tiny_llama), str(tmp_path / "out_nodes"))
    # Node 1 first: its agent waits for node 0's store, as a node that boots sooner would.
    agents = [start_node(rank, port, tmp_path / f"node{rank}.log", *args) for rank in (1, 0)]
    codes = [agent.wait(timeout=300) for agent in agents]
    logs = {rank: (tmp_path / f"node{rank}.log").read_text() for rank in (0, 1)}
    assert codes == [0, 0], logs
    assert f"rendezvous on 127.0.0.1:{port} (loopback only" in logs[0]
    torchrun(1, str(WORKER), str(one), str(tiny_llama), str(tmp_path / "out_one"))

    assert_two_ranks_trained_as_one(tmp_path / "out_nodes", tmp_path / "out_one")


def supervisor_state(experiment: Path, status: str) -> None:
    """What `workbench join` reads of node 0's supervisor: its status (and the trainer's)."""
    state = {"status": status, "processes": {"trainer": {"state": "running"}}}
    layout.atomic_write_text(paths.state_path(experiment), json.dumps(state))


def wait_for_step(experiment: Path, step: int, *processes: subprocess.Popen) -> None:
    for run in ("run_a", "run_b"):
        for process in processes:
            assert process.poll() is None, f"{process.args[:4]} exited with {process.returncode}"
        wait_for(layout.broadcast_dir(experiment / run, step), processes[0])


def stops_cleanly(trainer: subprocess.Popen, *logs: Path) -> bool:
    """Whether node 0's trainer exits 0 within two minutes of its SIGTERM; on a failure, the
    nodes' logs say why."""
    try:
        return trainer.wait(timeout=120) == 0
    except subprocess.TimeoutExpired:
        tails = "\n".join(f"--- {log}:\n{log.read_text()[-3000:]}" for log in logs if log.exists())
        pytest.fail(f"node 0's trainer still runs 120 s after its SIGTERM\n{tails}")


@pytest.mark.slow  # four trainers start, one after the other: minutes on a busy machine
def test_a_joined_node_trains_restarts_its_agent_with_node_0_and_leaves_when_it_stops(
    tmp_path, tiny_llama
):
    experiment = experiment_with_batches(tmp_path / "exp", steps=1, lr=0.05)
    config, _ = write_trainer_config(tmp_path, experiment, tiny_llama)
    port = free_port()
    config.trainer = config.trainer.model_copy(update={"nnodes": 2, "rendezvous_port": port})
    config_path = paths.trainer_config_path(experiment)
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(model_to_toml(config))
    rendezvous = Rendezvous("127.0.0.1", port, 2)
    write_rendezvous(experiment, rendezvous)
    supervisor_state(experiment, "running")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    log = (tmp_path / "node0.log").open("a")
    logs = (tmp_path / "node0.log", layout.process_log_path(experiment, "trainer-node1"))

    def node0() -> subprocess.Popen:  # what node 0's supervisor starts, and restarts
        argv = trainer_argv(config_path, 1, rendezvous)
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)

    trainer = node0()
    joined = subprocess.Popen(
        [sys.executable, "-m", "workbench.cli", "join", str(experiment), "--node-rank", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    try:
        wait_for_step(experiment, 1, trainer, joined)
        trainer.send_signal(signal.SIGTERM)  # a stray stop: the supervisor restarts it
        assert stops_cleanly(trainer, *logs)
        for name, seed in (("run_a", 1), ("run_b", 2)):
            write_rollouts(experiment / name, random_batch(name, 1, 10, seed=seed))
        trainer = node0()
        wait_for_step(experiment, 2, trainer, joined)

        supervisor_state(experiment, "stopping")  # `workbench down` on node 0
        trainer.send_signal(signal.SIGTERM)
        assert stops_cleanly(trainer, *logs)
        output, _ = joined.communicate(timeout=120)
    finally:
        for process in (trainer, joined):
            if process.poll() is None:
                process.kill()
    assert joined.returncode == 0, output
    assert output.count("trainer agent meets node 0 at 127.0.0.1") == 2, output
    assert "leaving: its supervisor is stopping" in output
    assert layout.process_log_path(experiment, "trainer-node1").is_file()
    node0_log = (tmp_path / "node0.log").read_text()
    assert node0_log.count(f"rendezvous on 127.0.0.1:{port} (loopback only") == 2
    assert "waiting for 1 more node(s)" in node0_log
