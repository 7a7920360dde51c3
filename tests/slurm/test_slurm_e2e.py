"""`workbench slurm --submit` against a real Slurm (the one-host cluster of
`scripts/slurm_one_host.sh`): the built-in model's recipe with `[trainer] nnodes = 2`, both
node ranks as two tasks on this one machine (`[slurm] tasks_per_node = 2`), each its own
node rank: node 0 runs `up --headless` (vLLM, the orchestrator, its trainer rank), node 1
`join`s. Every real part runs: sbatch, srun, vLLM's CPU build, torchrun with gloo."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workbench.files import layout
from workbench.files.metrics import read_metrics
from workbench.system.ports import free_port

pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[cpu]')")
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
WORKBENCH = [sys.executable, "-m", "workbench.cli"]
# This checkout's workbench in every child (sbatch passes the environment on to the job).
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
}

RECIPE = """\
[experiment]
name = "two_nodes"
output_dir = "outputs/two_nodes"
[model]
base = "builtin:tiny-reverse"
[inference]
max_loras = 2
[trainer]
max_concurrent_runs = 1
nnodes = 2
rendezvous_port = {port}
[defaults]
# Strings the built-in model does not reverse perfectly yet, at a rate that keeps it so:
# a batch whose every prompt's completions agree has no signal, and three such in a row
# evict the run, which must train until scancel.
env_args = {{ min_length = 9, max_length = 9 }}
max_steps = {max_steps}
batch_size = 16
rollouts_per_prompt = 8
lr = 1e-3
checkpoint_interval = 2
eval = {{ interval = 0 }}
[[runs]]
id = "a"
[slurm]
tasks_per_node = 2   # both node ranks on this one machine
time = "10:00"
"""


def workbench(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*WORKBENCH, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=ENV
    )


def submit(tmp_path: Path, max_steps: int) -> tuple[str, Path]:
    (tmp_path / "recipe.toml").write_text(RECIPE.format(port=free_port(), max_steps=max_steps))
    result = workbench("slurm", "recipe.toml", "--submit", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    job_id = re.search(r"submitted job (\d+)", result.stdout)
    assert job_id, result.stdout
    return job_id.group(1), tmp_path / "outputs" / "two_nodes"


def job_state(job_id: str) -> dict[str, str]:
    """`scontrol show job`'s fields (JobState, ExitCode, ...)."""
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    return dict(field.split("=", 1) for field in out.split() if "=" in field)


def wait_for_job_end(job_id: str, timeout_s: float) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = job_state(job_id)
        if state.get("JobState") not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            return state
        time.sleep(2)
    subprocess.run(["scancel", job_id])
    pytest.fail(f"job {job_id} still runs after {timeout_s:.0f} s: {job_state(job_id)}")


def job_logs(experiment: Path) -> str:
    return "\n".join(
        f"--- {path.name}\n{path.read_text()[-3000:]}"
        for path in sorted((experiment / "slurm").glob("job-*.out"))
    )


def processes_under(directory: Path) -> list[str]:
    """Command lines of this machine's processes that name a path under `directory`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(directory) in cmdline:
            found.append(f"{proc.name}: {cmdline[:200]}")
    return found


def status_json(experiment: Path) -> dict:
    result = workbench("status", str(experiment), "--json", cwd=experiment.parent)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_two_node_recipe_submitted_through_sbatch_trains_to_the_end(
    tmp_path: Path, slurm_cluster: str
):
    steps = 4
    job_id, experiment = submit(tmp_path, max_steps=steps)
    ended = wait_for_job_end(job_id, timeout_s=600)
    logs = job_logs(experiment)
    assert ended["JobState"] == "COMPLETED" and ended["ExitCode"] == "0:0", f"{ended}\n{logs}"

    run = experiment / "run_a"
    trained = sorted(m["step"] for m in read_metrics(run, "trainer"))
    assert trained == list(range(1, steps + 1)), logs
    assert layout.latest_stable_step(layout.broadcasts_dir(run)) == steps
    # Both node ranks met: node 0's store waited for node 1, whose agent met it.
    assert (
        "waiting for 1 more node(s)" in layout.process_log_path(experiment, "trainer").read_text()
    )
    node1 = (experiment / "slurm" / f"job-{job_id}-node1.out").read_text()
    assert "trainer agent meets node 0 at 127.0.0.1" in node1, logs
    assert "leaving: its supervisor is" in node1, logs

    status = status_json(experiment)
    assert [r["status"] for r in status["runs"]] == ["finished"]
    nodes = {node["node_rank"]: node for node in status["nodes"]}
    assert set(nodes) == {0, 1}
    assert nodes[0]["host"] == nodes[1]["host"] == slurm_cluster
    assert nodes[1]["state"] == "left" and nodes[1]["restarts"] == 0, nodes
    assert processes_under(tmp_path) == []


def test_scancel_stops_every_process_of_the_job_and_keeps_its_checkpoints(
    tmp_path: Path, slurm_cluster: str
):
    job_id, experiment = submit(tmp_path, max_steps=500)
    run = experiment / "run_a"
    # vLLM's start dominates: under two minutes on an idle 2-core machine, over three on
    # a loaded one.
    deadline = time.monotonic() + 480
    while (layout.latest_checkpoint_step(run, "trainer") or 0) < 2:
        state = job_state(job_id).get("JobState")
        assert state in ("PENDING", "RUNNING", "CONFIGURING"), f"{state}\n{job_logs(experiment)}"
        assert time.monotonic() < deadline, job_logs(experiment)
        time.sleep(1)
    # While it trains, status shows both nodes running on this host.
    nodes = {node["node_rank"]: node for node in status_json(experiment)["nodes"]}
    assert nodes[0]["state"] == "running" and nodes[1]["state"] == "running", nodes
    assert nodes[1]["host"] == slurm_cluster
    kept_before = layout.checkpoint_steps(run, "trainer")

    subprocess.run(["scancel", job_id], check=True)
    ended = wait_for_job_end(job_id, timeout_s=90)
    assert ended["JobState"] == "CANCELLED", ended
    deadline = time.monotonic() + 30
    while (left := processes_under(tmp_path)) and time.monotonic() < deadline:
        time.sleep(1)
    assert left == [], "\n".join(left)

    # The newest checkpoint written before is still there, whole (STABLE; the trainer keeps
    # its newest few, so an older one may have been pruned), and the trainer's last update
    # is in one: SIGTERM made it checkpoint what it had trained, node 1's ranks staying
    # until it had.
    kept = layout.checkpoint_steps(run, "trainer")
    assert kept_before[-1] in kept, (kept_before, kept)
    trained = max(m["step"] for m in read_metrics(run, "trainer"))
    assert kept[-1] == trained, (kept, trained, job_logs(experiment))
    staging = [p.name for p in layout.checkpoints_dir(run).iterdir() if p.name.startswith(".")]
    assert staging == [], "a checkpoint was left half-written"
