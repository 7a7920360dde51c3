"""Every path of the experiment directory, the one atomic-write helper, and STABLE markers.

The experiment directory is the contract between the supervisor, the trainer, the
orchestrators and the TUI (its files are described in docs/contracts.md). Nobody builds
these paths by hand: they come from here, so a rename is a one-line change.

    {experiment}/
      recipe.toml
      model_build.json          while a built-in model is built: its step (models/build_progress)
      supervisor/               state.json, control socket, pid file
      logs/                     inference.log, trainer.log, supervisor.log
      trainer/runs.json         the trainer's view: which run holds which slot, progress
      sweep/                    plan.json (runs and their swept values), asha.json (rungs), pbt.json
      tracking/                 <run_id>.json: how far each run's metrics were forwarded
      busy/                     trainer.json, <run_id>.json: what each process did lately (busy.py)
      spans/                    trainer.jsonl, <run_id>.jsonl: all it did, span by span (spans.py)
      nodes/                    node<K>.json: how each joined node's trainer share fares (nodes.py)
      run_<id>/
        control/orch.toml, config_validation_error.txt, evicted.txt, finished.txt
        checkpoints/step_N/{trainer,orchestrator}/   rollouts/step_N/   broadcast/step_N/
        logs/orchestrator.log
        metrics.jsonl
        samples.jsonl             the last steps' prompts and completions, as text
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

RUN_PREFIX = "run_"
RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]+$")
STABLE = "STABLE"
_STEP_DIR = re.compile(r"^step_(\d+)$")


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


# mkstemp creates files 0600; ordinary files should get what open() would give.
_DEFAULT_FILE_MODE = 0o666 & ~_umask()


# ---------------------------------------------------------------- experiment level


def recipe_path(experiment: Path) -> Path:
    return experiment / "recipe.toml"


def alerts_path(experiment: Path) -> Path:
    """Appended by the supervisor: one line per alert (`workbench.files.alerts`)."""
    return experiment / "alerts.jsonl"


def supervisor_dir(experiment: Path) -> Path:
    return experiment / "supervisor"


def logs_dir(experiment: Path) -> Path:
    return experiment / "logs"


# The processes that log under logs/; an orchestrator logs in its run directory.
PROCESS_LOG_NAMES = ("inference", "trainer", "supervisor", "tinker")


def process_log_path(experiment: Path, name: str) -> Path:
    """Log file of a supervised process by its name: `inference`, `trainer` and
    `supervisor` under logs/; an orchestrator (named by its run id) in its run directory."""
    if is_run_dir_name(name):
        return orchestrator_log_path(run_dir(experiment, name))
    return logs_dir(experiment) / f"{name}.log"


def nodes_dir(experiment: Path) -> Path:
    return experiment / "nodes"


def node_status_path(experiment: Path, node_rank: int) -> Path:
    """Written by `workbench join` on node `node_rank` (1 and up): its state and heartbeat."""
    return nodes_dir(experiment) / f"node{node_rank}.json"


def model_build_path(experiment: Path) -> Path:
    """Written by the child that builds a built-in model, while it builds: its current step."""
    return experiment / "model_build.json"


def trainer_state_path(experiment: Path) -> Path:
    """Written by the trainer's master rank after every synchronisation: slots and progress."""
    return experiment / "trainer" / "runs.json"


def sweep_dir(experiment: Path) -> Path:
    return experiment / "sweep"


def sweep_plan_path(experiment: Path) -> Path:
    """Written by `workbench up` for a recipe with a [sweep]: every run and its values."""
    return sweep_dir(experiment) / "plan.json"


def asha_state_path(experiment: Path) -> Path:
    """Written by the supervisor's early stopping: every rung decision so far."""
    return sweep_dir(experiment) / "asha.json"


def pbt_state_path(experiment: Path) -> Path:
    """Written by the supervisor's population-based training: every decision so far."""
    return sweep_dir(experiment) / "pbt.json"


def tracking_dir(experiment: Path) -> Path:
    return experiment / "tracking"


def tracking_progress_path(experiment: Path, run_id: str) -> Path:
    """Written by the supervisor's tracking: the tracker run of `run_id` and how much of
    its metrics.jsonl was forwarded to it."""
    return tracking_dir(experiment) / f"{run_id}.json"


def busy_dir(experiment: Path) -> Path:
    return experiment / "busy"


def busy_path(experiment: Path, process: str) -> Path:
    """Written by a process (the trainer's master rank, an orchestrator named by its run
    id) while it runs: what it was busy with or waiting for lately (`workbench.files.busy`)."""
    return busy_dir(experiment) / f"{process}.json"


def spans_dir(experiment: Path) -> Path:
    return experiment / "spans"


def spans_path(experiment: Path, process: str) -> Path:
    """Appended by a process that keeps a busy record: every activity it ended, and its
    threads' work (`workbench.files.spans`), for `workbench trace`."""
    return spans_dir(experiment) / f"{process}.jsonl"


def run_dir(experiment: Path, run_id: str) -> Path:
    return experiment / run_id


def is_run_dir_name(name: str) -> bool:
    return name.startswith(RUN_PREFIX) and len(name) > len(RUN_PREFIX)


def list_run_dirs(experiment: Path) -> list[Path]:
    """Every `run_*` directory of an experiment, sorted by name; other entries are ignored."""
    if not experiment.is_dir():
        return []
    return sorted(p for p in experiment.iterdir() if p.is_dir() and is_run_dir_name(p.name))


# ---------------------------------------------------------------- run level


def control_dir(run: Path) -> Path:
    return run / "control"


def orch_config_path(run: Path) -> Path:
    return control_dir(run) / "orch.toml"


def validation_error_path(run: Path) -> Path:
    return control_dir(run) / "config_validation_error.txt"


def evicted_path(run: Path) -> Path:
    return control_dir(run) / "evicted.txt"


def finished_path(run: Path) -> Path:
    return control_dir(run) / "finished.txt"


def checkpoints_dir(run: Path) -> Path:
    return run / "checkpoints"


def rollouts_dir(run: Path) -> Path:
    return run / "rollouts"


def broadcasts_dir(run: Path) -> Path:
    return run / "broadcast"


def step_dir(parent: Path, step: int) -> Path:
    return parent / f"step_{step}"


def checkpoint_dir(run: Path, step: int) -> Path:
    return step_dir(checkpoints_dir(run), step)


def checkpoint_part_dir(run: Path, step: int, part: str) -> Path:
    """`checkpoints/step_N/<part>/`: `trainer` and `orchestrator` each write their own part,
    each with its own STABLE marker, so neither waits for the other."""
    return checkpoint_dir(run, step) / part


def checkpoint_steps(run: Path, part: str) -> list[int]:
    """The steps whose `<part>` checkpoint is STABLE, oldest first."""
    return [step for step, path in list_step_dirs(checkpoints_dir(run)) if is_stable(path / part)]


def latest_checkpoint_step(run: Path, part: str) -> int | None:
    """The newest step whose `<part>` checkpoint is STABLE, or None."""
    stable = checkpoint_steps(run, part)
    return stable[-1] if stable else None


def rollout_dir(run: Path, step: int) -> Path:
    return step_dir(rollouts_dir(run), step)


def broadcast_dir(run: Path, step: int) -> Path:
    return step_dir(broadcasts_dir(run), step)


def run_logs_dir(run: Path) -> Path:
    return run / "logs"


def orchestrator_log_path(run: Path) -> Path:
    return run_logs_dir(run) / "orchestrator.log"


def samples_path(run: Path) -> Path:
    """The last few steps' prompts and completions as text (`workbench.files.samples`)."""
    return run / "samples.jsonl"


def eval_samples_path(run: Path) -> Path:
    """Each recent held-out eval's prompts, completions and rewards (`files.eval_samples`)."""
    return run / "eval_samples.jsonl"


def metrics_path(run: Path) -> Path:
    return run / "metrics.jsonl"


# ---------------------------------------------------------------- step directories


def list_step_dirs(parent: Path) -> list[tuple[int, Path]]:
    """`(N, path)` for every `step_N` directory under `parent`, in step order."""
    if not parent.is_dir():
        return []
    steps = []
    for entry in parent.iterdir():
        match = _STEP_DIR.match(entry.name)
        if match and entry.is_dir():
            steps.append((int(match.group(1)), entry))
    return sorted(steps)


def latest_stable_step(parent: Path) -> int | None:
    """The highest N whose `step_N` directory carries a STABLE marker, or None."""
    stable = [step for step, path in list_step_dirs(parent) if is_stable(path)]
    return stable[-1] if stable else None


def is_stable(directory: Path) -> bool:
    return (directory / STABLE).is_file()


def mark_stable(directory: Path) -> None:
    """Write the STABLE marker last, once every other file of `directory` is durable."""
    atomic_write_text(directory / STABLE, "")
    _fsync_dir(directory)


# ---------------------------------------------------------------- atomic writes


def atomic_write_bytes(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write `data` so that a reader sees either the old file or the whole new one.

    Temp file in the same directory (same filesystem, so the rename is atomic), fsync,
    rename, fsync of the directory so the rename itself survives a crash. The file gets
    `mode` (default: what `open` would give under the umask) before it becomes visible,
    so a secret written with mode 0o600 is never readable by others, not even briefly.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, _DEFAULT_FILE_MODE if mode is None else mode)
        with os.fdopen(fd, "wb") as tmp:
            tmp.write(data)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str, mode: int | None = None) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), mode)


@contextlib.contextmanager
def staged_directory(final: Path) -> Iterator[Path]:
    """Build a directory under a temporary name and move it into place whole.

    Yields the staging directory; on a clean exit its files are fsynced, STABLE is written
    last, and it is renamed to `final`. On an exception the staging directory is removed and
    `final` is untouched, so readers never see a half-written step. An existing `final` is
    replaced (a re-written step after a crash).
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    # The step is being written again: what a writer killed mid-way left is garbage.
    remove_staging(final.parent, final.name)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        yield staging
        for entry in staging.iterdir():
            if entry.is_file():
                with open(entry, "rb") as handle:
                    os.fsync(handle.fileno())
        mark_stable(staging)
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
        _fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def remove_staging(parent: Path, name: str | None = None) -> None:
    """Remove the staging directories and temp files (`.NAME.*.tmp`) that writers killed
    mid-way (SIGKILL, OOM) left in `parent`: those of `name`, or all. Only for the one
    writer of those names, when no other copy of it runs."""
    pattern = f".{glob.escape(name)}.*.tmp" if name is not None else ".*.tmp"
    for stale in parent.glob(pattern):
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
