"""`workbench slurm RECIPE`: the experiment as one Slurm batch job over its trainer's nodes,
written (and with --submit, submitted); the job itself is `workbench.slurm`."""

from __future__ import annotations

import secrets
import shlex
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from workbench.commands.common import EXIT_BAD_INPUT, fail, recipe_or_fail, say
from workbench.config import SlurmSection
from workbench.recipe import Recipe
from workbench.slurm.checks import (
    allocation_problems,
    cluster_problems,
    filesystem_problem,
    script_problems,
)
from workbench.slurm.job import (
    SlurmJob,
    gpus_the_recipe_lists,
    job_for_recipe,
    render_script,
    script_path,
    slurm_dir,
)
from workbench.slurm.submit import SubmitError, submit_job, write_job

# The options of `slurm`, named once so its signature reads as its parameters; the last
# five override the recipe's [slurm] section.
RecipeArg = Annotated[
    Path, typer.Argument(help="Recipe TOML file, e.g. recipes/reverse_text_2nodes.toml.")
]
SubmitOption = Annotated[
    bool, typer.Option("--submit", help="Submit the script with sbatch once written.")
]
DryRunOption = Annotated[
    bool,
    typer.Option("--dry-run", help="Print the script; write and submit nothing."),
]
PartitionOption = Annotated[
    str | None, typer.Option(help="\\[slurm] partition.", show_default=False)
]
AccountOption = Annotated[str | None, typer.Option(help="\\[slurm] account.", show_default=False)]
TimeOption = Annotated[
    str | None,
    typer.Option(help="\\[slurm] time: the job's time limit (4:00:00).", show_default=False),
]
GpusPerNodeOption = Annotated[
    int | None, typer.Option(min=0, help="\\[slurm] gpus_per_node.", show_default=False)
]
SbatchOption = Annotated[
    list[str] | None,
    typer.Option(
        help="One more #SBATCH line, e.g. --sbatch=--qos=high (repeatable; added to "
        "\\[slurm] extra).",
        show_default=False,
    ),
]


def slurm(
    recipe: RecipeArg,
    submit: SubmitOption = False,
    dry_run: DryRunOption = False,
    partition: PartitionOption = None,
    account: AccountOption = None,
    time: TimeOption = None,
    gpus_per_node: GpusPerNodeOption = None,
    sbatch: SbatchOption = None,
) -> None:
    """Write a Slurm batch script that runs RECIPE's experiment over its \\[trainer] nnodes.

    One task per trainer node: task 0 runs `workbench up RECIPE --headless` (the supervisor,
    vLLM, the orchestrators and node 0's trainer ranks), every other task `workbench join`
    with its task rank as node rank, once node 0's supervisor is up. Node 0's rendezvous
    store listens on the allocation's first node's address, resolved there, at \\[trainer]
    rendezvous_port. The script goes to EXPERIMENT/slurm/job.sbatch, plain bash that you may
    edit and `sbatch` yourself; the job's logs go beside it (job-<id>.out, and
    job-<id>-node<K>.out per node).

    Partition, account, time limit, GPUs per node, machines, node ranks per machine and
    extra #SBATCH lines come from the recipe's \\[slurm] section; the options override it.

    Refused before anything is written, naming the key: a partition, account, time limit
    or memory size not in Slurm's syntax, a name or path with a line break, an allocation
    smaller than the trainer needs (fewer tasks than \\[trainer] nnodes, fewer GPUs than
    nproc_per_node), an extra line that sets the node count, an experiment directory on a
    local file system when the job spans machines; with --submit, also what `sinfo` says
    the cluster lacks (a partition, enough machines, enough GPUs). Each node checks, before
    it starts, that it sees the experiment directory (a token written at submission); one
    that does not stops and says so.

    Follow the job with `workbench status EXPERIMENT` (every node: rank, host, state,
    restarts) and `squeue`; `scancel` stops every process, each run keeping its checkpoints
    (`workbench up RECIPE` or a new job resumes them).
    """
    _, resolved = recipe_or_fail(recipe, None)
    options = {"partition": partition, "account": account, "time": time}
    settings = _job_settings(resolved, options | {"gpus_per_node": gpus_per_node}, sbatch)
    job = job_for_recipe(recipe, resolved, settings, secrets.token_hex(8), Path.cwd())
    problems = _job_problems(job, resolved, submit)
    if problems:
        lines = "\n".join(f"  {key}: {message}" for key, message in problems)
        raise fail(f"{recipe}: the Slurm job was not written:\n{lines}", EXIT_BAD_INPUT)
    if dry_run:
        print(render_script(job), end="")
        return
    write_job(job)
    path = script_path(job.experiment)
    say(f"wrote {path} ({job.nnodes} trainer node(s) on {job.nodes} machine(s))")
    if not submit:
        say(f"submit it with:  sbatch {shlex.quote(str(path))}")
        return
    _submit(job)


def _job_settings(
    resolved: Recipe, options: dict[str, object], sbatch: list[str] | None
) -> SlurmSection:
    """The recipe's \\[slurm] section with the options given over it, or a bad-input exit."""
    settings_data = resolved.slurm.model_dump()
    settings_data.update({key: value for key, value in options.items() if value is not None})
    settings_data["extra"] = [*resolved.slurm.extra, *(sbatch or [])]
    try:
        return SlurmSection.model_validate(settings_data)
    except ValidationError as err:
        problems = "; ".join(f"--{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
        raise fail(f"invalid option: {problems}", EXIT_BAD_INPUT) from None


def _job_problems(job: SlurmJob, resolved: Recipe, submit: bool) -> list[tuple[str, str]]:
    """(key, why) for each reason not to write the job: the allocation, the file system
    and, when it is to be submitted, what the cluster lacks."""
    problems = script_problems(job) + allocation_problems(job, gpus_the_recipe_lists(resolved))
    shared = filesystem_problem(job)
    problems += [shared] if shared else []
    if submit:
        problems += cluster_problems(job)
    return problems


def _submit(job: SlurmJob) -> None:
    try:
        job_id = submit_job(job)
    except SubmitError as err:
        raise fail(str(err)) from None
    say(f"submitted job {job_id}; logs: {slurm_dir(job.experiment)}/job-{job_id}*.out")
    say(f"  workbench status {job.experiment}    every run and node")
    say(f"  scancel {job_id}    stop it; each run keeps its checkpoints")
