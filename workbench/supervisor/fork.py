"""A fork: a new run of the same experiment that starts from a checkpoint another run
keeps, with its settings and any changed. `workbench runs fork SOURCE[@STEP] NEW` makes one
for the user; population-based training's exploits are forks too (the supervisor hands
`fork_run` to the scheduler, `workbench.sweep.schedulers`).

The new run directory is built under a temporary name in the experiment: a copy of the
source's `checkpoints/step_N/` (the trainer's part, and the orchestrator's when one of that
step is kept) and `control/orch.toml` (the source's settings, the changes, and
`forked_from`, the lineage); then it is renamed into place whole, so discovery sees the
complete run or nothing. From there it is a run made from a copied checkpoint
(docs/contracts.md, "A run from another run's checkpoint").
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.config import (
    ConfigError,
    ForkedFrom,
    OrchestratorConfig,
    load_orchestrator_config,
    normalize_run_id,
)
from workbench.experiment import orch_toml_text
from workbench.files import layout
from workbench.supervisor.control_socket import ControlError, new_run_config, normalize_overrides
from workbench.sweep.pbt_scheduler import ForkFailed, SourcePruned

TRAINER_PART = "trainer"
ORCHESTRATOR_PART = "orchestrator"
# Tries at the newest checkpoint of a run that prunes them while it trains.
NEWEST_STEP_ATTEMPTS = 3


class ForkError(ForkFailed):
    """A fork that cannot be made; the message says why and what works."""

    def __init__(self, message: str, bad_input: bool = False):
        super().__init__(message)
        self.bad_input = bad_input  # the command line asked for it (else the files failed)


@dataclass(frozen=True)
class Fork:
    run_id: str
    path: Path
    source: str
    step: int
    with_orchestrator_state: bool  # the source's data position and seeds came along


class CheckpointPruned(ForkError, SourcePruned):
    """The source's checkpoint was pruned by the trainer before or while the fork copied
    it (population-based training then forks the source's newest instead)."""


def parse_source(spec: str) -> tuple[str, int | None]:
    """`run_a@20` -> ("run_a", 20); `run_a` -> ("run_a", None): its newest checkpoint."""
    name, at, step = spec.partition("@")
    if not at:
        return name, None
    if not step.isdigit():
        raise ForkError(
            f"{spec!r}: the step after '@' must be a whole number, e.g. {name}@20",
            bad_input=True,
        )
    return name, int(step)


def fork_run(
    experiment: Path,
    source_spec: str,
    new_id: str,
    overrides: dict[str, Any],
    *,
    admit_as: Path | None = None,
) -> Fork:
    """Create the new run (see the module docstring); raises ForkError before anything is
    written when the source, its step, the new id or the settings will not do.

    `admit_as`: an orch.toml whose modification time the fork's takes, so that the trainer,
    which admits waiting runs oldest config first, queues the fork where that run was
    (population-based training puts a fork in the place of the run it replaces)."""
    raw_source, wanted_step = parse_source(source_spec)
    source_id = normalize_run_id(raw_source)
    source = layout.run_dir(experiment, source_id)
    config_path = layout.orch_config_path(source)
    if not config_path.is_file():
        known = ", ".join(p.name for p in layout.list_run_dirs(experiment)) or "none"
        raise ForkError(f"no run {raw_source!r} in {experiment} to fork (runs: {known})")
    try:
        source_config = load_orchestrator_config(config_path)
    except ConfigError as err:
        raise ForkError(f"cannot fork {source_id}: its config does not load: {err}") from None
    if "forked_from" in normalize_overrides(overrides):
        raise ForkError("forked_from is written by the fork itself; leave it out", bad_input=True)
    # A run still training prunes its older checkpoints as it goes: its newest one can go
    # while it is copied. Asked for no particular step, the fork takes the newest again.
    for attempt in range(1, NEWEST_STEP_ATTEMPTS + 1):
        step = _kept_step(source, source_id, wanted_step, source_config)
        run_id, config = _fork_config(experiment, source_id, source_config, step, new_id, overrides)
        try:
            with_state = _write_fork(experiment, source, step, run_id, config, admit_as)
        except CheckpointPruned:
            if wanted_step is not None or attempt == NEWEST_STEP_ATTEMPTS:
                raise
            continue
        return Fork(run_id, layout.run_dir(experiment, run_id), source_id, step, with_state)
    raise AssertionError("unreachable: the last attempt returns or raises")


def _fork_config(
    experiment: Path,
    source_id: str,
    source_config: OrchestratorConfig,
    step: int,
    new_id: str,
    overrides: dict[str, Any],
) -> tuple[str, OrchestratorConfig]:
    """The new run's id and config: the source's, forked from `step`, with `overrides`."""
    # The fork starts from the checkpoint; an adapter its source started from
    # (`lora.init_from`) is no longer needed, nor checked (it may be gone by now).
    lora = source_config.lora.model_copy(update={"init_from": None})
    base = source_config.model_copy(
        update={"forked_from": ForkedFrom(run=source_id, step=step), "lora": lora}
    )
    try:
        run_id, config = new_run_config(experiment, new_id, overrides, base)
    except ControlError as err:
        raise ForkError(str(err), bad_input=True) from None
    problem = fork_settings_problem(source_id, source_config, config, step)
    if problem is not None:
        raise ForkError(f"{run_id} settings: {problem}", bad_input=True)
    return run_id, config


def _kept_step(source: Path, source_id: str, wanted: int | None, config: OrchestratorConfig) -> int:
    kept = layout.checkpoint_steps(source, TRAINER_PART)
    if not kept:
        raise ForkError(
            f"{source_id} keeps no checkpoint yet: the trainer writes one every "
            f"checkpoint_interval ({config.checkpoint_interval}) steps, at the run's last "
            "step and when it stops or the run leaves it; fork it once one is written"
        )
    if wanted is None:
        return kept[-1]
    if wanted not in kept:
        listing = ", ".join(str(step) for step in kept)
        # Older than what it keeps: pruned (a newer checkpoint of the same run will do).
        error = CheckpointPruned if wanted < kept[-1] else ForkError
        raise error(
            f"{source_id} keeps no checkpoint of step {wanted}; it keeps steps {listing} "
            f"(the trainer keeps the last 3): fork one of those, e.g. {source_id}@{kept[-1]}"
        )
    return wanted


def fork_settings_problem(
    source_id: str, source: OrchestratorConfig, fork: OrchestratorConfig, step: int
) -> str | None:
    """Why the fork's settings cannot go on from the source's checkpoint, or None."""
    for key in ("rank", "alpha"):
        before, after = getattr(source.lora, key), getattr(fork.lora, key)
        if before != after:
            return (
                f"lora.{key} = {after} differs from {source_id}'s ({before}, unset: the "
                f"trainer's): the adapter of step {step} was trained under it, so a fork keeps "
                "it; a run with another LoRA shape starts afresh (`workbench runs add`)"
            )
    if fork.max_steps <= step:
        return (
            f"max_steps = {fork.max_steps} leaves nothing to train after step {step}; "
            f"give it more, e.g. --set max_steps={step + fork.max_steps}"
        )
    return None


def _write_fork(
    experiment: Path,
    source: Path,
    step: int,
    run_id: str,
    config: OrchestratorConfig,
    admit_as: Path | None = None,
) -> bool:
    """Stage the new run directory and rename it into place; True when the orchestrator's
    state of `step` came along."""
    staging = Path(tempfile.mkdtemp(prefix=f".{run_id}.", suffix=".tmp", dir=experiment))
    try:
        parts = [TRAINER_PART]
        if layout.is_stable(layout.checkpoint_part_dir(source, step, ORCHESTRATOR_PART)):
            parts.append(ORCHESTRATOR_PART)
        for part in parts:
            shutil.copytree(
                layout.checkpoint_part_dir(source, step, part),
                layout.checkpoint_part_dir(staging, step, part),
            )
        note = f"Forked from {source.name} at step {step} (checkpoints/step_{step} copied)."
        config_path = layout.orch_config_path(staging)
        layout.atomic_write_text(config_path, orch_toml_text(run_id, config, note))
        if admit_as is not None:
            with contextlib.suppress(FileNotFoundError):  # gone: the fork queues as new
                stamp = admit_as.stat().st_mtime_ns
                os.utime(config_path, ns=(stamp, stamp))
        os.rename(staging, layout.run_dir(experiment, run_id))
    except (FileNotFoundError, shutil.Error) as err:
        shutil.rmtree(staging, ignore_errors=True)
        raise _copy_error(source, step, err) from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return ORCHESTRATOR_PART in parts


def _copy_error(source: Path, step: int, err: OSError) -> ForkError:
    """What a failed copy of `source`'s checkpoint of `step` says. `copytree` raises
    FileNotFoundError when a directory it lists is gone, and `shutil.Error` (every file it
    could not copy, collected) when files go while it copies: the trainer pruning the
    checkpoint (it keeps its last 3) in both cases when the files are gone now."""
    checkpoint = layout.checkpoint_dir(source, step)
    failed = [Path(src) for src, _, _ in err.args[0]] if isinstance(err, shutil.Error) else []
    if (
        not checkpoint.is_dir()
        or isinstance(err, FileNotFoundError)
        or (failed and not any(path.exists() for path in failed))
    ):
        return CheckpointPruned(
            f"{source.name}'s checkpoint of step {step} was pruned by the trainer while it "
            f"was copied (it keeps only its last 3): fork a newer step, e.g. {source.name} "
            "for its newest"
        )
    first = err.args[0][0] if failed else (None, None, str(err))
    return ForkError(
        f"could not copy {source.name}'s checkpoint of step {step} ({len(failed) or 1} "
        f"file(s)); first: {first[0]}: {first[2]}; nothing of the fork was written"
    )
