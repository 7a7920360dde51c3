"""Which adapters a run keeps, and which one `workbench export` takes.

A run keeps its adapter in two places (docs/contracts.md): `broadcast/step_N/` after every
update, in peft's format (the last few), and `checkpoints/step_N/trainer/` at its checkpoint
interval and last step, as the trainer's slot parameters (the last few). Only directories
with their STABLE marker count: anything else may be half-written. Where both hold a step,
the broadcast is taken.

`best` is the kept adapter with the highest `eval_reward_mean` when a kept adapter was
evaluated, else the one whose rollouts had the highest mean training reward (orchestrator
records by `policy_version`; the last adapter generates none), else the latest.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from workbench.curves import metric_curve
from workbench.files import layout
from workbench.files.metrics import read_metrics
from workbench.trainer.runs.checkpoint import PART as TRAINER_PART

Which = Literal["best", "latest"]
EVAL_METRIC = "eval_reward_mean"
REWARD_METRIC = "reward_mean"


class ExportError(RuntimeError):
    """An export that cannot be done; the message names the run and what to do."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class KeptAdapter:
    step: int
    path: Path
    kind: Literal["broadcast", "checkpoint"]


@dataclass(frozen=True)
class Choice:
    adapter: KeptAdapter
    which: Which
    metric: str | None  # what `best` ranked by; None: the latest was taken
    value: float | None
    note: str  # why this one, for the user and the model card


def kept_adapters(run: Path) -> dict[int, KeptAdapter]:
    """Every complete adapter the run keeps, by step."""
    kept = {
        step: KeptAdapter(step, path / TRAINER_PART, "checkpoint")
        for step, path in layout.list_step_dirs(layout.checkpoints_dir(run))
        if layout.is_stable(path / TRAINER_PART)
    }
    for step, path in layout.list_step_dirs(layout.broadcasts_dir(run)):
        if layout.is_stable(path):
            kept[step] = KeptAdapter(step, path, "broadcast")
    return dict(sorted(kept.items()))


def choose_adapter(run: Path, which: Which) -> Choice:
    """The adapter to export; ExportError when the run has no complete one."""
    kept = kept_adapters(run)
    if not kept:
        raise ExportError(no_adapter_message(run))
    latest = kept[max(kept)]
    if which == "latest":
        return Choice(latest, which, None, None, f"the latest adapter (step {latest.step})")
    evals = dict(metric_curve(read_metrics(run, "eval"), EVAL_METRIC))
    scored = {step: value for step, value in evals.items() if step in kept}
    metric = EVAL_METRIC
    if not scored:
        scored, metric = _training_rewards(run, kept), REWARD_METRIC
    if not scored:
        note = f"no kept adapter has an eval or a reward yet: the latest (step {latest.step})"
        return Choice(latest, which, None, None, note)
    step = max(scored, key=lambda s: (scored[s], s))
    what = "held-out eval reward" if metric == EVAL_METRIC else "training reward of its rollouts"
    note = f"the best kept adapter by {what} ({metric} {scored[step]:.3f} at step {step})"
    best_evaluated = max(evals, key=lambda s: (evals[s], s), default=None)
    if metric == EVAL_METRIC and best_evaluated not in scored:
        what = "the base model" if best_evaluated == 0 else "an adapter no longer kept"
        note += f"; {what} scored {evals[best_evaluated]:.3f} (step {best_evaluated})"
    return Choice(kept[step], which, metric, scored[step], note)


def _training_rewards(run: Path, kept: dict[int, KeptAdapter]) -> dict[int, float]:
    """Mean `reward_mean` of the rollouts each kept adapter generated."""
    by_version: dict[int, list[float]] = {}
    for record in read_metrics(run, "orchestrator"):
        version, value = record.get("policy_version"), record.get(REWARD_METRIC)
        if version in kept and isinstance(value, int | float):
            by_version.setdefault(version, []).append(float(value))
    return {version: statistics.fmean(values) for version, values in by_version.items()}


def no_adapter_message(run: Path) -> str:
    candidates = [path for _, path in layout.list_step_dirs(layout.broadcasts_dir(run))] + [
        path / TRAINER_PART for _, path in layout.list_step_dirs(layout.checkpoints_dir(run))
    ]
    partial = [str(path.relative_to(run)) for path in candidates if path.is_dir()]
    seen = f" ({', '.join(partial)}: no STABLE marker, being written)" if partial else ""
    return (
        f"{run.name} has no complete adapter yet: no broadcast/step_N or "
        f"checkpoints/step_N/trainer with a STABLE marker{seen}. Wait for its first "
        "training step (`workbench status`) and export again, or export another run."
    )
