"""What state each run of an experiment is in, read from the experiment directory alone.

The CLI's `status` and the TUI's runs table both come from here, so they always agree.
Evicted, rejected and finished are the run's condition (`run_control.run_condition`, which
the supervisor and the trainer read too); an open run is active or waiting:

- evicted:  `control/evicted.txt` exists (reason from it)
- diverged: evicted by the trainer because its training diverged: the reason starts with
            `diverged:` (`RunCondition.status`); `evicted_by` is `trainer`
- rejected: `control/config_validation_error.txt` exists (reason from it), even for an
            `orch.toml` edited since: the trainer has yet to look at it again
- finished: `control/finished.txt` exists
- active:   the trainer (alive) holds a slot for it (`trainer/runs.json`)
- waiting:  anything else: no trainer yet, all slots used, or no `orch.toml` yet

A sweep adds what each run varies (`values`, from `sweep/plan.json`) and its standing in
early stopping (`asha`: its highest rung so far, from `sweep/asha.json`).

`supervisor_warnings` reads what the supervisor says is wrong without stopping anything
(experiment tracking failing, for one), from its state.json.
"""

from __future__ import annotations

import contextlib
import json
import threading
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import tomlkit

from workbench import layout, run_control
from workbench.config import OrchestratorConfig
from workbench.file_change import OnFileChange
from workbench.procfs import process_is_alive
from workbench.run_control import Condition
from workbench.sweep.asha import RungResult, latest_by_run
from workbench.sweep.files import read_asha, read_plan_values

STATUSES = ("waiting", "active", "rejected", "evicted", "diverged", "finished")


@dataclass
class RunStatus:
    id: str
    status: str
    step: int
    reason: str | None = None
    max_steps: int | None = None
    slot: int | None = None
    total_tokens: int = 0
    total_samples: int = 0
    evicted_by: str | None = None  # user, tui, trainer, orchestrator or asha
    values: dict[str, Any] | None = None  # what a sweep run varies (dotted keys)
    asha: dict[str, Any] | None = None  # rung, step, value, cutoff, rank, of, decision

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def read_trainer_state(experiment: Path) -> dict[str, Any] | None:
    """The trainer's published state, or None if there is none or its trainer is gone."""
    try:
        state = json.loads(layout.trainer_state_path(experiment).read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    pid = state.get("pid")
    if isinstance(pid, int) and not process_is_alive(pid):
        return None
    return state


def run_statuses(experiment: Path) -> list[RunStatus]:
    trainer = read_trainer_state(experiment) or {}
    slots = {run_id: int(idx) for idx, run_id in trainer.get("slots", {}).items()}
    progress = trainer.get("progress", {})
    values = read_plan_values(experiment)
    asha = read_asha(experiment)
    standings = latest_by_run(asha.results) if asha is not None else {}
    statuses = []
    runs = layout.list_run_dirs(experiment)
    max_steps = _max_steps_cache.of_runs(experiment, runs)
    for run in runs:
        status = _run_status(run, slots, progress, max_steps[run.name])
        status.values = values.get(run.name)
        if run.name in standings:
            status.asha = _standing(standings[run.name])
        statuses.append(status)
    return statuses


def supervisor_warnings(state: dict[str, Any] | None) -> list[str]:
    """The `warnings` of a supervisor's state.json (one line each); none if it has none."""
    warnings = (state or {}).get("warnings")
    if not isinstance(warnings, list):
        return []
    return [str(warning) for warning in warnings if warning]


def _standing(result: RungResult) -> dict[str, Any]:
    return {
        "rung": result.rung,
        "step": result.step,
        "value": result.value,
        "cutoff": result.cutoff,
        "rank": result.rank,
        "of": result.of,
        "decision": result.decision,
    }


def _run_status(
    run: Path, slots: dict[str, int], progress: dict[str, Any], max_steps: int | None
) -> RunStatus:
    run_id = run.name
    trained = progress.get(run_id, {})
    broadcast_step = layout.latest_stable_step(layout.broadcasts_dir(run)) or 0
    status = RunStatus(
        id=run_id,
        status="waiting",
        step=max(int(trained.get("step", 0)), broadcast_step),
        max_steps=max_steps,
        slot=slots.get(run_id),
        total_tokens=int(trained.get("total_tokens", 0)),
        total_samples=int(trained.get("total_samples", 0)),
    )
    condition = run_control.run_condition(run)
    if condition.kind in (Condition.EVICTED, Condition.REJECTED):
        status.status, status.reason, status.slot = condition.status, condition.reason, None
        status.evicted_by = condition.evicted_by
    elif condition.kind is Condition.FINISHED:
        status.status = condition.kind.value
    elif run_id in slots:
        status.status = "active"
    elif not layout.orch_config_path(run).is_file():
        status.reason = "no control/orch.toml yet"
    return status


class _MaxStepsCache:
    """Each run's max_steps, its orch.toml parsed again only when the file changes: the TUI
    asks for every run every second, and parsing TOML was nine tenths of what a poll cost.
    Runs that are gone are forgotten; threads may ask at once (a lock guards the table)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_experiment: dict[Path, dict[str, OnFileChange[int | None]]] = {}

    def of_runs(self, experiment: Path, runs: list[Path]) -> dict[str, int | None]:
        with self._lock:
            known = self._by_experiment.setdefault(experiment, {})
            for gone in set(known) - {run.name for run in runs}:
                del known[gone]
            for run in runs:
                if run.name not in known:
                    path = layout.orch_config_path(run)
                    known[run.name] = OnFileChange(path, partial(_read_max_steps, path))
            files = {run.name: known[run.name] for run in runs}
        return {name: file.get() for name, file in files.items()}


_max_steps_cache = _MaxStepsCache()


def _read_max_steps(path: Path) -> int | None:
    # Read leniently: a broken orch.toml is reported as a rejection, not a crash here.
    with contextlib.suppress(Exception):
        document = tomlkit.parse(path.read_text(encoding="utf-8"))
        value = document.get("max_steps")
        if value is None:
            return OrchestratorConfig.model_fields["max_steps"].default
        return int(value)
    return None
