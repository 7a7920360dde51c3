"""What must hold after the load, read from the experiment's files (pure reads, so the
tests build the files by hand).

- no leaked slot: every slot the trainer holds (`trainer/runs.json`) belongs to a run that
  may train (not evicted, finished, rejected or gone), and no slot is free while a run waits;
- no lost run: every run ever added is finished, evicted, training in a slot, or waiting
  in the trainer's queue, and every run that may train has a live orchestrator, or one
  that waits for inference to be ready (a starved machine's vLLM may still be starting at
  the end: such runs are not started yet, and counted apart);
- complete metrics: a finished run's `metrics.jsonl` has the trainer's record of every step
  1..max_steps and the orchestrator's record of every batch it wrote for them; no run has a
  gap in its trained steps;
- no crash: inference and the trainer never exited unasked; no orchestrator failed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workbench.bench.faults.invariants import trained_steps
from workbench.config import ConfigError, load_orchestrator_config
from workbench.files import layout
from workbench.files.metrics import read_metrics
from workbench.orchestrator.__main__ import EXIT_EVICTED
from workbench.status import RunStatus
from workbench.supervisor.lifecycle import STARTED_STATES, UP_STATES, ProcessState

ENDED = ("evicted", "diverged", "finished", "rejected")
# How an orchestrator may end by itself: done, or evicted (it saw control/evicted.txt).
ORCHESTRATOR_EXITS_OK = (0, EXIT_EVICTED)


def slot_problems(statuses: list[RunStatus], trainer: dict[str, Any] | None) -> list[str]:
    if trainer is None:
        return ["no trainer state (trainer/runs.json), or its trainer is gone"]
    by_id = {status.id: status for status in statuses}
    held = {str(idx): str(run_id) for idx, run_id in (trainer.get("slots") or {}).items()}
    problems = []
    for idx, run_id in sorted(held.items()):
        status = by_id.get(run_id)
        if status is None:
            problems.append(f"slot {idx} held by {run_id}, whose directory is gone")
        elif status.status in ENDED:
            problems.append(f"slot {idx} held by {run_id}, which is {status.status}")
    waiting = [status.id for status in statuses if status.status == "waiting"]
    free = int(trainer.get("max_runs", 0)) - len(held)
    if waiting and free > 0:
        problems.append(f"{free} slot(s) free while {len(waiting)} run(s) wait: {waiting[:4]}")
    return problems


def lost_runs(
    added: list[str],
    statuses: list[RunStatus],
    trainer: dict[str, Any] | None,
    orchestrators: dict[str, str],
    inference: str | None = None,
) -> list[str]:
    """Runs added that are nowhere: `orchestrators` maps run ids to their process state,
    `inference` is inference's. An orchestrator waiting while inference is not up is not
    started yet (`not_started`); waiting while inference is up, it is lost."""
    by_id = {status.id: status for status in statuses}
    queued = set((trainer or {}).get("waiting") or [])
    lost = []
    for run_id in added:
        status = by_id.get(run_id)
        if status is None:
            lost.append(f"{run_id}: its directory is gone")
            continue
        if status.status in ("evicted", "diverged", "finished"):
            continue
        if status.status not in ("active", "waiting"):
            lost.append(f"{run_id}: {status.status}: {status.reason}")
        elif status.status == "waiting" and run_id not in queued:
            lost.append(f"{run_id}: waiting, but not in the trainer's queue")
        elif orchestrators.get(run_id) == ProcessState.WAITING and inference not in UP_STATES:
            continue  # not started yet: the supervisor starts it once inference is ready
        elif orchestrators.get(run_id) not in STARTED_STATES:
            lost.append(f"{run_id}: {status.status}, its orchestrator {orchestrators.get(run_id)}")
    return lost


def not_started(
    added: list[str], orchestrators: dict[str, str], inference: str | None = None
) -> list[str]:
    """Runs added whose orchestrator waits for inference, which is not up (`lost_runs`
    counts one that waits while inference is up as lost, not here)."""
    if inference in UP_STATES:
        return []
    return [run_id for run_id in added if orchestrators.get(run_id) == ProcessState.WAITING]


def metrics_problems(run: Path, finished: bool) -> list[str]:
    """Gaps in a run's metrics; for a finished run, any step of its max_steps missing."""
    trained = trained_steps(run)
    problems = []
    if trained != list(range(1, len(trained) + 1)):
        problems.append(f"{run.name}: trained steps have gaps: {_ranges(trained)}")
    if not finished:
        return problems
    try:
        max_steps = load_orchestrator_config(layout.orch_config_path(run)).max_steps
    except (ConfigError, OSError) as err:
        return [*problems, f"{run.name}: cannot read its max_steps: {err}"]
    expected = list(range(1, max_steps + 1))
    if trained != expected:
        problems.append(f"{run.name}: finished with trainer steps {_ranges(trained)}")
    # Batch N (rollouts/step_N, N from 0) is what the trainer's step N + 1 trains.
    written = sorted(
        {int(m["step"]) + 1 for m in read_metrics(run, "orchestrator") if m.get("written")}
    )
    if written != expected:
        problems.append(f"{run.name}: finished with batches written for {_ranges(written)}")
    return problems


def crash_problems(state: dict[str, Any]) -> list[str]:
    """Exits nobody asked for, from the supervisor's state.json."""
    problems = []
    for name, record in (state.get("processes") or {}).items():
        if not isinstance(record, dict):
            continue
        shared = record.get("kind") in ("inference", "trainer")
        for exit_record in record.get("exits") or []:
            if exit_record.get("stop_requested"):
                continue
            code = exit_record.get("code")
            if shared or code not in ORCHESTRATOR_EXITS_OK:
                problems.append(
                    f"{name} ended unasked ({_how(exit_record)}) at {exit_record.get('time')}"
                )
    return problems


def _how(exit_record: dict[str, Any]) -> str:
    if exit_record.get("error"):
        return f"not started: {exit_record['error']}"
    if exit_record.get("code") is None:
        return f"signal {exit_record.get('signal')}"
    return f"exit {exit_record['code']}"


def _ranges(steps: list[int]) -> str:
    """1-4,6,8-9: steps as runs of consecutive numbers."""
    if not steps:
        return "none"
    parts = []
    start = previous = steps[0]
    for step in [*steps[1:], None]:
        if step is not None and step == previous + 1:
            previous = step
            continue
        parts.append(str(start) if start == previous else f"{start}-{previous}")
        if step is not None:
            start = previous = step
    return ",".join(parts)
