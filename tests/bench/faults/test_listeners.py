"""The fault benchmark's listener check, on real processes named in a hand-written
state.json: the trainer's process family may listen on 127.0.0.1, nowhere else."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.bench.faults.experiment import FaultExperiment
from workbench.bench.faults.security import listening_problems
from workbench.supervisor import paths

# A child that listens on the address it is given, says so, then waits to be killed.
LISTENER = """
import socket, sys, time
sock = socket.socket()
sock.bind((sys.argv[1], 0))
sock.listen()
print(sock.getsockname()[1], flush=True)
time.sleep(600)
"""


@pytest.fixture
def experiment(tmp_path: Path) -> FaultExperiment:
    exp = FaultExperiment(tmp_path, max_steps=4, checkpoint_interval=2)
    paths.state_path(exp.path).parent.mkdir(parents=True)
    return exp


def start_listener(host: str) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-c", LISTENER, host], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None and process.stdout.readline().strip().isdigit()
    return process


def name_as(exp: FaultExperiment, name: str, pid: int) -> None:
    state = {"pid": None, "processes": {name: {"pid": pid, "state": "running"}}}
    paths.state_path(exp.path).write_text(json.dumps(state))


@pytest.mark.parametrize(("host", "problems"), [("127.0.0.1", 0), ("0.0.0.0", 1)])
def test_the_trainer_may_listen_on_127_0_0_1_only(
    experiment: FaultExperiment, host: str, problems: int
):
    trainer = start_listener(host)
    try:
        name_as(experiment, "trainer", trainer.pid)
        found = listening_problems(experiment)
    finally:
        trainer.kill()
        trainer.wait()
    assert len(found) == problems, found
    assert all("trainer" in line and "not 127.0.0.1" in line for line in found)


def test_a_listener_outside_vllm_and_the_trainer_is_a_problem(experiment: FaultExperiment):
    stranger = start_listener("127.0.0.1")
    try:
        name_as(experiment, "run_a", stranger.pid)  # an orchestrator has no business listening
        found = listening_problems(experiment)
    finally:
        stranger.kill()
        stranger.wait()
    assert len(found) == 1 and f"pid {stranger.pid}" in found[0], found
