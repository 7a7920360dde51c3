"""`workbench compare EXPERIMENT...`: the runs of several experiments ranked together, in
groups that share a base model and an environment (`workbench.sweep.compare`)."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from workbench.commands.common import (
    ExperimentsArg,
    JsonOption,
    console,
    experiments_or_fail,
    say,
)
from workbench.commands.sweep import describe_fit, evicted_cell, metric_cell
from workbench.sweep.compare import Comparison, ComparisonGroup, compare_experiments
from workbench.sweep.values import describe_values

# The options of `compare`, named once so its signature reads as its parameters.
MetricOption = Annotated[
    str | None,
    typer.Option(
        help="Metric of metrics.jsonl to rank by (default: the one the experiments' "
        "`sweep report` ranks by when they all agree, else eval_reward_mean).",
        show_default=False,
    ),
]
ModeOption = Annotated[
    str | None,
    typer.Option(
        help="max: higher is better; min: lower is better (default: the metric's mode "
        "in the experiments, else max).",
        show_default=False,
    ),
]
ByOption = Annotated[
    str,
    typer.Option(
        help="last: the metric at each run's last record; asymptote: where a sigmoid "
        "fit of its curve says it is heading (runs with a reliable fit first)."
    ),
]


def compare(
    experiments: ExperimentsArg = None,
    metric: MetricOption = None,
    mode: ModeOption = None,
    by: ByOption = "last",
    as_json: JsonOption = False,
) -> None:
    """Rank the runs of several experiments together, as `sweep report` ranks one's.

    Every run of every EXPERIMENT, read from its files (running or finished; nothing is
    written). Runs are ranked together only where the metric means the same thing: on the
    same base model (\\[model] base) and the same environment (env). Runs that differ in
    either are ranked in separate groups, each headed by its base model and environment,
    and the output says why. Within a group, one row per run, best first: rank, experiment,
    run id, the metric at its last record (and that record's step), the step it reached,
    whether early stopping evicted it (`yes`) or it diverged (`diverged`: ranked last; a
    column shown only then), its lineage (`from`: the run and step it was forked from by
    `workbench runs fork`, followed back), and the values of its control/orch.toml that are
    not the same in every run of the group. The best run of each group follows its table.

    --by asymptote ranks the runs whose sigmoid fit of the metric's curve is reliable by
    its asymptote first, as `sweep report --by asymptote` does; an asymptote column is
    added.

    --json prints {"experiments", "metric", "mode", "ranked_by", "apart": null or why
    the runs are in several groups, "notes", "groups": [{"base_model", "env", "runs":
    [{"experiment", "id", "rank", "value", "eval_step", "step", "rung", "rung_step",
    "evicted_by_scheduler", "diverged", "differences", "evals", "fit", "note", "lineage":
    [{"run", "step"}]}], "best": null or {"experiment", "id", "value"}}]}.

    A path that is not an experiment directory is an error naming it (exit status 1).
    """
    if mode is not None and mode not in ("max", "min"):
        raise typer.BadParameter(f"{mode!r}: choose max or min", param_hint="--mode")
    paths = experiments_or_fail(experiments)
    try:
        comparison = compare_experiments(paths, by=by, metric=metric, mode=mode)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--by") from None
    if as_json:
        print(json.dumps(comparison.to_json(), indent=2))
        return
    print_comparison(comparison)


def print_comparison(comparison: Comparison) -> None:
    order = "highest" if comparison.mode == "max" else "lowest"
    say(
        f"{len(comparison.experiments)} experiments, "
        f"{sum(len(group.runs) for group in comparison.groups)} runs, "
        f"by {comparison.metric} ({order} first)"
    )
    for note in comparison.notes:
        say(f"note: {note}")
    apart = comparison.apart_reason()
    if apart:
        say(apart)
    for group in comparison.groups:
        _print_group(group, comparison)


def _print_group(group: ComparisonGroup, comparison: Comparison) -> None:
    title = f"base model {group.base_model} · env {group.env}"
    table = Table(title=escape(title), title_justify="left")
    by_fit = comparison.by == "asymptote"
    # The evicted column only where a run was stopped early or diverged.
    stopped = any(evicted_cell(run.outcome) for run in group.runs)
    columns = ["rank", "experiment", "run", comparison.metric]
    columns += ["asymptote"] if by_fit else []
    columns += ["step", *(["evicted"] if stopped else []), "from", "differences"]
    for column in columns:
        # What names a run and its value stays whole; the rest wraps on a narrow terminal.
        wraps = column in ("asymptote", "from", "differences")
        table.add_column(column, overflow="fold", no_wrap=not wraps)
    for run in group.runs:
        outcome = run.outcome
        table.add_row(
            str(outcome.rank),
            escape(run.experiment_label),
            outcome.id,
            escape(metric_cell(outcome)),
            *([describe_fit(outcome.fit)] if by_fit else []),
            str(outcome.step),
            *([evicted_cell(outcome)] if stopped else []),
            escape(run.describe_lineage() or "-"),
            escape(describe_values(outcome.differences) or "-"),
        )
    console.print(table)
    best = group.best
    if best is None:
        say("best: none (no run that did not diverge has a record of the metric yet)")
        return
    say(
        f"best: {best.experiment_label}/{best.outcome.id} "
        f"({comparison.metric} {best.outcome.value:.4g})"
    )
