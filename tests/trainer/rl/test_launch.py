"""The trainer as the supervisor starts it (`python -m workbench.trainer.parallel.launch`, torchrun's
agent and its workers): a SIGTERM stop is a clean exit, a killed agent leaves no worker,
and nothing of it listens beyond 127.0.0.1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.helpers import make_run
from tests.trainer.rl.test_multi_process import (
    experiment_with_batches,
    wait_for,
    write_trainer_config,
)
from workbench.files import layout
from workbench.system.procfs import child_pids, process_is_alive
from workbench.trainer.parallel.launch import rendezvous_args
from workbench.trainer.runs.checkpoint import remove_killed_writes

RUNS = ("run_a", "run_b")


def start_trainer(
    tmp_path: Path, tiny_llama: Path, ranks: int = 1
) -> tuple[subprocess.Popen, Path]:
    """Two runs with two batches each and no interval checkpoint before step 100."""
    experiment = experiment_with_batches(
        tmp_path / "exp", steps=2, lr=0.05, checkpoint_interval=100
    )
    _, config_path = write_trainer_config(tmp_path, experiment, tiny_llama)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    log = open(tmp_path / "trainer.log", "w")  # noqa: SIM115 - the child holds it
    launcher = subprocess.Popen(
        [
            sys.executable, "-m", "workbench.trainer.parallel.launch", "--nproc_per_node", str(ranks),
            *rendezvous_args(), "-m", "workbench.trainer.rl.trainer", "--config", str(config_path),
        ],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )  # fmt: skip
    for run in RUNS:
        wait_for(layout.broadcast_dir(experiment / run, 2), launcher)
    return launcher, experiment


def wait_gone(pid: int, timeout: float = 120) -> bool:
    deadline = time.monotonic() + timeout
    while process_is_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not process_is_alive(pid)


def test_sigterm_to_the_trainers_group_checkpoints_every_run_and_exits_0(tmp_path, tiny_llama):
    launcher, experiment = start_trainer(tmp_path, tiny_llama)
    os.killpg(launcher.pid, signal.SIGTERM)  # what the supervisor sends on `down`
    code = launcher.wait(timeout=120)
    log = (tmp_path / "trainer.log").read_text()
    # torchrun itself exits 1 here: its agent turns SIGTERM into an exception.
    assert code == 0, log[-3000:]
    for run in RUNS:
        assert layout.is_stable(layout.checkpoint_part_dir(experiment / run, 2, "trainer")), run


def test_a_killed_torchrun_agent_leaves_no_worker_and_the_worker_checkpoints(tmp_path, tiny_llama):
    launcher, experiment = start_trainer(tmp_path, tiny_llama)
    workers = child_pids(launcher.pid)
    assert len(workers) == 1, workers
    try:
        launcher.kill()
        launcher.wait()
        # torchrun starts its worker in a session of its own: without the parent-death
        # signal it trained on, unsupervised, beside the trainer that replaced it.
        assert wait_gone(workers[0]), "the worker outlived its torchrun agent"
    finally:
        if process_is_alive(workers[0]):
            os.kill(workers[0], signal.SIGKILL)
    for run in RUNS:
        assert layout.is_stable(layout.checkpoint_part_dir(experiment / run, 2, "trainer")), run


def tcp_listeners(process: psutil.Process) -> list[str]:
    """`ip:port` of every TCP socket `process` listens on."""
    return [
        f"{conn.laddr.ip}:{conn.laddr.port}"
        for conn in process.net_connections(kind="tcp")
        if conn.status == psutil.CONN_LISTEN
    ]


def test_the_trainer_listens_on_127_0_0_1_only(tmp_path, tiny_llama):
    """torchrun's store (in the agent) and gloo's ranks (two workers) answer only on the
    loopback interface; the store listened on every interface before."""
    launcher, _ = start_trainer(tmp_path, tiny_llama, ranks=2)
    try:
        agent = psutil.Process(launcher.pid)
        store = tcp_listeners(agent)
        everything = [where for p in [agent, *agent.children()] for where in tcp_listeners(p)]
    finally:
        os.killpg(launcher.pid, signal.SIGTERM)
        launcher.wait(timeout=120)
    assert store, "the agent holds the rendezvous store: it listens"
    assert [where for where in everything if not where.startswith("127.0.0.1:")] == []


def test_a_starting_trainer_removes_what_a_killed_one_left_half_written(tmp_path: Path):
    """A run that finished while the trainer was down is never written again: the staged
    checkpoint a SIGKILL interrupted would stay forever."""
    run = make_run(tmp_path, "run_a")
    part = layout.checkpoint_part_dir(run, 16, "trainer")
    staged = part.parent / ".trainer.x1y2.tmp"
    staged.mkdir(parents=True)
    (staged / "adapter.safetensors").write_bytes(b"half")
    orchestrator_part = layout.checkpoint_part_dir(run, 16, "orchestrator")
    orchestrator_part.mkdir()
    broadcast = layout.broadcasts_dir(run) / ".step_16.abcd.tmp"
    broadcast.mkdir(parents=True)
    remove_killed_writes(tmp_path)
    assert not staged.exists() and not broadcast.exists()
    assert orchestrator_part.is_dir(), "the orchestrator's own checkpoint is not the trainer's"
