"""`workbench slurm RECIPE`: the batch script it writes, and what it refuses before anything is
written or submitted, naming the key. The refusals that ask the cluster run against the
one-host Slurm of `scripts/slurm_one_host.sh`; the rest need no Slurm."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from workbench.cli import app
from workbench.slurm import checks
from workbench.slurm.checks import filesystem_problem, gres_gpus
from workbench.slurm.job import SlurmJob

RECIPE = """\
[experiment]
name = "two_nodes"
output_dir = "outputs/two_nodes"
[model]
base = "builtin:tiny-reverse"
[trainer]
nnodes = 2
nproc_per_node = {nproc}
rendezvous_port = 29400
[defaults]
env = "reverse_text"
max_steps = 4
[[runs]]
id = "a"
[slurm]
{slurm}
"""


@pytest.fixture
def slurm_cli(tmp_path: Path, monkeypatch):
    """`workbench slurm` on a recipe with the given `[slurm]` lines, run in tmp_path."""
    monkeypatch.chdir(tmp_path)

    def invoke(*args: str, slurm: str = "", nproc: int = 1):
        (tmp_path / "recipe.toml").write_text(RECIPE.format(slurm=slurm, nproc=nproc))
        return CliRunner().invoke(app, ["slurm", "recipe.toml", *args], catch_exceptions=False)

    return invoke


def test_the_script_runs_up_on_node_0_and_join_on_the_others_by_task_rank(
    slurm_cli, tmp_path: Path, monkeypatch
):
    # Two machines need a shared experiment directory, which this machine lacks: its local
    # file system is taken for a shared one here (the check has its own test below).
    monkeypatch.setattr(checks, "LOCAL_FILESYSTEMS", frozenset())
    result = slurm_cli(
        "--dry-run", "--account", "rl", "--sbatch=--qos=high",
        slurm='partition = "gpu"\ntime = "4:00:00"\ngpus_per_node = 1\nextra = ["--exclusive"]',
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    script = result.output
    experiment = tmp_path / "outputs" / "two_nodes"
    for line in (
        "#SBATCH --job-name=two_nodes",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=rl",
        "#SBATCH --time=4:00:00",
        "#SBATCH --gpus-per-node=1",
        f"#SBATCH --output={experiment}/slurm/job-%j.out",
        "#SBATCH --exclusive",
        "#SBATCH --qos=high",
    ):
        assert f"\n{line}\n" in script, line
    assert 'up "$RECIPE" --headless' in script
    assert 'join "$EXPERIMENT" --node-rank "$rank"' in script
    assert "local rank=$SLURM_PROCID" in script
    assert "WORKBENCH_RENDEZVOUS_HOST=" in script and "getent ahostsv4" in script
    assert f"srun --ntasks=2 --output={experiment}/slurm/job-%j-node%t.out" in script
    assert not experiment.exists(), "--dry-run writes nothing"


def test_the_script_and_its_token_are_written_into_the_experiment(slurm_cli, tmp_path: Path):
    result = slurm_cli(slurm="tasks_per_node = 2")
    assert result.exit_code == 0, result.output
    slurm_dir = tmp_path / "outputs" / "two_nodes" / "slurm"
    script = (slurm_dir / "job.sbatch").read_text()
    token = (slurm_dir / "shared-check").read_text().strip()
    assert f"export SHARED_TOKEN={token}\n" in script
    assert "#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=2\n" in script
    assert subprocess.run(["bash", "-n", str(slurm_dir / "job.sbatch")]).returncode == 0
    assert f"sbatch {slurm_dir / 'job.sbatch'}" in result.output


@pytest.mark.parametrize(
    ("slurm", "nproc", "args", "named"),
    [
        ("nodes = 1", 1, (), "slurm.nodes: [slurm] nodes = 1 x tasks_per_node = 1 gives 1"),
        ("gpus_per_node = 2", 4, (), "slurm.gpus_per_node: [slurm] gpus_per_node = 2 is fewer"),
        ("", 1, ("--sbatch=--nodes=1",), "slurm.extra: [slurm] extra line '--nodes=1'"),
        ("", 1, ("--gpus-per-node", "1", "--sbatch=-N 1"), "sets the node or task count"),
    ],
)
def test_an_allocation_smaller_than_the_trainer_needs_is_refused_naming_the_key(
    slurm_cli, tmp_path: Path, slurm: str, nproc: int, args: tuple[str, ...], named: str
):
    result = slurm_cli(*args, slurm=slurm, nproc=nproc)
    assert result.exit_code == 2
    assert named in result.output
    assert not (tmp_path / "outputs").exists(), "nothing is written"


def test_a_bad_time_limit_is_refused_naming_the_option_or_key(slurm_cli):
    result = slurm_cli("--time", "four hours")
    assert result.exit_code == 2 and "--time: " in result.output
    result = slurm_cli(slurm='time = "soon"')
    assert result.exit_code == 2 and "slurm.time" in result.output


def job_spanning(machines: int, experiment: Path) -> SlurmJob:
    from workbench.config import SlurmSection

    return SlurmJob(
        recipe=Path("/r.toml"), experiment=experiment, workdir=Path("/"), job_name="x",
        nnodes=machines, nproc_per_node=1, nodes=machines, tasks_per_node=1,
        settings=SlurmSection(), gpus_per_node=None, rendezvous_port=29400, token="t",
    )  # fmt: skip


def test_an_experiment_on_a_local_file_system_is_refused_when_the_job_spans_machines(
    tmp_path: Path,
):
    mounts = "overlay / overlay rw 0 0\nserver:/home /shared nfs4 rw 0 0\n"
    local = filesystem_problem(job_spanning(2, Path("/scratch/exp")), mounts)
    assert local is not None and local[0] == "experiment.output_dir"
    assert "local file system (overlay at /)" in local[1]
    assert filesystem_problem(job_spanning(2, Path("/shared/me/exp")), mounts) is None
    assert filesystem_problem(job_spanning(1, Path("/scratch/exp")), mounts) is None


def test_gpus_are_counted_from_sinfo_generic_resources():
    assert gres_gpus("gpu:8") == 8
    assert gres_gpus("gpu:h100:4(S:0-1),gpu:a100:2") == 6
    assert gres_gpus("(null)") == 0


def test_a_job_larger_than_the_cluster_is_refused_before_submission(
    slurm_cli, tmp_path: Path, slurm_cluster: str
):
    before = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout
    # Two machines for two nodes, on a cluster of one.
    result = slurm_cli("--submit", slurm="tasks_per_node = 1")
    assert result.exit_code == 2, result.output
    assert "slurm.nodes: [slurm] nodes = 2 ([trainer] nnodes = 2), but" in result.output
    assert f"has 1 machine(s) ({slurm_cluster})" in result.output
    result = slurm_cli("--submit", "--partition", "nosuch", slurm="tasks_per_node = 2")
    assert result.exit_code == 2 and "slurm.partition" in result.output
    after = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout
    assert after == before, "nothing was submitted"
    assert not (tmp_path / "outputs").exists()


def test_a_node_that_does_not_see_the_submitted_token_stops_before_starting_anything(
    slurm_cli, tmp_path: Path, slurm_cluster: str
):
    # As a node would that mounts another directory at the experiment's path: the token it
    # reads is not the one the script was written with.
    result = slurm_cli(slurm="tasks_per_node = 2")
    assert result.exit_code == 0, result.output
    slurm_dir = tmp_path / "outputs" / "two_nodes" / "slurm"
    (slurm_dir / "shared-check").write_text("another submission\n")
    job_id = subprocess.run(
        ["sbatch", "--parsable", "--wait", str(slurm_dir / "job.sbatch")],
        capture_output=True, text=True, timeout=120,
    ).stdout.strip()  # fmt: skip
    assert job_id, "sbatch printed its job id"
    for rank in (0, 1):
        said = (slurm_dir / f"job-{job_id}-node{rank}.out").read_text()
        assert f"node {rank} on {slurm_cluster}: " in said
        assert "does not share the experiment directory" in said
    assert not (tmp_path / "outputs" / "two_nodes" / "supervisor").exists(), "nothing started"
