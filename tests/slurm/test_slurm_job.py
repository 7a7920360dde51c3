"""`workbench slurm RECIPE`: the batch script it writes, and what it refuses before anything is
written or submitted, naming the key. The refusals that ask the cluster run against the
one-host Slurm of `scripts/slurm_one_host.sh`; the rest need no Slurm."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from workbench.cli import app
from workbench.slurm import checks
from workbench.slurm.checks import filesystem_problem, gres_gpus
from workbench.slurm.job import SlurmJob

RECIPE = """\
[experiment]
name = {name}
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


def write_recipe(directory: Path, slurm: str = "", nproc: int = 1, name: str = "two_nodes") -> Path:
    """recipe.toml in `directory`; `name` as a TOML string (JSON's escapes are TOML's)."""
    path = directory / "recipe.toml"
    path.write_text(RECIPE.format(slurm=slurm, nproc=nproc, name=json.dumps(name)))
    return path


@pytest.fixture
def slurm_cli(tmp_path: Path, monkeypatch):
    """`workbench slurm` on a recipe with the given `[slurm]` lines, run in tmp_path."""
    monkeypatch.chdir(tmp_path)

    def invoke(*args: str, slurm: str = "", nproc: int = 1):
        write_recipe(tmp_path, slurm=slurm, nproc=nproc)
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


# ---------------------------------------------------------------- values that reach a shell

# This checkout's workbench in the child, as a user runs it.
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(
        filter(None, [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")])
    ),
}


def workbench_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "workbench.cli", *args],
        cwd=cwd, capture_output=True, text=True, timeout=120, env=ENV,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("slurm", "key", "named"),
    [
        # A line break would end the `#SBATCH` line: the next is bash's.
        ('partition = "debug\\nrm -rf ~"', "slurm.partition", "is not a Slurm partition name"),
        ('account = "$(touch pwned)"', "slurm.account", "is not a Slurm account name"),
        ('mem = "lots"', "slurm.mem", "is not a Slurm memory size"),
        ('time = "10\\n"', "slurm.time", "is not a Slurm time limit"),
        ('extra = ["--qos=high\\rm"]', "slurm.extra", "is not one sbatch option"),
    ],
)
def test_a_recipe_value_outside_slurm_syntax_is_refused_by_the_cli_naming_the_key(
    tmp_path: Path, slurm: str, key: str, named: str
):
    write_recipe(tmp_path, slurm=f"tasks_per_node = 2\n{slurm}")
    result = workbench_cli("slurm", "recipe.toml", "--dry-run", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "recipe.toml, line " in result.stderr and f"{key}: " in result.stderr, result.stderr
    assert named in result.stderr, result.stderr
    assert "#SBATCH" not in result.stdout, "no script is printed"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recipe.toml"], "nothing is written"


def test_a_command_line_value_outside_slurm_syntax_is_refused_naming_the_option(tmp_path: Path):
    write_recipe(tmp_path, slurm="tasks_per_node = 2")
    result = workbench_cli("slurm", "recipe.toml", "--account", "rl;id", "--dry-run", cwd=tmp_path)
    assert result.returncode == 2 and "--account: " in result.stderr, result.stderr
    result = workbench_cli("slurm", "recipe.toml", "--partition", "a b", cwd=tmp_path)
    assert result.returncode == 2 and "--partition: " in result.stderr, result.stderr
    assert not (tmp_path / "outputs").exists()


def test_a_name_or_path_no_quoting_carries_into_the_script_is_refused_naming_it(
    tmp_path: Path,
):
    # The recipe's own check: a name on one line.
    write_recipe(tmp_path, slurm="tasks_per_node = 2", name="two\nnodes")
    result = workbench_cli("slurm", "recipe.toml", "--dry-run", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "experiment.name: 'two\\nnodes' contains control characters" in result.stderr
    # A working directory with a line break, which the comments of the script name.
    workdir = tmp_path / "work\nrm -rf ~"
    workdir.mkdir()
    write_recipe(workdir, slurm="tasks_per_node = 2")
    result = workbench_cli("slurm", "recipe.toml", cwd=workdir)
    assert result.returncode == 2, result.stderr
    assert "working directory: the working directory " in result.stderr, result.stderr
    # A backslash where the job's logs go: Slurm's log file names cannot carry one.
    write_recipe(tmp_path, slurm="tasks_per_node = 2")
    (tmp_path / "recipe.toml").write_text(
        (tmp_path / "recipe.toml").read_text().replace("outputs/two_nodes", "out\\\\put")
    )
    result = workbench_cli("slurm", "recipe.toml", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "experiment.output_dir: " in result.stderr and "backslash" in result.stderr
    assert not list(tmp_path.rglob("job.sbatch")), "nothing is written"


# Legal, and each of these means something to bash or to sbatch's parser of #SBATCH lines.
AWKWARD_NAME = 'it\'s "two" nodes #1 $(touch pwned) `id` \\ 50%'


def test_legal_values_with_spaces_and_quotes_are_quoted_in_the_script(tmp_path: Path):
    workdir = tmp_path / "a dir; $(touch pwned) 100%"
    workdir.mkdir()
    write_recipe(
        workdir, name=AWKWARD_NAME,
        slurm='tasks_per_node = 2\npartition = "gpu,debug"\naccount = "rl-team"\n'
        'mem = "64G"\ntime = "1-12:00:00"',
    )  # fmt: skip
    result = workbench_cli("slurm", "recipe.toml", cwd=workdir)
    assert result.returncode == 0, result.stdout + result.stderr
    script_path = workdir / "outputs" / "two_nodes" / "slurm" / "job.sbatch"
    assert str(script_path) in result.stdout
    script = script_path.read_text()
    assert subprocess.run(["bash", "-n", str(script_path)]).returncode == 0, script
    # In bash, each path is one word; the script's lines of bash are all it runs.
    assert f"export RECIPE='{workdir}/recipe.toml'\n" in script
    # In the #SBATCH lines: shlex's quoting, the backslash doubled for sbatch's parser, and
    # `%` doubled where Slurm reads a file name pattern.
    assert "\n#SBATCH --job-name='it'\"'\"'s \"two\" nodes #1 $(touch pwned) `id` \\\\ 50%'\n" in (
        script
    )
    assert f"\n#SBATCH --chdir='{workdir}'\n" in script
    logs = str(workdir).replace("%", "%%") + "/outputs/two_nodes/slurm"
    assert f"\n#SBATCH --output='{logs}/job-%j.out'\n" in script
    assert f"srun --ntasks=2 --output='{logs}'/job-%j-node%t.out bash -c run_node\n" in script
    for line in ("--partition=gpu,debug", "--account=rl-team", "--mem=64G", "--time=1-12:00:00"):
        assert f"\n#SBATCH {line}\n" in script, line
    assert not list(tmp_path.rglob("pwned"))


def test_a_job_with_spaces_and_quotes_in_its_name_and_paths_runs_under_real_slurm(
    tmp_path: Path, slurm_cluster: str
):
    # As the token test above: each node runs the script's bash up to its token check,
    # which stops it before anything starts, so the job is quick.
    workdir = tmp_path / "a dir; $(touch pwned) 100%"
    workdir.mkdir()
    write_recipe(workdir, slurm="tasks_per_node = 2", name=AWKWARD_NAME)
    result = workbench_cli("slurm", "recipe.toml", cwd=workdir)
    assert result.returncode == 0, result.stdout + result.stderr
    slurm_dir = workdir / "outputs" / "two_nodes" / "slurm"
    (slurm_dir / "shared-check").write_text("another submission\n")
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--wait", str(slurm_dir / "job.sbatch")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    job_id = submitted.stdout.strip().split(";")[0]
    assert job_id, submitted.stderr
    shown = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True)
    first_line = shown.stdout.splitlines()[0]
    assert first_line.endswith(f"JobName={AWKWARD_NAME}"), shown.stdout
    assert f"WorkDir={workdir}\n" in shown.stdout + "\n" or f"WorkDir={workdir} " in shown.stdout
    # The logs went where the script says, in the directory with a space and a `%`.
    for rank in (0, 1):
        said = (slurm_dir / f"job-{job_id}-node{rank}.out").read_text()
        assert "does not share the experiment directory" in said, said
    assert (slurm_dir / f"job-{job_id}.out").exists()
    assert not list(tmp_path.rglob("pwned"))
