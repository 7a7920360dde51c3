"""A sweep's outcome, read from the experiment directory alone: runs ranked by their eval.

Each run is ranked by its metric (`eval_reward_mean` by default) at its last eval record
in metrics.jsonl; higher is better unless early stopping ranks the same metric with
`mode = "min"`. A run without any eval record ranks last, after every run with one.
Ties go to the run that reached the later step, then to the run id.

Each run's eval curve also gets a sigmoid fit against its steps (`workbench.sweep.fit`:
asymptote, midpoint, slope). Ranked `by="asymptote"`, the runs whose fit is reliable come
first, by predicted asymptote; the others follow, ranked by their last eval as above.

For each run the report also gives the step it reached, the highest early-stopping rung
it was judged at (from `sweep/asha.json`), whether early stopping evicted it, and how its
`control/orch.toml` differs from the recipe's `[defaults]`.

`build_report` is pure reading; `write_report` adds `sweep_report.json` and
`sweep_report.png` (every run's eval curve) to the experiment directory.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from workbench import control, layout
from workbench.config import ConfigError, OrchestratorConfig, load_orchestrator_config, read_toml
from workbench.metrics import read_metrics
from workbench.sweep.asha import RungResult, latest_by_run
from workbench.sweep.files import AshaRecord, read_asha
from workbench.sweep.fit import SigmoidFit, fit_sigmoid
from workbench.sweep.values import flatten_values

DEFAULT_METRIC = "eval_reward_mean"
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
    differences: dict[str, Any] = field(default_factory=dict)  # dotted key -> its value
    evals: list[tuple[int, float]] = field(default_factory=list)  # (step, value), by step
    fit: SigmoidFit | None = None  # of `evals`, when there is a version 0 and a later one
    note: str | None = None

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
    by: str = "last"  # "last" (eval) or "asymptote" (of the sigmoid fit)

    @property
    def best(self) -> RunOutcome | None:
        """The top run, if any run has an eval record."""
        if self.runs and self.runs[0].value is not None:
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
            else {"id": best.id, "value": best.value, "differences": best.differences},
        }


# ---------------------------------------------------------------- reading


def build_report(experiment: Path, metric: str = DEFAULT_METRIC, by: str = "last") -> SweepReport:
    """Rank every run of `experiment` by `metric` at its last eval (`by="last"`), or by
    the asymptote of its reliable sigmoid fit first (`by="asymptote"`)."""
    if by not in RANKINGS:
        raise ValueError(f"rank by {by!r}: choose {' or '.join(RANKINGS)}")
    asha = read_asha(experiment)
    mode = asha.spec.mode if asha is not None and asha.spec.metric == metric else "max"
    defaults = recipe_defaults(experiment)
    standings = latest_by_run(asha.results) if asha is not None else {}
    runs = []
    for run in layout.list_run_dirs(experiment):
        outcome = _outcome(run, metric, defaults)
        standing = standings.get(run.name)
        if standing is not None:
            outcome.rung, outcome.rung_step = standing.rung, standing.step
            outcome.evicted_by_scheduler = _evicted_by_scheduler(run, standing, asha)
        runs.append(outcome)
    ranked = rank_runs(runs, mode, by)
    return SweepReport(experiment=experiment, metric=metric, mode=mode, runs=ranked, by=by)


def rank_runs(runs: list[RunOutcome], mode: str, by: str = "last") -> list[RunOutcome]:
    """Best first; runs without a value last. Sets each run's `rank` (1 is the best).
    `by="asymptote"`: runs with a reliable fit first, by its asymptote."""
    sign = -1.0 if mode == "max" else 1.0

    def key(run: RunOutcome) -> tuple[int, float, int, str]:
        if by == "asymptote" and run.fit is not None and run.fit.reliable:
            return (0, sign * run.fit.asymptote, -run.step, run.id)
        if run.value is None:
            return (2, 0.0, 0, run.id)
        return (1, sign * run.value, -run.step, run.id)

    ranked = sorted(runs, key=key)
    for position, run in enumerate(ranked, start=1):
        run.rank = position
    return ranked


def eval_curve(records: list[dict[str, Any]], metric: str) -> list[tuple[int, float]]:
    """(step, value) of each eval record holding a finite `metric`, by step; a step scored
    twice (an eval redone after a restart) keeps the value written last."""
    by_step: dict[int, float] = {}
    for record in records:
        value, step = record.get(metric), record.get("step")
        if isinstance(step, int) and _is_number(value) and math.isfinite(value):
            by_step[step] = float(value)
    return sorted(by_step.items())


def recipe_defaults(experiment: Path) -> dict[str, Any]:
    """The recipe's `[defaults]` as every key of a run's config (dotted keys); the
    orchestrator's own defaults when the experiment has no readable recipe."""
    table: dict[str, Any] = {}
    try:
        document, _ = read_toml(layout.recipe_path(experiment))
        raw = document.unwrap().get("defaults", {})
        table = raw if isinstance(raw, dict) else {}
        config = OrchestratorConfig.model_validate(table)
    except (ConfigError, ValueError):
        config = OrchestratorConfig()
    return flatten_values(config.model_dump(mode="json"))


def config_differences(run: Path, defaults: dict[str, Any]) -> dict[str, Any] | None:
    """The run's orch.toml values that differ from `defaults`; None if it has none readable."""
    try:
        config = load_orchestrator_config(layout.orch_config_path(run))
    except ConfigError:
        return None
    values = flatten_values(config.model_dump(mode="json"))
    return {key: value for key, value in values.items() if defaults.get(key) != value}


def _outcome(run: Path, metric: str, defaults: dict[str, Any]) -> RunOutcome:
    records = read_metrics(run)
    steps = [r["step"] for r in records if isinstance(r.get("step"), int)]
    evals = eval_curve([r for r in records if r.get("source") == "eval"], metric)
    outcome = RunOutcome(id=run.name, step=max(steps, default=0), evals=evals)
    outcome.fit = fit_sigmoid(evals)
    if evals:
        outcome.eval_step, outcome.value = evals[-1]
    else:
        outcome.note = NO_EVAL_NOTE
    differences = config_differences(run, defaults)
    if differences is None:
        outcome.note = "; ".join(filter(None, [outcome.note, "no readable control/orch.toml"]))
    else:
        outcome.differences = differences
    return outcome


def _evicted_by_scheduler(run: Path, standing: RungResult, asha: AshaRecord | None) -> bool:
    # A run early stopping evicted and a user restarted is back in the race: only a stop
    # that was carried out and still stands counts.
    if asha is None or standing.decision != "stop":
        return False
    action = asha.actions.get((standing.run_id, standing.rung))
    return action == "evicted" and control.read_eviction(run) is not None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


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
    """Every run's eval curve as PNG bytes (evicted runs dashed); None without matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    # A Figure with its own Agg canvas, not pyplot: no global backend, no display needed.
    figure = Figure(figsize=(8, 5), dpi=100)
    FigureCanvasAgg(figure)
    draw_eval_curves(figure.add_subplot(), report)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight")
    return buffer.getvalue()


def draw_eval_curves(axes: Any, report: SweepReport, title: str | None = None) -> None:
    """Every run's eval curve by step on matplotlib `axes` (evicted runs dashed)."""
    for run in report.runs:
        if not run.evals:
            continue
        steps, values = zip(*run.evals, strict=True)
        style = "--" if run.evicted_by_scheduler else "-"
        label = f"{run.id} (evicted)" if run.evicted_by_scheduler else run.id
        axes.plot(steps, values, linestyle=style, marker="o", markersize=3, label=label)
    axes.set_xlabel("step")
    axes.set_ylabel(report.metric)
    axes.set_title(title or f"{report.experiment.name}: {report.metric} by step")
    if axes.lines:
        axes.legend(fontsize="small", loc="best")
    axes.grid(alpha=0.3)
