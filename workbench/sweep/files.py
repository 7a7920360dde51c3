"""The sweep's files in the experiment directory (docs/contracts.md), read and written whole.

- `sweep/plan.json`, written by `workbench up` for a recipe with a `[sweep]`: every run of
  the recipe in admission order with the values it sets over `[defaults]`.
- `sweep/asha.json`, written by the supervisor's early stopping after every decision:
  the scheduler's settings and every rung result, each with what was done about it.
- `sweep/pbt.json`, written by the supervisor's population-based training the same way:
  its settings and every decision, each with what was done about it.

Readers (`workbench status`, the TUI) get None or empty results for a missing or torn
file rather than an exception: the files are written atomically, so that only happens
for an experiment without a sweep.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from workbench.files import layout
from workbench.sweep.asha import RungResult
from workbench.sweep.expand import PlannedRun
from workbench.sweep.pbt import PbtDecision
from workbench.sweep.spec import AshaSpec, PbtSpec
from workbench.system.clock import now_iso

PLAN_FORMAT = "workbench.sweep_plan"
ASHA_FORMAT = "workbench.asha"
PBT_FORMAT = "workbench.pbt"
VERSION = 1


# ---------------------------------------------------------------- plan.json


def write_plan(experiment: Path, runs: list[PlannedRun], slots: int) -> None:
    payload = {
        "format": PLAN_FORMAT,
        "version": VERSION,
        "slots": slots,
        "runs": [
            {"id": run.run_id, "source": run.source, "position": position, "values": run.values}
            for position, run in enumerate(runs)
        ],
        "created_at": now_iso(),
    }
    layout.atomic_write_text(
        layout.sweep_plan_path(experiment), json.dumps(payload, indent=2) + "\n"
    )


def read_plan_values(experiment: Path) -> dict[str, dict[str, Any]]:
    """Each planned run's values (dotted key -> value); empty without a plan."""
    payload = _read_json(layout.sweep_plan_path(experiment))
    if payload is None:
        return {}
    return {
        str(run["id"]): dict(run.get("values") or {})
        for run in payload.get("runs", [])
        if isinstance(run, dict) and "id" in run
    }


# ---------------------------------------------------------------- asha.json


@dataclass
class AshaRecord:
    """What asha.json holds: the settings it was decided under, and the results so far.

    `actions[(run_id, rung)]` says what was done about a stop: "evicted", or why nothing
    was ("already evicted", "finished"); a stop without an action is still to be carried out.
    """

    spec: AshaSpec
    results: list[RungResult]
    actions: dict[tuple[str, int], str]


def write_asha(experiment: Path, record: AshaRecord) -> None:
    results = [
        {**result.to_json(), "action": record.actions.get((result.run_id, result.rung))}
        for result in record.results
    ]
    _write_state(layout.asha_state_path(experiment), ASHA_FORMAT, record.spec, "results", results)


def read_asha(experiment: Path) -> AshaRecord | None:
    payload = _read_json(layout.asha_state_path(experiment))
    if payload is None:
        return None
    try:
        spec = AshaSpec.model_validate(payload["spec"])
        results = [RungResult.from_json(item) for item in payload["results"]]
    except (KeyError, TypeError, ValueError):
        return None
    actions = {
        (item["run_id"], item["rung"]): item["action"]
        for item in payload["results"]
        if item.get("action")
    }
    return AshaRecord(spec, results, actions)


# ---------------------------------------------------------------- pbt.json


@dataclass
class PbtRecord:
    """What pbt.json holds: the settings it was decided under, and the decisions so far.

    `actions[(run_id, step)]` says what was done about an exploit: "forked" (the fork is
    written), "evicted" (and the run it replaces stopped), or why not ("fork failed: ...",
    "finished"); an exploit without an action is still to be carried out.
    """

    spec: PbtSpec
    decisions: list[PbtDecision]
    actions: dict[tuple[str, int], str]


def write_pbt(experiment: Path, record: PbtRecord) -> None:
    payload = {
        "format": PBT_FORMAT,
        "version": VERSION,
        "spec": record.spec.model_dump(mode="json"),
        "decisions": [
            {**decision.to_json(), "action": record.actions.get((decision.run_id, decision.step))}
            for decision in record.decisions
        ],
        "updated_at": now_iso(),
    }
    layout.atomic_write_text(
        layout.pbt_state_path(experiment), json.dumps(payload, indent=2) + "\n"
    )


def read_pbt(experiment: Path) -> PbtRecord | None:
    payload = _read_json(layout.pbt_state_path(experiment))
    if payload is None:
        return None
    try:
        spec = PbtSpec.model_validate(payload["spec"])
        decisions = [PbtDecision.from_json(item) for item in payload["decisions"]]
    except (KeyError, TypeError, ValueError):
        return None
    actions = {
        (item["run_id"], item["step"]): item["action"]
        for item in payload["decisions"]
        if item.get("action")
    }
    return PbtRecord(spec, decisions, actions)


def _write_state(
    path: Path, format: str, spec: BaseModel, key: str, items: list[dict[str, Any]]
) -> None:
    """A scheduler's file: its settings and its decisions, each with its action."""
    payload = {
        "format": format,
        "version": VERSION,
        "spec": spec.model_dump(mode="json"),
        key: items,
        "updated_at": now_iso(),
    }
    layout.atomic_write_text(path, json.dumps(payload, indent=2) + "\n")


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return payload if isinstance(payload, dict) else None
