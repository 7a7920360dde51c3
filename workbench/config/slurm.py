"""The recipe's `[slurm]` section: how `workbench slurm` asks Slurm for the experiment's nodes.

Only `workbench slurm` reads it; `workbench up` ignores it. Options of `workbench slurm`
(`--partition`, `--account`, `--time`, `--gpus-per-node`, `--sbatch`) override it.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from workbench.config.base import StrictModel, control_characters

# Every value below goes into an `#SBATCH` line of a bash script, which sbatch parses as its
# own options: each is held to Slurm's own syntax (sbatch(1), `str_to_mbytes` and
# `time_str2mins` of Slurm's source) here, before anything is written, and is quoted there
# too (`workbench.slurm.job`). `fullmatch`, not `$`: `$` also matches before a last newline.
# Slurm's time formats: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS; or no limit.
_SLURM_TIME = re.compile(r"(\d+-)?\d+(:\d{1,2}){0,2}|UNLIMITED|INFINITE", re.IGNORECASE)
# A partition or account as slurm.conf and sacctmgr name them: letters, digits, `_ . + -`.
_SLURM_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.+-]*"
# `--partition` takes a comma-separated list (the job runs in whichever starts it first).
_SLURM_PARTITIONS = re.compile(rf"{_SLURM_NAME}(,{_SLURM_NAME})*")
_SLURM_ACCOUNT = re.compile(_SLURM_NAME)
# `--mem`: a whole number with an optional unit, K, M (the default), G or T.
_SLURM_MEMORY = re.compile(r"\d+[KMGTkmgt]?")


class SlurmSection(StrictModel):
    """The batch job of `workbench slurm`: one Slurm task per trainer node, node 0 running
    `workbench up --headless`, the others `workbench join`."""

    partition: str | None = Field(
        None, min_length=1, description="`--partition`; none: the cluster's default"
    )
    account: str | None = Field(
        None, min_length=1, description="`--account`; none: yours by default"
    )
    time: str | None = Field(
        None,
        description="`--time`, the job's time limit in a Slurm format (`4:00:00`, "
        "`1-12:00:00`, minutes); none: the partition's default",
    )
    nodes: int | None = Field(
        None,
        ge=1,
        description="machines to allocate; none: [trainer] nnodes / tasks_per_node. Fewer "
        "than the trainer's nodes need is refused before submission",
    )
    tasks_per_node: int = Field(
        1,
        ge=1,
        description="trainer nodes per machine: 1 on a cluster; more puts several node "
        "ranks on one machine, meeting over loopback (how the tests run two nodes on one)",
    )
    gpus_per_node: int | None = Field(
        None,
        ge=0,
        description="`--gpus-per-node`; none: the GPUs [inference] gpus and [trainer] gpus "
        "list, or no GPU request when they list none. Fewer than [trainer] nproc_per_node "
        "(or than those lists) is refused before submission",
    )
    cpus_per_task: int | None = Field(
        None, ge=1, description="`--cpus-per-task`: CPUs for each trainer node's task"
    )
    mem: str | None = Field(
        None,
        min_length=1,
        description="`--mem`, memory per machine (`64G`); none: the partition's default",
    )
    join_wait_s: float = Field(
        600.0,
        gt=0,
        description="how long the other nodes wait for node 0's supervisor to start "
        "(`workbench join --wait`); node 0 may build the model or start vLLM first",
    )
    extra: list[str] = Field(
        default_factory=list,
        description="more `#SBATCH` lines, as written after `#SBATCH ` (`--constraint=h100`, "
        "`--qos=high`); the node and task counts are this section's, not theirs",
    )

    @field_validator("time")
    @classmethod
    def _a_slurm_time(cls, value: str | None) -> str | None:
        if value is not None and not _SLURM_TIME.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a Slurm time limit: write minutes, HH:MM:SS or "
                "D-HH:MM:SS (e.g. 4:00:00)"
            )
        return value

    @field_validator("partition")
    @classmethod
    def _slurm_partitions(cls, value: str | None) -> str | None:
        if value is not None and not _SLURM_PARTITIONS.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a Slurm partition name: letters, digits and '_ . + -', "
                "several separated by commas (e.g. gpu or gpu,debug); see `sinfo -s`"
            )
        return value

    @field_validator("account")
    @classmethod
    def _a_slurm_account(cls, value: str | None) -> str | None:
        if value is not None and not _SLURM_ACCOUNT.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a Slurm account name: letters, digits and '_ . + -' "
                "(e.g. rl-team); see `sacctmgr show associations user=$USER`"
            )
        return value

    @field_validator("mem")
    @classmethod
    def _a_slurm_memory(cls, value: str | None) -> str | None:
        if value is not None and not _SLURM_MEMORY.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a Slurm memory size: a whole number with an optional "
                "unit K, M (the default), G or T (e.g. 64G); 0 asks for all of a node's"
            )
        return value

    @field_validator("extra")
    @classmethod
    def _one_option_a_line(cls, lines: list[str]) -> list[str]:
        cleaned = []
        for line in lines:
            text = line.strip().removeprefix("#SBATCH").strip()
            # A line break would end the `#SBATCH` line and start a line of bash.
            if not text.startswith("-") or control_characters(text):
                raise ValueError(
                    f"{line!r} is not one sbatch option: write it as after `#SBATCH `, "
                    "e.g. --constraint=h100"
                )
            cleaned.append(text)
        return cleaned
