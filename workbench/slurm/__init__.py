"""Slurm: an experiment as one batch job over the trainer's nodes (`workbench slurm`).

- `job`: the recipe as a `SlurmJob` and the job's script;
- `checks`: what refuses a job before submission (allocation too small, a directory the
  other machines cannot see, what `sinfo` says the cluster lacks);
- `submit`: writing the script and its shared-directory token, and `sbatch`.
"""
