"""Runs of several experiments ranked together, where their metric means the same thing.

`workbench compare`, `workbench plot EXPERIMENT...` and the TUI's all-experiments view
(`a` on the leaderboard) read through here. Each experiment is read and each run judged as
`workbench sweep report` does (`report.build_report`: the same outcome of each run, the
same diverged and early-stopped marks); then the runs of every experiment are ranked
together by `report.rank_runs`.

A metric compares runs only when they measure it on the same task with the same model: an
eval reward of 0.8 on one environment says nothing against 0.6 on another, nor does a
larger base model's. So runs are ranked in groups, one per (base model, environment) pair,
and a comparison of more than one group says why it keeps them apart. An experiment whose
runs train on different environments has runs in more than one group.

Within a group each run shows the values that differ between its runs (every key of each
run's `control/orch.toml`, defaults filled in), not against one recipe's `[defaults]`:
experiments have recipes of their own. Its lineage (`runs fork`'s `forked_from`, followed
back through the runs of its experiment) is shown apart from those values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench import curves
from workbench.files import layout
from workbench.sweep.files import read_asha
from workbench.sweep.pbt import lineage_sources
from workbench.sweep.report import (
    DEFAULT_METRIC,
    DEFAULT_MODE,
    RunOutcome,
    build_report,
    forked_from,
    rank_runs,
    ranking_metric,
    read_recipe,
    run_values,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

LINEAGE_KEY = "forked_from"
UNKNOWN = "unknown"  # a base model or environment no readable file names


@dataclass(frozen=True)
class Source:
    """One step of a run's lineage: the run it was forked from, and at which step."""

    run: str
    step: int


@dataclass
class ComparedRun:
    experiment: Path
    experiment_label: str  # how the experiment is named in tables: its folder's name
    outcome: RunOutcome  # `differences`: the values that differ between its group's runs
    lineage: list[Source] = field(default_factory=list)  # its source first, then that one's

    def describe_lineage(self) -> str:
        """`run_b@30 <- run_a@20`: where it came from, nearest first; "" for a fresh run."""
        return " <- ".join(f"{source.run}@{source.step}" for source in self.lineage)

    def to_json(self) -> dict[str, Any]:
        return {
            "experiment": str(self.experiment),
            **self.outcome.to_json(),
            "lineage": [{"run": source.run, "step": source.step} for source in self.lineage],
        }


@dataclass
class ComparisonGroup:
    """Runs on one base model and one environment: their metric means the same thing."""

    base_model: str
    env: str
    runs: list[ComparedRun]  # ranked, best first

    @property
    def best(self) -> ComparedRun | None:
        top = self.runs[0] if self.runs else None
        if top is None or top.outcome.value is None or top.outcome.diverged:
            return None
        return top

    @property
    def experiments(self) -> list[str]:
        return list(dict.fromkeys(run.experiment_label for run in self.runs))

    def to_json(self) -> dict[str, Any]:
        best = self.best
        return {
            "base_model": self.base_model,
            "env": self.env,
            "runs": [run.to_json() for run in self.runs],
            "best": None
            if best is None
            else {
                "experiment": str(best.experiment),
                "id": best.outcome.id,
                "value": best.outcome.value,
            },
        }


@dataclass
class Comparison:
    experiments: list[Path]
    metric: str
    mode: str  # "max": higher is better
    by: str  # "last" or "asymptote", as `sweep report --by`
    groups: list[ComparisonGroup]
    notes: list[str] = field(default_factory=list)  # how the metric was chosen, when it matters

    def apart_reason(self) -> str | None:
        """Why the runs are ranked in more than one group; None when they are not."""
        reason = apart_reason([(g.base_model, g.env) for g in self.groups], self.metric)
        return None if reason is None else f"ranked in {reason}"

    def to_json(self) -> dict[str, Any]:
        return {
            "experiments": [str(path) for path in self.experiments],
            "metric": self.metric,
            "mode": self.mode,
            "ranked_by": self.by,
            "apart": self.apart_reason(),
            "notes": self.notes,
            "groups": [group.to_json() for group in self.groups],
        }


@dataclass(frozen=True)
class GroupedRun:
    experiment: Path
    run_id: str
    values: dict[str, Any] | None  # every value of its orch.toml; None if unreadable


def group_runs(experiments: Sequence[Path]) -> dict[tuple[str, str], list[GroupedRun]]:
    """Every run of `experiments` by (base model, environment), groups and runs in the
    order the experiments and their runs come."""
    groups: dict[tuple[str, str], list[GroupedRun]] = {}
    for experiment in experiments:
        base_model = _base_model(experiment)
        for run in layout.list_run_dirs(experiment):
            values = run_values(run)
            env = str(values.get("env", UNKNOWN)) if values else UNKNOWN
            groups.setdefault((base_model, env), []).append(
                GroupedRun(experiment, run.name, values)
            )
    return groups


def apart_reason(keys: Sequence[tuple[str, str]], metric: str) -> str | None:
    """Why runs of these (base model, environment) groups are not ranked together, naming
    what differs; None for one group."""
    if len(keys) < 2:
        return None
    differing = []
    if len({base_model for base_model, _ in keys}) > 1:
        differing.append("base models")
    if len({env for _, env in keys}) > 1:
        differing.append("environments")
    return (
        f"{len(keys)} separate groups: the runs train on different {' and '.join(differing)}, "
        f"and {metric} on one does not measure the same thing as on another"
    )


def compare_experiments(
    experiments: Sequence[Path],
    by: str = "last",
    metric: str | None = None,
    mode: str | None = None,
) -> Comparison:
    """Every run of `experiments` ranked by `metric` (default: the metric the experiments'
    own reports rank by when they all agree, else eval_reward_mean) in groups of one base
    model and one environment. `mode` defaults to that metric's in the experiments, else
    "max". Raises ValueError for a `by` that `sweep report` does not know."""
    metric, mode, notes = _chosen_metric(experiments, metric, mode)
    labels = experiment_labels(experiments)
    outcomes = {
        (experiment, outcome.id): outcome
        for experiment in experiments
        for outcome in build_report(experiment, by=by, ranked_on=(metric, mode)).runs
    }
    grouped = group_runs(experiments)
    values_by_experiment: dict[Path, dict[str, dict[str, Any] | None]] = {}
    for members in grouped.values():
        for member in members:
            values_by_experiment.setdefault(member.experiment, {})[member.run_id] = member.values
    groups = []
    for (base_model, env), all_members in grouped.items():
        # A run added between the two readings (experiments may be running) waits for the
        # next comparison.
        members = [m for m in all_members if (m.experiment, m.run_id) in outcomes]
        runs = [
            ComparedRun(
                member.experiment,
                labels[member.experiment],
                outcomes[(member.experiment, member.run_id)],
                lineage_of(member.run_id, values_by_experiment[member.experiment]),
            )
            for member in members
        ]
        if not runs:
            continue
        _set_differences(runs, [member.values for member in members])
        by_outcome = {id(run.outcome): run for run in runs}
        ranked = rank_runs([run.outcome for run in runs], mode, by)
        groups.append(ComparisonGroup(base_model, env, [by_outcome[id(o)] for o in ranked]))
    return Comparison(list(experiments), metric, mode, by, groups, notes)


def comparison_figure(experiments: Sequence[Path]) -> tuple[Figure, str | None]:
    """`workbench plot EXPERIMENT...`: every run's reward and eval curves, each named
    `experiment/run` (the run id alone for one experiment), and why the runs are drawn
    apart, if they are: a row of panels per (base model, environment), titled by them.
    Raises NothingToPlot when no run has a point, ImportError without matplotlib."""
    if len(experiments) == 1:
        return curves.experiment_figure(experiments[0]), None
    labels = experiment_labels(experiments)
    grouped = group_runs(experiments)
    apart = len(grouped) > 1
    names = {
        (member.experiment, member.run_id): f"{labels[member.experiment]}/{member.run_id}"
        for members in grouped.values()
        for member in members
    }
    panels = []
    for (base_model, env), members in grouped.items():
        runs = [
            (names[(m.experiment, m.run_id)], layout.run_dir(m.experiment, m.run_id))
            for m in members
        ]
        title = f"{base_model} · {env}" if apart else None
        panels += curves.run_panels(runs, title, eval_panel=apart)
    if not any(panel.lines for panel in panels):
        listing = ", ".join(str(path) for path in experiments)
        raise curves.NothingToPlot(
            f"no run of {listing} has a reward or eval record in its metrics.jsonl yet"
        )
    title = f"{len(experiments)} experiments: every run by step"
    figure = curves.draw(panels, title, list(names.values()), columns=2 if apart else None)
    reason = apart_reason(list(grouped), "the reward")
    return figure, None if reason is None else f"drawn in {reason} (a row each)"


def experiment_labels(experiments: Sequence[Path]) -> dict[Path, str]:
    """Each experiment's folder name, or its whole path where two share a name."""
    names = [path.name for path in experiments]
    return {path: path.name if names.count(path.name) == 1 else str(path) for path in experiments}


def lineage_of(run_id: str, values: dict[str, dict[str, Any] | None]) -> list[Source]:
    """The runs `run_id` was forked from, nearest first, followed back through `values`
    (every run's config values in its experiment) until a run that was not forked, one that
    is gone, or a loop."""
    sources = {run: forked_from(run_values or {}) for run, run_values in values.items()}
    return [Source(run, step) for run, step in lineage_sources(run_id, sources)]


# ---------------------------------------------------------------- helpers


def _chosen_metric(
    experiments: Sequence[Path], metric: str | None, mode: str | None
) -> tuple[str, str, list[str]]:
    own = {path: ranking_metric(read_recipe(path), read_asha(path)) for path in experiments}
    if metric is None:
        chosen = set(own.values())
        if len(chosen) == 1:
            metric, own_mode = next(iter(chosen))
            return metric, mode or own_mode, []
        listing = ", ".join(f"{path.name}: {m} ({d})" for path, (m, d) in own.items())
        note = (
            f"the experiments rank by different metrics ({listing}); compared on "
            f"{DEFAULT_METRIC}: pass --metric to choose"
        )
        return DEFAULT_METRIC, mode or DEFAULT_MODE, [note]
    if mode is None:
        modes = {own_mode for own_metric, own_mode in own.values() if own_metric == metric}
        mode = modes.pop() if len(modes) == 1 else DEFAULT_MODE
    return metric, mode, []


def _base_model(experiment: Path) -> str:
    model = read_recipe(experiment).get("model")
    base = model.get("base") if isinstance(model, dict) else None
    return str(base) if base else UNKNOWN


def _set_differences(runs: list[ComparedRun], configs: list[dict[str, Any] | None]) -> None:
    """Give each run the values of its config (`configs`, in the order of `runs`) that are
    not the same in every run (its lineage aside: it has a column of its own)."""
    readable = [config for config in configs if config is not None]
    keys = dict.fromkeys(key for config in readable for key in config)
    differing = [
        key
        for key in keys
        if not key.startswith(LINEAGE_KEY) and len({repr(c.get(key)) for c in readable}) > 1
    ]
    for run, config in zip(runs, configs, strict=True):
        if config is not None:
            run.outcome.differences = {key: config.get(key) for key in differing}
