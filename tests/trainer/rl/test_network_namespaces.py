"""The trainer across two machines, made on this one: two network namespaces, each with its
own loopback interface and one end of a veth pair (10.77.0.1/24 and 10.77.0.2/24), so the
nodes reach each other through the pair only, as two machines do through their network. No
loopback address is shared: a rank that binds `lo` is out of the other node's reach.

Each namespace has its own /etc/hosts (`ip netns exec` mounts /etc/netns/NAME/hosts over
it), so the node names of a Slurm job resolve there as a cluster's DNS would, or to
127.0.1.1 on the node itself, as Debian's own /etc/hosts has it.

Two paths: `workbench join` (node 0's trainer as its supervisor starts it, node 1 through
the real command), and the Slurm job's per-node command. What is not real Slurm in the
latter: `srun` does not start the tasks. The one-host cluster
(`scripts/slurm_one_host.sh`) has one slurmd on this machine, outside both namespaces; a
real two-machine job would need slurmctld and a slurmd in each namespace (`slurmd -N`, a
spool directory and pid file each, a slurm.conf naming 10.77.0.x), a second cluster beside
the one the other Slurm tests use, which was not attempted. So each task is the job
script's own `run_node`, sourced from the script `workbench slurm` writes and run in its
namespace with the SLURM_* environment that srun gives task K of a two-machine job. Everything it starts is
real: the supervisor, vLLM's CPU build, the orchestrator, torchrun with gloo on both nodes.

Run as root (network namespaces need it); skipped, saying why, where they cannot be made.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.trainer.rl.test_multi_node import stops_cleanly, supervisor_state, wait_for_step
from tests.trainer.rl.test_multi_process import experiment_with_batches, write_trainer_config
from workbench.config import SlurmSection, model_to_toml
from workbench.files import layout
from workbench.files.metrics import read_metrics
from workbench.recipe import load_recipe
from workbench.slurm.job import job_for_recipe, script_path
from workbench.slurm.submit import write_job
from workbench.supervisor import paths
from workbench.supervisor.plan import Rendezvous, trainer_argv, write_rendezvous

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
ADDRESSES = ("10.77.0.1", "10.77.0.2")
NODE_NAMES = ("wbnode0", "wbnode1")
# A rank that binds the loopback interface, as before, never meets the other node's: the
# agents give up after their rendezvous timeout, and the test after this.
STEP_TIMEOUT_S = 240


@dataclass(frozen=True)
class Machines:
    """The two namespaces (node 0's first) and their ends of the veth pair."""

    namespaces: tuple[str, str]
    interfaces: tuple[str, str]

    def run_in(self, node: int, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.namespaces[node], *argv]

    def hosts(self, node: int, text: str) -> None:
        """The /etc/hosts of node `node`'s namespace."""
        directory = Path("/etc/netns") / self.namespaces[node]
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "hosts").write_text(text)


def ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True)


def make_machines(tag: str) -> Machines:
    namespaces = (f"wb{tag}n0", f"wb{tag}n1")
    interfaces = (f"wb{tag}v0", f"wb{tag}v1")
    for name in namespaces:
        made = ip("netns", "add", name)
        if made.returncode != 0:
            pytest.skip(f"`ip netns add` fails here ({made.stderr.strip()}): no namespaces")
    steps = [
        ("link", "add", interfaces[0], "type", "veth", "peer", "name", interfaces[1]),
        *[("link", "set", interfaces[n], "netns", namespaces[n]) for n in (0, 1)],
        *[("-n", namespaces[n], "addr", "add", f"{ADDRESSES[n]}/24", "dev", interfaces[n])
          for n in (0, 1)],
        *[("-n", namespaces[n], "link", "set", interfaces[n], "up") for n in (0, 1)],
        *[("-n", namespaces[n], "link", "set", "lo", "up") for n in (0, 1)],
    ]  # fmt: skip
    for step in steps:
        done = ip(*step)
        assert done.returncode == 0, f"ip {' '.join(step)}: {done.stderr}"
    return Machines(namespaces, interfaces)


def remove_machines(machines: Machines) -> None:
    """Kill what still runs in the namespaces (all of it started by this test), then remove
    them, their veth pair with them, and their /etc/netns files."""
    for name in machines.namespaces:
        pids = ip("netns", "pids", name).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        ip("netns", "del", name)
        shutil.rmtree(Path("/etc/netns") / name, ignore_errors=True)


@pytest.fixture
def machines() -> Iterator[Machines]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root: run the test as root")
    if shutil.which("ip") is None:
        pytest.skip("iproute2's `ip` is not installed (apt-get install iproute2)")
    made = make_machines(f"{os.getpid() % 100000}")
    try:
        yield made
    finally:
        remove_machines(made)


def child_environment() -> dict[str, str]:
    """This environment with the repository on PYTHONPATH, and without what would decide
    for the code under test: gloo's and nccl's interface, torchrun's rank variables."""
    dropped = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "RANK", "WORLD_SIZE")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return env


def test_a_node_joined_from_another_machine_trains_with_node_0(
    machines: Machines, tmp_path: Path, tiny_llama: Path
):
    experiment = experiment_with_batches(tmp_path / "exp", steps=1, lr=0.05)
    config, _ = write_trainer_config(tmp_path, experiment, tiny_llama)
    port = 29517
    config.trainer = config.trainer.model_copy(update={"nnodes": 2, "rendezvous_port": port})
    config_path = paths.trainer_config_path(experiment)
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(model_to_toml(config))
    # Where node 0's plan puts the store with `rendezvous_interface` set to its veth end.
    rendezvous = Rendezvous(ADDRESSES[0], port, 2)
    write_rendezvous(experiment, rendezvous)
    supervisor_state(experiment, "running")
    env = child_environment()
    node0_log = tmp_path / "node0.log"
    node1_log = layout.process_log_path(experiment, "trainer-node1")
    with node0_log.open("a") as log:
        trainer = subprocess.Popen(
            machines.run_in(0, trainer_argv(config_path, 1, rendezvous)),
            stdout=log, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    join = [sys.executable, "-m", "workbench.cli", "join", str(experiment), "--node-rank", "1"]
    joined = subprocess.Popen(
        machines.run_in(1, join), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=env,
    )  # fmt: skip
    try:
        wait_for_step(experiment, 1, trainer, joined)
        supervisor_state(experiment, "stopping")  # `workbench down` on node 0
        trainer.send_signal(signal.SIGTERM)
        assert stops_cleanly(trainer, node0_log, node1_log)
        output, _ = joined.communicate(timeout=120)
    finally:
        for process in (trainer, joined):
            if process.poll() is None:
                process.kill()
    assert joined.returncode == 0, output
    # Node 1 found its own interface, the route's to node 0, not the recipe's or `lo`.
    endpoint = f"{ADDRESSES[0]}:{port}"
    assert f"meets node 0 at {endpoint} through {machines.interfaces[1]}" in output, output
    assert f"rendezvous on {endpoint}" in node0_log.read_text()
    for run in ("run_a", "run_b"):
        assert [m["step"] for m in read_metrics(experiment / run, "trainer")] == [1]


RECIPE = """\
[experiment]
name = "two_machines"
output_dir = "outputs/two_machines"
[model]
base = "builtin:tiny-reverse"
[inference]
max_loras = 2
[trainer]
max_concurrent_runs = 1
nnodes = 2
rendezvous_port = 29518
[defaults]
env_args = { min_length = 9, max_length = 9 }
max_steps = 2
batch_size = 16
rollouts_per_prompt = 8
lr = 1e-3
checkpoint_interval = 2
eval = { interval = 0 }
[[runs]]
id = "a"
[slurm]
join_wait_s = 300
"""


def slurm_task_env(node: int) -> dict[str, str]:
    """What srun sets for task `node` of a job of one task on each of two machines."""
    nodelist = ",".join(NODE_NAMES)
    return {
        **child_environment(),
        "SLURM_JOB_ID": "4242", "SLURM_JOBID": "4242", "SLURM_STEP_ID": "0",
        "SLURM_JOB_NODELIST": nodelist, "SLURM_NODELIST": nodelist,
        "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "2", "SLURM_NTASKS": "2",
        "SLURM_NPROCS": "2", "SLURM_TASKS_PER_NODE": "1(x2)",
        "SLURM_PROCID": str(node), "SLURM_NODEID": str(node), "SLURM_LOCALID": "0",
        "SLURMD_NODENAME": NODE_NAMES[node],
    }  # fmt: skip


def write_slurm_job(tmp_path: Path) -> Path:
    """The job script `workbench slurm` writes for RECIPE (one node rank per machine),
    written through the same functions; the experiment directory."""
    (tmp_path / "recipe.toml").write_text(RECIPE)
    recipe = load_recipe(tmp_path / "recipe.toml")
    settings = SlurmSection.model_validate(recipe.slurm.model_dump())
    job = job_for_recipe(Path("recipe.toml"), recipe, settings, "token-4242", tmp_path)
    write_job(job)
    return job.experiment


def start_slurm_task(machines: Machines, node: int, experiment: Path, log: Path):
    """Task `node` of the job as srun starts it (`bash -c run_node`, with the script's
    exports), in its namespace, in the job's working directory."""
    script = script_path(experiment)
    # The script up to its srun line: its exports and `run_node`, then the task's command.
    task = f'source <(sed "/^srun /,\\$d" {script}) && run_node'
    with log.open("w") as out:
        return subprocess.Popen(
            machines.run_in(node, ["bash", "-c", task]), cwd=experiment.parents[1],
            stdout=out, stderr=subprocess.STDOUT, env=slurm_task_env(node),
        )  # fmt: skip


def cluster_hosts() -> str:
    """Both node names at their veth addresses, as a cluster's DNS answers on every node."""
    return "".join(f"{a} {n}\n" for a, n in zip(ADDRESSES, NODE_NAMES, strict=True))


def test_a_slurm_job_across_two_machines_trains_through_their_network(
    machines: Machines, tmp_path: Path
):
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[cpu]')")
    for node in (0, 1):
        machines.hosts(node, "127.0.0.1 localhost\n" + cluster_hosts())
    experiment = write_slurm_job(tmp_path)
    logs = [tmp_path / f"node{node}.out" for node in (0, 1)]
    tasks = [start_slurm_task(machines, node, experiment, logs[node]) for node in (1, 0)][::-1]
    try:
        codes = [task.wait(timeout=540) for task in tasks]
    finally:
        for task in tasks:
            if task.poll() is None:
                task.kill()
    text = {node: logs[node].read_text()[-4000:] for node in (0, 1)}
    trainer_log = layout.process_log_path(experiment, "trainer")
    assert codes == [0, 0], f"{text}\n--- trainer:\n{trainer_log.read_text()[-4000:]}"
    assert [m["step"] for m in read_metrics(experiment / "run_a", "trainer")] == [1, 2]
    endpoint = f"{ADDRESSES[0]}:29518"
    assert f"rendezvous at {endpoint}" in text[0]
    assert f"meets node 0 at {endpoint} through {machines.interfaces[1]}" in text[1], text[1]
    assert "waiting for 1 more node(s)" in trainer_log.read_text()


def test_a_slurm_job_whose_first_node_resolves_to_loopback_is_refused_naming_the_key(
    machines: Machines, tmp_path: Path
):
    # Debian's /etc/hosts: the node's own name on 127.0.1.1, the others' through DNS.
    machines.hosts(0, f"127.0.0.1 localhost\n127.0.1.1 {NODE_NAMES[0]}\n{cluster_hosts()}")
    experiment = write_slurm_job(tmp_path)
    log = tmp_path / "node0.out"
    task = start_slurm_task(machines, 0, experiment, log)
    try:
        code = task.wait(timeout=120)
    finally:
        if task.poll() is None:
            task.kill()
    output = log.read_text()
    assert code != 0, output
    assert "'127.0.1.1'" in output and "is a loopback address" in output, output
    assert "set [trainer] rendezvous_interface" in output, output
    assert not layout.process_log_path(experiment, "inference").exists(), "vLLM was started"
