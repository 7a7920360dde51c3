"""A sweep's outcome, read from the experiment directory alone: runs ranked by their eval.

Runs are ranked by the metric early stopping ranks them by (`[sweep.scheduler]`'s `metric`
and `mode`), or without a scheduler by `eval_reward_mean`, highest first; each run by its
last record of the metric in metrics.jsonl. A run without any record of it ranks last,
after every run with one; a run the trainer evicted because its training diverged
(`run_control.is_divergence`) after all of those, whatever its last record (of an adapter
on its way to nan, or of the version before). Ties go to the run that reached the later
step, then to the run id.

Each run's eval curve also gets a sigmoid fit against its steps (`workbench.sweep.fit`:
asymptote, midpoint, slope). Ranked `by="asymptote"`, the runs whose fit is reliable come
first, by predicted asymptote; the others follow, ranked by their last record as above.

For each run the report also gives its lineage (the runs it was forked from, back to one
that started afresh: a fork's `forked_from`, as population-based training writes them),
the step it reached, the highest early-stopping rung
it was judged at (from `sweep/asha.json`), whether early stopping evicted it or it
diverged, and how its `control/orch.toml` differs from the recipe's `[defaults]`.

`build_report` is pure reading; `write_report` adds `sweep_report.json` and
`sweep_report.png` (every run's eval curve) to the experiment directory. The TUI's
leaderboard reads the same files incrementally and ranks them with `rank_report`, so that
the two always agree.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from workbench.config import ConfigError, OrchestratorConfig, load_orchestrator_config, read_toml
from workbench.curves import EVAL_METRIC, Line, Panel, draw, image_bytes, metric_curve
from workbench.files import layout, run_control
from workbench.files.metrics import read_metrics
from workbench.sweep.asha import RungResult, latest_by_run
from workbench.sweep.files import AshaRecord, read_asha
from workbench.sweep.fit import SigmoidFit, fit_sigmoid
from workbench.sweep.pbt import lineage
from workbench.sweep.scheduler import EVICTED_BY
from workbench.sweep.spec import AshaSpec
from workbench.sweep.values import flatten_values

DEFAULT_METRIC = EVAL_METRIC
DEFAULT_MODE = "max"
RANKINGS = ("last", "asymptote")
REPORT_JSON = "sweep_report.json"
REPORT_PNG = "sweep_report.png"
NO_EVAL_NOTE = "no eval records"


@dataclass
class RunOutcome:
    """One run's line of the report."""

    id: str
    rank: int = 0
    value: float | None = None  # the metric at its last eval
    eval_step: int | None = None  # the step of that eval
    step: int = 0  # the highest step of any record in its metrics.jsonl
    rung: int | None = None  # highest early-stopping rung it was judged at
    rung_step: int | None = None
    evicted_by_scheduler: bool = False
    diverged: bool = False  # evicted by the trainer for divergence: ranked last
    differences: dict[str, Any] = field(default_factory=dict)  # dotted key -> its value
    evals: list[tuple[int, float]] = field(default_factory=list)  # (step, value), by step
    note: str | None = None
    fit: SigmoidFit | None = None  # of `evals`, when there is a version 0 and a later one
    # The run, then each run it was forked from at its step: `["b-pbt1", "a@10"]`.
    lineage: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["evals"] = [list(point) for point in self.evals]
        data["fit"] = None if self.fit is None else self.fit.to_json()
        return data


@dataclass
class SweepReport:
    experiment: Path
    metric: str
    mode: str  # "max" or "min"
    runs: list[RunOutcome]  # ranked, best first
    by: str = "last"  # "last" (record of the metric) or "asymptote" (of the sigmoid fit)

    @property
    def best(self) -> RunOutcome | None:
        """The top run, if any run that did not diverge has an eval record."""
        if self.runs and self.runs[0].value is not None and not self.runs[0].diverged:
            return self.runs[0]
        return None

    def score(self, run: RunOutcome) -> float | None:
        """What `run` is ranked by: its predicted asymptote when ranked by a reliable fit."""
        if self.by == "asymptote" and run.fit is not None and run.fit.reliable:
            return run.fit.asymptote
        return run.value

    def to_json(self) -> dict[str, Any]:
        best = self.best
        return {
            "experiment": str(self.experiment),
            "metric": self.metric,
            "mode": self.mode,
            "ranked_by": self.by,
            "runs": [run.to_json() for run in self.runs],
            "best": None
            if best is None
            else {
                "id": best.id,
                "value": best.value,
                "differences": best.differences,
                "lineage": best.lineage,
            },
        }


# ---------------------------------------------------------------- reading


def build_report(
    experiment: Path, by: str = "last", ranked_on: tuple[str, str] | None = None
) -> SweepReport:
    """Rank every run of `experiment` by the sweep's metric at its last record of it
    (`by="last"`), or by the asymptote of its reliable sigmoid fit first (`by="asymptote"`).
    `ranked_on`, a (metric, mode), ranks by another metric than the sweep's
    (`workbench compare` ranks several experiments by one)."""
    if by not in RANKINGS:
        raise ValueError(f"rank by {by!r}: choose {' or '.join(RANKINGS)}")
    recipe = read_recipe(experiment)
    asha = read_asha(experiment)
    metric, mode = ranked_on or ranking_metric(recipe, asha)
    defaults = recipe_defaults(recipe)
    outcomes = []
    for run in layout.list_run_dirs(experiment):
        records = read_metrics(run)
        steps = [r["step"] for r in records if isinstance(r.get("step"), int)]
        outcomes.append(
            run_outcome(
                run.name,
                metric_curve(records, metric),
                max(steps, default=0),
                config_differences(run, defaults),
            )
        )
    return rank_report(experiment, metric, mode, outcomes, asha, by)


def rank_report(
    experiment: Path,
    metric: str,
    mode: str,
    outcomes: list[RunOutcome],
    asha: AshaRecord | None,
    by: str = "last",
    evictions: Mapping[str, run_control.Eviction | None] | None = None,
) -> SweepReport:
    """The report of `outcomes`: each given its early-stopping standing, then ranked.
    Each run's eviction is read from its `control/evicted.txt` unless `evictions` holds
    it already (the TUI's status reader read it when the file changed)."""
    standings = latest_by_run(asha.results) if asha is not None else {}
    for outcome in outcomes:
        if evictions is not None and outcome.id in evictions:
            eviction = evictions[outcome.id]
        else:
            eviction = run_control.read_eviction(layout.run_dir(experiment, outcome.id))
        outcome.diverged = eviction is not None and run_control.is_divergence(eviction.reason)
        standing = standings.get(outcome.id)
        if standing is not None:
            outcome.rung, outcome.rung_step = standing.rung, standing.step
            outcome.evicted_by_scheduler = _evicted_by_scheduler(eviction, standing, asha)
    sources = {outcome.id: forked_from(outcome.differences) for outcome in outcomes}
    for outcome in outcomes:
        outcome.lineage = lineage(outcome.id, sources)
    ranked = rank_runs(outcomes, mode, by)
    return SweepReport(experiment=experiment, metric=metric, mode=mode, runs=ranked, by=by)


def rank_runs(runs: list[RunOutcome], mode: str, by: str = "last") -> list[RunOutcome]:
    """Best first; runs without a value last, then runs that diverged. Sets each run's
    `rank` (1 is the best). `by="asymptote"`: runs with a reliable fit first, by its
    asymptote."""
    sign = -1.0 if mode == "max" else 1.0

    def key(run: RunOutcome) -> tuple[int, float, int, str]:
        if run.diverged:
            value = 0.0 if run.value is None else sign * run.value
            return (3, value, -run.step, run.id)
        if by == "asymptote" and run.fit is not None and run.fit.reliable:
            return (0, sign * run.fit.asymptote, -run.step, run.id)
        if run.value is None:
            return (2, 0.0, 0, run.id)
        return (1, sign * run.value, -run.step, run.id)

    ranked = sorted(runs, key=key)
    for position, run in enumerate(ranked, start=1):
        run.rank = position
    return ranked


def run_outcome(
    run_id: str, evals: list[tuple[int, float]], step: int, differences: dict[str, Any] | None
) -> RunOutcome:
    """One run's line before ranking: `evals` is its curve of the metric (`metric_curve`),
    `step` the highest of any of its records, `differences` from `config_differences`."""
    outcome = RunOutcome(id=run_id, step=step, evals=evals, fit=fit_sigmoid(evals))
    if evals:
        outcome.eval_step, outcome.value = evals[-1]
    else:
        outcome.note = NO_EVAL_NOTE
    if differences is None:
        outcome.note = "; ".join(filter(None, [outcome.note, "no readable control/orch.toml"]))
    else:
        outcome.differences = differences
    return outcome


def read_recipe(experiment: Path) -> dict[str, Any]:
    """The experiment's recipe as plain tables; empty when it has no readable recipe."""
    try:
        document, _ = read_toml(layout.recipe_path(experiment))
    except ConfigError:
        return {}
    return document.unwrap()


def ranking_metric(recipe: dict[str, Any], asha: AshaRecord | None) -> tuple[str, str]:
    """The metric runs are ranked by and its mode ("max": higher is better): early
    stopping's, from the recipe's `[sweep.scheduler]` or else from `sweep/asha.json`;
    without early stopping, `eval_reward_mean`, highest first."""
    sweep = recipe.get("sweep")
    table = sweep.get("scheduler") if isinstance(sweep, dict) else None
    spec = asha.spec if asha is not None else None
    if isinstance(table, dict):
        # A table `up` would refuse ran no scheduler: asha.json, if any, has the spec used.
        with contextlib.suppress(ValueError):
            spec = AshaSpec.model_validate(table)
    if spec is None:
        return DEFAULT_METRIC, DEFAULT_MODE
    return spec.metric, spec.mode


def recipe_defaults(recipe: dict[str, Any]) -> dict[str, Any]:
    """The recipe's `[defaults]` as every key of a run's config (dotted keys); the
    orchestrator's own defaults when the recipe has none valid."""
    raw = recipe.get("defaults", {})
    try:
        config = OrchestratorConfig.model_validate(raw if isinstance(raw, dict) else {})
    except ValueError:
        config = OrchestratorConfig()
    return flatten_values(config.model_dump(mode="json"))


def config_differences(run: Path, defaults: dict[str, Any]) -> dict[str, Any] | None:
    """The run's orch.toml values that differ from `defaults`; None if it has none readable."""
    values = run_values(run)
    if values is None:
        return None
    return {key: value for key, value in values.items() if defaults.get(key) != value}


def run_values(run: Path) -> dict[str, Any] | None:
    """Every value of the run's orch.toml, defaults filled in, by dotted key; None if it
    has none readable."""
    try:
        config = load_orchestrator_config(layout.orch_config_path(run))
    except ConfigError:
        return None
    return flatten_values(config.model_dump(mode="json"))


def forked_from(values: dict[str, Any]) -> tuple[str, int] | None:
    """A run's (source, step) from its config values (`forked_from.run`, `.step`), or None."""
    source, step = values.get("forked_from.run"), values.get("forked_from.step")
    return (source, step) if isinstance(source, str) and isinstance(step, int) else None


def _evicted_by_scheduler(
    eviction: run_control.Eviction | None, standing: RungResult, asha: AshaRecord | None
) -> bool:
    # A run early stopping evicted and a user restarted is back in the race: only a stop
    # that was carried out and still stands counts; evicted again by hand, it is the
    # user's eviction that stands.
    if asha is None or standing.decision != "stop":
        return False
    if asha.actions.get((standing.run_id, standing.rung)) != "evicted":
        return False
    return eviction is not None and eviction.evicted_by == EVICTED_BY


# ---------------------------------------------------------------- writing


def write_report(report: SweepReport) -> list[Path]:
    """Write `sweep_report.json` and, when matplotlib is installed, `sweep_report.png`;
    returns the paths written."""
    json_path = report.experiment / REPORT_JSON
    layout.atomic_write_text(json_path, json.dumps(report.to_json(), indent=2) + "\n")
    written = [json_path]
    png = render_curves(report)
    if png is not None:
        png_path = report.experiment / REPORT_PNG
        layout.atomic_write_bytes(png_path, png)
        written.append(png_path)
    return written


def render_curves(report: SweepReport) -> bytes | None:
    """Every run's eval curve as PNG bytes (evicted and diverged runs dashed); None without
    matplotlib."""
    title = f"{report.experiment.name}: {report.metric} by step"
    try:
        return image_bytes(draw([eval_panel(report)], title))
    except ImportError:
        return None


def eval_panel(report: SweepReport, title: str | None = None) -> Panel:
    """Every run's eval curve by step, as `workbench.curves` draws it (runs early stopping
    evicted, and runs that diverged, dashed)."""
    lines = [
        Line(run.id, run.evals, label=_curve_label(run), dashed=_curve_label(run) != run.id)
        for run in report.runs
        if run.evals
    ]
    return Panel(report.metric, lines, markers=True, title=title)


def _curve_label(run: RunOutcome) -> str:
    if run.diverged:
        return f"{run.id} (diverged)"
    return f"{run.id} (evicted)" if run.evicted_by_scheduler else run.id
