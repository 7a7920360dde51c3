"""The leaderboard's data: every run ranked by the sweep's metric, as the TUI shows it.

The ranking is `workbench sweep report`'s own (`workbench.sweep.report`: the same metric
and mode, the same outcome of each run, the same order and early-stopping marks); only
the reading differs. The report reads every metrics.jsonl whole; here each run's curve
of the metric comes from the TUI's incremental metrics reader, and the recipe,
`sweep/asha.json` and each run's `control/orch.toml` are parsed again only when they
change on disk, so a refresh every second stays cheap.

Ranked `by="asymptote"` (`f` on the leaderboard, as `sweep report --by asymptote`), runs
whose sigmoid fit of the eval curve is reliable come first, by its predicted asymptote.

A run early stopping evicted (and nobody restarted since) is marked `EARLY_STOPPED`
rather than `evicted`: `evicted` on the leaderboard means evicted by anyone else (by hand
from the TUI or `workbench evict`, or by the trainer or orchestrator after an error),
except a run the trainer evicted because its training diverged: `diverged`, its status,
ranked last.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.files import layout
from workbench.files.run_control import Eviction
from workbench.status import RunStatus
from workbench.sweep.files import AshaRecord, read_asha
from workbench.sweep.fit import SigmoidFit
from workbench.sweep.report import (
    RunOutcome,
    config_differences,
    rank_report,
    ranking_metric,
    read_recipe,
    recipe_defaults,
    run_outcome,
)
from workbench.sweep.values import describe_values
from workbench.system.file_change import OnFileChange

EARLY_STOPPED = "early-stop"


@dataclass(frozen=True)
class Ranking:
    """What the runs are ranked by, and early stopping's decisions so far (if any)."""

    metric: str
    mode: str  # "max": higher is better
    asha: AshaRecord | None
    by: str = "last"  # "last" record of the metric, or "asymptote" of its reliable fit


@dataclass(frozen=True)
class RunMetric:
    """What the metrics reader followed of one run for the leaderboard."""

    status: RunStatus
    curve: tuple[tuple[int, float], ...]  # (step, value) of the metric, by step
    step: int  # the highest step of any record


@dataclass(frozen=True)
class LeaderboardRow:
    rank: int  # 1 is the best
    id: str
    state: str  # the run's status, or EARLY_STOPPED
    value: float | None  # the metric at its last record of it
    value_step: int | None  # the step of that record
    step: int
    rung: int | None  # the highest early-stopping rung it was judged at
    rung_step: int | None
    values: str  # what its orch.toml sets over [defaults], as a recipe spells it
    curve: tuple[float, ...]  # the metric's values, by step
    reason: str | None = None  # why it was evicted or rejected
    evicted_by: str | None = None
    note: str | None = None  # what the report notes: no records, no readable orch.toml
    fit: SigmoidFit | None = None  # of the metric's curve, version 0 on


@dataclass(frozen=True)
class Leaderboard:
    metric: str
    mode: str
    by: str = "last"
    rows: tuple[LeaderboardRow, ...] = ()

    def row(self, run_id: str) -> LeaderboardRow | None:
        return next((row for row in self.rows if row.id == run_id), None)


def leaderboard_row(
    outcome: RunOutcome, status: RunStatus, values: str | None = None
) -> LeaderboardRow:
    """`values`: `describe_values(outcome.differences)`, when the caller has it already."""
    return LeaderboardRow(
        rank=outcome.rank,
        id=outcome.id,
        state=EARLY_STOPPED if outcome.evicted_by_scheduler else status.status,
        value=outcome.value,
        value_step=outcome.eval_step,
        step=outcome.step,
        rung=outcome.rung,
        rung_step=outcome.rung_step,
        values=describe_values(outcome.differences) if values is None else values,
        curve=tuple(value for _, value in outcome.evals),
        reason=status.reason,
        evicted_by=status.evicted_by,
        note=outcome.note,
        fit=outcome.fit,
    )


def evictions_of(statuses: Mapping[str, RunStatus]) -> dict[str, Eviction | None]:
    """Each run's eviction as its status read it: ranking then opens no file per run."""
    return {
        run_id: Eviction(status.reason or "", evicted_at=None, evicted_by=status.evicted_by)
        if status.status in ("evicted", "diverged")
        else None
        for run_id, status in statuses.items()
    }


class LeaderboardReader:
    """Ranks the runs of one experiment; keeps what it parsed of its files between polls."""

    def __init__(self, experiment: Path) -> None:
        self.experiment = experiment
        self.by = "last"  # what `ranking()` ranks by: one of sweep.report.RANKINGS
        self._recipe = OnFileChange(layout.recipe_path(experiment), self._read_recipe)
        self._asha = OnFileChange(layout.asha_state_path(experiment), lambda: read_asha(experiment))
        self._differences: dict[str, OnFileChange[dict[str, Any] | None]] = {}
        # Each run's values as shown, with the differences they describe: the same object
        # while its orch.toml is unchanged, so a poll describes only the runs edited.
        self._described: dict[str, tuple[dict[str, Any] | None, str]] = {}

    def _read_recipe(self) -> tuple[dict[str, Any], dict[str, Any]]:
        recipe = read_recipe(self.experiment)
        self._differences.clear()  # measured against the defaults of the recipe before
        return recipe, recipe_defaults(recipe)

    def _values_of(self, outcome: RunOutcome) -> str:
        known = self._described.get(outcome.id)
        if known is not None and known[0] is outcome.differences:
            return known[1]
        text = describe_values(outcome.differences)
        self._described[outcome.id] = (outcome.differences, text)
        return text

    def ranking(self) -> Ranking:
        asha = self._asha.get()
        recipe, _ = self._recipe.get()
        metric, mode = ranking_metric(recipe, asha)
        return Ranking(metric, mode, asha, self.by)

    def leaderboard(self, ranking: Ranking, runs: Sequence[RunMetric]) -> Leaderboard:
        """`runs` ranked by `ranking`'s metric, best first."""
        _, defaults = self._recipe.get()
        for gone in set(self._differences) - {run.status.id for run in runs}:
            del self._differences[gone]
            self._described.pop(gone, None)
        outcomes = []
        for run in runs:
            differences = self._differences.get(run.status.id)
            if differences is None:
                directory = layout.run_dir(self.experiment, run.status.id)
                differences = OnFileChange(
                    layout.orch_config_path(directory),
                    lambda directory=directory: config_differences(directory, defaults),
                )
                self._differences[run.status.id] = differences
            outcomes.append(
                run_outcome(run.status.id, list(run.curve), run.step, differences.get())
            )
        statuses = {run.status.id: run.status for run in runs}
        report = rank_report(
            self.experiment,
            ranking.metric,
            ranking.mode,
            outcomes,
            ranking.asha,
            ranking.by,
            evictions=evictions_of(statuses),
        )
        rows = tuple(
            leaderboard_row(outcome, statuses[outcome.id], self._values_of(outcome))
            for outcome in report.runs
        )
        return Leaderboard(metric=ranking.metric, mode=ranking.mode, by=ranking.by, rows=rows)
