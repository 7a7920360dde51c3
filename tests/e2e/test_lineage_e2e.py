"""A fork end to end, with every real part (vLLM's CPU build, the torchrun trainer, the
orchestrators, the supervisor, the built-in tiny model): `workbench runs fork` of a run
that is still training, picked up by the running supervisor, trained from the forked step
to its own max_steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.cli import workbench
from tests.helpers import wait_for
from workbench.config import load_orchestrator_config
from workbench.files import layout, run_control
from workbench.files.metrics import read_metrics

pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[cpu]')")
pytestmark = pytest.mark.slow

TEN_MINUTES = 10 * 60.0  # a step of the real experiment on 2 cores takes tens of seconds
# This checkout's workbench in every child, whichever one the environment installed.

RECIPE = """\
[experiment]
name = "lineage"
output_dir = "outputs/lineage"
[model]
base = "builtin:tiny-reverse"
[inference]
max_loras = 2
[trainer]
max_concurrent_runs = 2
[defaults]
env_args = { min_length = 5, max_length = 5 }
# Long enough to be training still when the fork comes (10 steps once took 6 s here, and
# the experiment stopped with its only run finished before the fork was made).
max_steps = 1000
batch_size = 32
rollouts_per_prompt = 8
lr = 3e-3
checkpoint_interval = 2
eval = { interval = 0 }
[[runs]]
id = "a"
"""


def test_a_fork_of_a_running_run_starts_at_its_step_with_its_adapter_and_trains_to_its_own_end(
    tmp_path: Path,
):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(RECIPE)
    experiment = tmp_path / "outputs" / "lineage"
    source, fork = experiment / "run_a", experiment / "run_b"
    try:
        started = workbench("up", str(recipe), "--detach", cwd=tmp_path, timeout=300)
        assert started.returncode == 0, started.stdout + started.stderr
        wait_for(
            lambda: layout.checkpoint_steps(source, "trainer"),
            TEN_MINUTES,
            "a checkpoint of run_a",
            every_s=0.5,
        )
        # Its newest kept checkpoint (it trains on meanwhile: a step named here could be
        # pruned by the time the fork copies it, which the fork refuses), and 20 steps past
        # the newest seen now, whatever run_a reached while the command started.
        max_steps = max(layout.checkpoint_steps(source, "trainer")) + 20
        forked = workbench(
            "runs", "fork", "run_a", "b", "--set", f"max_steps={max_steps}",
            "--set", "lr=1e-3", "-e", str(experiment), cwd=tmp_path,
        )  # fmt: skip
        assert forked.returncode == 0, forked.stdout + forked.stderr
        wait_for(lambda: run_control.is_finished(fork), TEN_MINUTES, "run_b to finish", every_s=0.5)
    finally:
        if (experiment / "supervisor").exists():
            workbench("down", str(experiment), cwd=tmp_path, timeout=180)

    step = load_orchestrator_config(layout.orch_config_path(fork)).forked_from.step
    assert step % 2 == 0 and 2 <= step < max_steps
    generated = [m for m in read_metrics(fork, "orchestrator") if m.get("written", True)]
    # Its first batch is the forked step's, sampled with the forked adapter, not the base.
    assert sorted(m["step"] for m in generated) == list(range(step, max_steps))
    assert min(generated, key=lambda m: m["step"])["policy_version"] == step
    trainer_lines = read_metrics(fork, "trainer")
    assert sorted(m["step"] for m in trainer_lines) == list(range(step + 1, max_steps + 1))
    assert all(line["lr"] == 1e-3 for line in trainer_lines)  # its own lr, not run_a's
    assert layout.latest_stable_step(layout.broadcasts_dir(fork)) == max_steps
    trainer_log = (experiment / "logs" / "trainer.log").read_text()
    assert f"run run_b resumes at step {step}" in trainer_log

    status = json.loads(workbench("status", str(experiment), "--json", cwd=tmp_path).stdout)
    runs = {run["id"]: run for run in status["runs"]}
    assert runs["run_b"]["forked_from"] == {"run": "run_a", "step": step}
    assert runs["run_b"]["status"] == "finished" and runs["run_b"]["step"] == max_steps
