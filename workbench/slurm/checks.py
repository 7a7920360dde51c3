"""What refuses a Slurm job before it is submitted: an allocation smaller than the recipe
needs (`allocation_problems`, from the recipe alone; `cluster_problems`, asking the cluster
with `sinfo`), an experiment directory the other machines cannot see
(`filesystem_problem`), and a name or path that no quoting carries into the job's script
(`script_problems`). Each problem is (dotted key, message), the message naming the key
and saying what to do."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from workbench.config.base import control_characters
from workbench.slurm.job import SlurmJob

# Options that set the allocation's shape, which `[slurm] nodes` and `tasks_per_node` own.
_SHAPE_OPTIONS = re.compile(r"^(-N|--nodes|-n|--ntasks|--ntasks-per-node)(=|\s|\d|$)")
# File systems every node of a cluster may mount; a local one is seen by its machine only.
SHARED_FILESYSTEMS = frozenset(
    {"nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "ceph", "glusterfs",
     "fuse.glusterfs", "wekafs", "pvfs2", "orangefs", "panfs", "fuse.juicefs", "fuse.sshfs",
     "virtiofs", "9p", "afs", "fuse.ceph-fuse"}
)  # fmt: skip
LOCAL_FILESYSTEMS = frozenset(
    {"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "overlay", "f2fs", "vfat", "ramfs",
     "zfs", "squashfs", "devtmpfs"}
)  # fmt: skip


def allocation_problems(job: SlurmJob, recipe_gpus: int) -> list[tuple[str, str]]:
    """What makes the job's allocation smaller (or other) than its trainer needs: fewer
    tasks than `[trainer] nnodes`, fewer GPUs on a node than its ranks, an extra line that
    sets the node or task count. `recipe_gpus`: the GPUs the recipe's lists name."""
    problems = []
    settings = job.settings
    tasks = job.nodes * job.tasks_per_node
    if tasks != job.nnodes:
        fewer = tasks < job.nnodes
        problems.append(
            (
                "slurm.nodes",
                f"[slurm] nodes = {job.nodes} x tasks_per_node = {job.tasks_per_node} gives "
                f"{tasks} task(s), {'fewer' if fewer else 'more'} than the {job.nnodes} node "
                f"ranks [trainer] nnodes = {job.nnodes} needs (one task each): set [slurm] "
                f"nodes = {-(-job.nnodes // job.tasks_per_node)}, or leave it out",
            )
        )
    gpus = job.gpus_per_node
    if gpus is not None:
        ranks_per_machine = job.tasks_per_node * job.nproc_per_node
        if 0 < gpus < ranks_per_machine:
            problems.append(
                (
                    "slurm.gpus_per_node",
                    f"[slurm] gpus_per_node = {gpus} is fewer than the "
                    f"{ranks_per_machine} trainer ranks each machine runs ([trainer] "
                    f"nproc_per_node = {job.nproc_per_node}); raise it or lower "
                    "nproc_per_node",
                )
            )
        if gpus < recipe_gpus:
            problems.append(
                (
                    "slurm.gpus_per_node",
                    f"[slurm] gpus_per_node = {gpus} is fewer than the {recipe_gpus} GPUs "
                    "[inference] gpus and [trainer] gpus list for node 0; raise it",
                )
            )
    for line in settings.extra:
        if _SHAPE_OPTIONS.match(line):
            problems.append(
                (
                    "slurm.extra",
                    f"[slurm] extra line {line!r} sets the node or task count, which "
                    "[slurm] nodes and tasks_per_node set (one task per trainer node); "
                    "remove it",
                )
            )
    return problems


def script_problems(job: SlurmJob) -> list[tuple[str, str]]:
    """The paths the script carries that quoting cannot: a line break or other control
    character (it would end a comment or an `#SBATCH` line and start a line of bash), and
    a backslash in the experiment's path, where the job's log files go: Slurm reads one in
    an `--output` pattern as its own escape, and the job fails to launch (slurm 22.05).
    The recipe's own checks refuse such an `[experiment] name` or `output_dir`; these are
    the absolute paths, the working directory's included."""
    values = (
        ("experiment.output_dir", "the experiment directory", str(job.experiment)),
        ("working directory", "the working directory", str(job.workdir)),
        ("recipe", "the recipe's path", str(job.recipe)),
    )
    problems = []
    for key, what, value in values:
        bad = control_characters(value)
        if bad:
            why = f"contains control characters ({' '.join(bad)})"
        elif key == "experiment.output_dir" and "\\" in value:
            why = "contains a backslash, which Slurm's log file names cannot"
        else:
            continue
        problems.append((key, f"{what} {value!r} {why}; rename it for the Slurm job"))
    return problems


def filesystem_type(path: Path, mounts: str | None = None) -> tuple[str, str]:
    """The type and mount point of the file system `path` lies on (or will, once made),
    from /proc/mounts (or `mounts`, its text)."""
    path = Path(os.path.realpath(path))
    if mounts is None:
        mounts = Path("/proc/mounts").read_text(encoding="utf-8")
    best = ("unknown", "/")
    best_length = -1
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        if (path == Path(point) or Path(point) in path.parents) and len(point) > best_length:
            best, best_length = (fields[2], point), len(point)
    return best


def filesystem_problem(job: SlurmJob, mounts: str | None = None) -> tuple[str, str] | None:
    """A refusal when the job spans machines and its experiment directory lies on a file
    system that only this machine sees (ext4, xfs, tmpfs, ...). An unknown type passes: the
    job's own check on every node (its token file) catches a directory not shared."""
    if job.nodes == 1:
        return None
    kind, point = filesystem_type(job.experiment, mounts)
    if kind not in LOCAL_FILESYSTEMS:
        return None
    return (
        "experiment.output_dir",
        f"[experiment] output_dir {job.experiment} is on a local file system ({kind} at "
        f"{point}) that the other {job.nodes - 1} machine(s) cannot see; put it on a shared "
        "one (NFS, Lustre, GPFS, BeeGFS, ...) mounted at the same path on every node",
    )


def cluster_problems(job: SlurmJob) -> list[tuple[str, str]]:
    """What the cluster says against the job, asked with `sinfo`: a partition it lacks, fewer
    machines in the partition than the job's nodes, fewer GPUs on its machines than
    `gpus_per_node`. Nothing when `sinfo` is not installed (sbatch then says it)."""
    if shutil.which("sinfo") is None:
        return []
    partition = job.settings.partition
    argv = ["sinfo", "--noheader", "--Node", "--format=%N|%P|%G"]
    if partition is not None:
        argv.append(f"--partition={partition}")
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError) as err:
        return [("slurm.partition", f"cannot ask the cluster about its nodes (`sinfo`): {err}")]
    machines: dict[str, int] = {}
    for line in out.splitlines():
        name, part, gres = [*line.split("|"), "", ""][:3]
        if partition is None and not part.endswith("*"):
            continue  # the default partition is the one sinfo marks with a star
        machines[name] = max(machines.get(name, 0), gres_gpus(gres))
    where = f"partition {partition}" if partition else "the default partition"
    if not machines:
        return [
            (
                "slurm.partition",
                f"[slurm] partition: the cluster has no {where}, or it has no nodes (see "
                "`sinfo`); name one with [slurm] partition or --partition",
            )
        ]
    problems = []
    if len(machines) < job.nodes:
        problems.append(
            (
                "slurm.nodes",
                f"[slurm] nodes = {job.nodes} ([trainer] nnodes = {job.nnodes}), but "
                f"{where} has {len(machines)} machine(s) ({', '.join(sorted(machines))}): "
                "the job could never start; pick a larger partition, or put several node "
                "ranks on a machine with [slurm] tasks_per_node",
            )
        )
    most = max(machines.values())
    if job.gpus_per_node and most < job.gpus_per_node:
        problems.append(
            (
                "slurm.gpus_per_node",
                f"[slurm] gpus_per_node = {job.gpus_per_node}, but no machine of {where} has "
                f"more than {most} GPU(s); lower it or pick another partition",
            )
        )
    return problems


def gres_gpus(gres: str) -> int:
    """GPUs in a node's generic resources as `sinfo %G` writes them (`gpu:8`,
    `gpu:h100:4(S:0-1),gpu:a100:2`); 0 for `(null)`."""
    total = 0
    for item in gres.split(","):
        parts = item.split("(")[0].split(":")
        if parts[0] == "gpu" and parts[-1].isdigit():
            total += int(parts[-1])
    return total
