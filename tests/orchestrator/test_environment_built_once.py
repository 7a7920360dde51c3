"""An orchestrator builds its run's environment once: the one it checked before waiting for
anything is the one it trains with. A verifiers environment is a process of its own that
loads its taskset when it starts; built twice, every orchestrator start paid that twice."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import make_run
from tests.orchestrator.scripted import ScriptedChat, publish_adapter, scripted_server
from workbench.envs.reverse_text import ReverseText
from workbench.files.metrics import read_metrics

BUILDS_FILE = "WORKBENCH_TEST_ENV_BUILDS"
REPOSITORY = Path(__file__).resolve().parents[2]


class CountedReverseText(ReverseText):
    """reverse_text, noting each time it is built in the file $WORKBENCH_TEST_ENV_BUILDS."""

    def __init__(self, args=None) -> None:
        super().__init__(args)
        with open(os.environ[BUILDS_FILE], "a") as builds:
            builds.write(f"{os.getpid()}\n")


def test_the_orchestrator_trains_with_the_environment_it_checked(experiment: Path, tmp_path):
    builds = tmp_path / "builds.txt"
    run = make_run(
        experiment,
        "run_a",
        f'env = "{__name__}:CountedReverseText"\nmax_steps = 1\nbatch_size = 4\n'
        "rollouts_per_prompt = 2\n",
    )
    with scripted_server(experiment, ScriptedChat()):
        process = subprocess.Popen(
            [sys.executable, "-m", "workbench.orchestrator", "--run-dir", str(run)],
            cwd=REPOSITORY,
            env={**os.environ, BUILDS_FILE: str(builds)},
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 120  # a bound on a hang, not a speed requirement
            while not read_metrics(run, "orchestrator") and process.poll() is None:
                assert time.monotonic() < deadline
                time.sleep(0.1)
            publish_adapter(run, 1)
            _, stderr = process.communicate(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert process.returncode == 0, stderr[-2000:]
    assert read_metrics(run, "orchestrator")[0]["step"] == 0
    assert builds.read_text().splitlines() == [str(process.pid)], "built once, by the process"
