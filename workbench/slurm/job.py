"""A recipe as one Slurm batch job (`SlurmJob`), and the job's script (`render_script`).

One Slurm task per trainer node: task K is node rank K (`SLURM_PROCID`). Task 0 runs
`workbench up RECIPE --headless` (the supervisor, vLLM, the orchestrators and node 0's
trainer share); every other task runs `workbench join EXPERIMENT --node-rank K`, waiting for
node 0's supervisor to start. Node 0's rendezvous store listens on the address of the
allocation's first node, resolved there (`WORKBENCH_RENDEZVOUS_HOST`); its port is the
recipe's `[trainer] rendezvous_port`. Before it starts anything, every task checks that it
sees the token `workbench slurm` wrote into the experiment directory: a node that does not
share that directory stops, saying so.

The script is plain bash with the `#SBATCH` lines at the top, so a user can read and edit
it; nothing here runs a process. Every value from the recipe or the command line is quoted:
for bash with `shlex.quote`, and in an `#SBATCH` line for sbatch's own parser of those lines
(`directive_value`), which bash never reads. What quoting cannot carry (a line break, a backslash
in the log files' path) is refused before the script is written
(`workbench.slurm.checks.script_problems`, the recipe's own checks in
`workbench.config.slurm`).
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from workbench.config import SlurmSection
from workbench.recipe import Recipe
from workbench.supervisor.plan import RENDEZVOUS_HOST_ENV


def slurm_dir(experiment: Path) -> Path:
    """Where the job's script, its token and its logs go: `{experiment}/slurm/`."""
    return experiment / "slurm"


def script_path(experiment: Path) -> Path:
    return slurm_dir(experiment) / "job.sbatch"


def shared_token_path(experiment: Path) -> Path:
    return slurm_dir(experiment) / "shared-check"


@dataclass(frozen=True)
class SlurmJob:
    """Everything the script says, resolved: absolute paths, the settings of `[slurm]` with
    the command line's over them."""

    recipe: Path
    experiment: Path
    workdir: Path
    job_name: str
    nnodes: int
    nproc_per_node: int
    nodes: int
    tasks_per_node: int
    settings: SlurmSection
    gpus_per_node: int | None
    rendezvous_port: int
    token: str
    workbench: list[str] = field(default_factory=lambda: [sys.executable, "-m", "workbench.cli"])


def gpus_the_recipe_lists(recipe: Recipe) -> int:
    """The GPUs node 0 needs by the recipe's own lists (`[inference] gpus`, `[trainer] gpus`);
    0 when it lists none."""
    return len(set(recipe.inference.gpus) | set(recipe.trainer.gpus))


def job_for_recipe(
    recipe_file: Path, recipe: Recipe, settings: SlurmSection, token: str, workdir: Path
) -> SlurmJob:
    """The job for `recipe` (read from `recipe_file`) under `settings`, the recipe's `[slurm]`
    with any command-line options applied; relative paths resolve against `workdir`, where
    the job runs."""
    nnodes = recipe.trainer.nnodes
    tasks = settings.tasks_per_node
    nodes = settings.nodes if settings.nodes is not None else -(-nnodes // tasks)
    listed = gpus_the_recipe_lists(recipe)
    gpus = settings.gpus_per_node if settings.gpus_per_node is not None else (listed or None)
    experiment = recipe.output_dir
    return SlurmJob(
        recipe=(workdir / recipe_file).resolve(),
        experiment=(workdir / experiment).resolve(),
        workdir=workdir.resolve(),
        job_name=recipe.experiment.name,
        nnodes=nnodes,
        nproc_per_node=recipe.trainer.nproc_per_node,
        nodes=nodes,
        tasks_per_node=tasks,
        settings=settings,
        gpus_per_node=gpus,
        rendezvous_port=recipe.trainer.rendezvous_port,
        token=token,
    )


def directive_value(value: object) -> str:
    """`value` quoted for an `#SBATCH` line. sbatch splits those lines itself, not bash (to
    bash they are comments): it honours single and double quotes, but a backslash escapes
    the next character even inside single quotes, and an unquoted `#` ends the line. So:
    shlex's quoting, each backslash doubled. Plain values (`gpu`, `4:00:00`) stay bare."""
    return shlex.quote(str(value).replace("\\", "\\\\"))


def filename_pattern(path: Path) -> str:
    """`path` as a literal part of an `--output` pattern, where Slurm replaces `%j`, `%t`,
    ... and `%%` stands for `%`."""
    return str(path).replace("%", "%%")


def sbatch_lines(job: SlurmJob) -> list[str]:
    """The job's `#SBATCH` options, in the order the script lists them, each value quoted
    for sbatch (`directive_value`); `[slurm] extra` lines are sbatch options as the user
    wrote them."""
    settings = job.settings
    logs = filename_pattern(slurm_dir(job.experiment))
    options: dict[str, object] = {
        "--job-name": job.job_name,
        "--nodes": job.nodes,
        "--ntasks-per-node": job.tasks_per_node,
        "--partition": settings.partition,
        "--account": settings.account,
        "--time": settings.time,
        "--gpus-per-node": job.gpus_per_node,
        "--cpus-per-task": settings.cpus_per_task,
        "--mem": settings.mem,
        "--chdir": job.workdir,
        "--output": f"{logs}/job-%j.out",
    }
    lines = [
        f"{option}={directive_value(value)}"
        for option, value in options.items()
        if value is not None
    ]
    return lines + list(settings.extra)


def render_script(job: SlurmJob) -> str:
    """The batch script: `#SBATCH` lines, then one `srun` task per trainer node."""
    q = shlex.quote
    directives = "\n".join(f"#SBATCH {line}" for line in sbatch_lines(job))
    logs = slurm_dir(job.experiment)
    layout = (
        f"{job.nodes} machine(s)"
        if job.tasks_per_node == 1
        else f"{job.nodes} machine(s), {job.tasks_per_node} node ranks on each"
    )
    return f"""#!/bin/bash
# The experiment of {job.recipe}
# on {job.nnodes} trainer nodes ({layout}), written by `workbench slurm`.
# Edit it freely; submit it with:  sbatch {q(str(script_path(job.experiment)))}
# Node 0 (the allocation's first task) runs the supervisor, vLLM, the orchestrators and
# its share of the trainer; every other task joins the trainer as node rank $SLURM_PROCID.
# Logs: {logs}/job-<jobid>.out (this script) and job-<jobid>-node<K>.out (node K), and
# the experiment's own under {job.experiment}/logs/.
{directives}
set -euo pipefail

export RECIPE={q(str(job.recipe))}
export EXPERIMENT={q(str(job.experiment))}
# Written into the experiment directory at submission: a node that cannot read it does
# not share that directory.
export SHARED_TOKEN={q(job.token)}
export JOIN_WAIT_S={job.settings.join_wait_s:g}
# Node 0's rendezvous store listens on the first node's address, port {job.rendezvous_port}
# ([trainer] rendezvous_port).
export FIRST_NODE="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"

run_node() {{
    local rank=$SLURM_PROCID
    local token_file="$EXPERIMENT/slurm/shared-check"
    if [ "$(cat "$token_file" 2>/dev/null)" != "$SHARED_TOKEN" ]; then
        echo "node $rank on $(hostname): $token_file is missing or from another" \\
            "submission: this node does not share the experiment directory; mount it" \\
            "at the same path on every node" >&2
        return 1
    fi
    if [ "$rank" -eq 0 ]; then
        export {RENDEZVOUS_HOST_ENV}="$(getent ahostsv4 "$FIRST_NODE" | awk 'NR == 1 {{print $1}}')"
        echo "node 0 on $(hostname): rendezvous at ${RENDEZVOUS_HOST_ENV}:{job.rendezvous_port}"
        exec {shlex.join(job.workbench)} up "$RECIPE" --headless
    fi
    echo "node $rank on $(hostname): joining node 0 ($FIRST_NODE)"
    exec {shlex.join(job.workbench)} join "$EXPERIMENT" --node-rank "$rank" \\
        --wait "$JOIN_WAIT_S"
}}
export -f run_node

# One task per trainer node: task K is node rank K.
srun --ntasks={job.nnodes} --output={q(filename_pattern(logs))}/job-%j-node%t.out bash -c run_node
"""
