"""Writing a Slurm job's files into the experiment directory and handing them to `sbatch`."""

from __future__ import annotations

import subprocess

from workbench.files import layout
from workbench.slurm.job import SlurmJob, render_script, script_path, shared_token_path


class SubmitError(Exception):
    """sbatch refused the job or is not there; the message says why."""


def write_job(job: SlurmJob) -> None:
    """The script (`slurm/job.sbatch`, executable) and the token every node checks
    (`slurm/shared-check`), in the experiment directory, which is made if missing."""
    path = script_path(job.experiment)
    path.parent.mkdir(parents=True, exist_ok=True)
    layout.atomic_write_text(shared_token_path(job.experiment), job.token + "\n")
    layout.atomic_write_text(path, render_script(job), mode=0o755)


def submit_job(job: SlurmJob) -> str:
    """`sbatch` the job's script; Slurm's job id."""
    argv = ["sbatch", "--parsable", str(script_path(job.experiment))]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise SubmitError(
            "sbatch is not installed here: run this on a machine that submits Slurm jobs "
            "(a login node), or submit the script there"
        ) from None
    except subprocess.TimeoutExpired:
        raise SubmitError("sbatch did not answer within 120 s; is slurmctld up?") from None
    if done.returncode != 0:
        raise SubmitError(f"sbatch refused the job: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout.strip().split(";")[0]
