"""`workbench sweep ...`: preview the runs a recipe's [sweep] expands to; rank them once
they ran. `print_run_plan` also serves `up --dry-run`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from workbench.commands.common import (
    ExperimentArg,
    JsonOption,
    command_group,
    console,
    experiment_or_fail,
    recipe_or_fail,
)
from workbench.recipe import Recipe
from workbench.sweep import schedulers
from workbench.sweep.fit import SigmoidFit
from workbench.sweep.pbt_scheduler import exploit_lines
from workbench.sweep.report import RunOutcome, SweepReport, build_report, write_report
from workbench.sweep.spec import PbtSpec
from workbench.sweep.values import describe_values

sweep_app = command_group(
    "sweep", "Sweeps: preview the runs a recipe's \\[sweep] expands to; rank them once they ran."
)


@sweep_app.command("plan")
def sweep_plan(
    recipe: Annotated[Path, typer.Argument(help="Recipe TOML file with a [sweep] table.")],
    max_steps: Annotated[
        int | None,
        typer.Option(min=1, help="Override \\[defaults] max_steps, as `up --max-steps` would."),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Print the runs RECIPE makes, a [sweep] expanded, without writing or starting anything.

    One row per run in the order runs get trainer slots: the [[runs]] tables in file order,
    then the sweep's runs in expansion order (repeats, then random samples, then grid
    combinations); the first trainer.max_concurrent_runs start at once, the others wait and
    start as slots free. Each row shows the run id and the values it sets over [defaults].
    With a [sweep.scheduler], its rungs are listed too.

    The recipe is checked as `workbench up` checks it: errors name the file, line and key,
    all at once, and exit with status 2.

    --json prints {"recipe", "slots", "runs": [{"id", "source", "position", "values"}],
    "early_stopping": null or {"kind", "metric", "mode", "grace_steps", "reduction_factor",
    "min_runs", "rung_steps"} (ASHA) or {"kind", "interval", "metric", "mode", "quantile",
    "perturb", "factors", "resample_probability", "min_runs", "judged_steps"} (PBT)}.
    """
    _, resolved = recipe_or_fail(recipe, max_steps)
    print_run_plan(recipe, resolved, as_json=as_json)


@sweep_app.command("report")
def sweep_report(
    experiment: ExperimentArg = None,
    as_json: JsonOption = False,
    by: Annotated[
        str,
        typer.Option(
            help="last: the metric at each run's last eval; asymptote: where a sigmoid fit "
            "of its eval curve says it is heading (runs with a reliable fit first)."
        ),
    ] = "last",
) -> None:
    """Rank the runs of an experiment by the metric early stopping ranks them by.

    The metric and mode are [sweep.scheduler]'s; without early stopping, eval_reward_mean,
    highest first. One row per run, best first: rank, run id, the metric at its last record
    of it (and that record's step), the step it reached, the highest early-stopping rung it
    was judged at, whether early stopping evicted it (`yes`) or the trainer found it
    diverged (`diverged`), and the values its control/orch.toml sets over the recipe's
    [defaults]. A run without a record of the metric ranks after the others and says so; a
    run that diverged ranks last, whatever it recorded, and is never the best. The best
    configuration follows the table, with its lineage when it was forked (the runs it
    descends from, each at its step) and, for population-based training, every exploit and
    its reason. The TUI's leaderboard (`b`) is the same ranking, live.

    --by asymptote ranks the runs whose sigmoid fit of eval reward against steps is
    reliable (4 evals after version 0 or more, and past the fitted midpoint) by its
    asymptote, and the others after them as above; an asymptote column is added.

    Also writes sweep_report.json (the same as --json) and sweep_report.png (every run's
    eval curve; evicted and diverged runs dashed) into the experiment directory.

    --json prints {"experiment", "metric", "mode", "runs": [{"id", "rank", "value",
    "eval_step", "step", "rung", "rung_step", "evicted_by_scheduler", "diverged", "differences",
    "evals": [[step, value]], "fit": null or {"asymptote", "midpoint", "slope", "start",
    "rmse", "points", "reliable", "note"}, "note", "lineage"}], "ranked_by", "best": null or
    {"id", "value", "differences", "lineage"}}.
    """
    path = experiment_or_fail(experiment)
    try:
        report = build_report(path, by=by)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--by") from None
    written = write_report(report)
    if as_json:
        print(json.dumps(report.to_json(), indent=2))
        return
    _print_sweep_report(report)
    console.print("written: " + ", ".join(str(p) for p in written), highlight=False)


def print_run_plan(path: Path, recipe: Recipe, *, as_json: bool) -> None:
    runs = recipe.planned_runs
    slots = recipe.trainer.max_concurrent_runs
    spec = recipe.sweep.scheduler if recipe.sweep is not None else None
    if as_json:
        stopping = None
        if spec is not None:
            max_steps = recipe.defaults.max_steps
            steps = (
                {"judged_steps": spec.judged_steps(max_steps)}
                if isinstance(spec, PbtSpec)
                else {"rung_steps": spec.rung_steps(max_steps)}
            )
            stopping = {**spec.model_dump(mode="json"), **steps}
        payload = {
            "recipe": str(path),
            "slots": slots,
            "runs": [
                {"id": run.run_id, "source": run.source, "position": i, "values": run.values}
                for i, run in enumerate(runs)
            ],
            "early_stopping": stopping,
        }
        print(json.dumps(payload, indent=2))
        return
    swept = sum(1 for run in runs if run.source == "sweep")
    waiting = max(0, len(runs) - slots)
    console.print(
        f"{path}: {len(runs)} runs ({len(runs) - swept} from \\[\\[runs]], {swept} from "
        f"\\[sweep]); {slots} trainer slots"
        + (f": {waiting} wait and start in this order as slots free" if waiting else ""),
        highlight=False,
        soft_wrap=True,
    )
    table = Table(box=None, pad_edge=False)
    table.add_column("#")
    table.add_column("run", no_wrap=True)
    table.add_column("starts", no_wrap=True)
    table.add_column("values over \\[defaults]", overflow="fold")
    for position, run in enumerate(runs):
        starts = "at once" if position < slots else f"waits ({position - slots + 1})"
        table.add_row(
            str(position + 1), run.run_id, starts, escape(describe_values(run.values) or "-")
        )
    console.print(table)
    if spec is not None and recipe.sweep is not None:
        console.print(
            escape(schedulers.describe_scheduler(spec, recipe.sweep, recipe.defaults.max_steps)),
            highlight=False,
            soft_wrap=True,
        )


def _print_sweep_report(report: SweepReport) -> None:
    table = Table(title=f"{report.experiment}: {report.metric}", title_justify="left")
    by_fit = report.by == "asymptote"
    columns = ["rank", "run", report.metric, *(["asymptote"] if by_fit else []), "step", "rung"]
    for column in [*columns, "evicted", "differences"]:
        table.add_column(column, overflow="fold")
    for run in report.runs:
        rung = "" if run.rung is None else f"{run.rung} (step {run.rung_step})"
        fit = [] if not by_fit else [describe_fit(run.fit)]
        table.add_row(
            str(run.rank),
            run.id,
            escape(metric_cell(run)),
            *fit,
            str(run.step),
            rung,
            evicted_cell(run),
            escape(describe_values(run.differences) or "-"),
        )
    console.print(table)
    best = report.best
    if best is None:
        some = any(run.value is not None for run in report.runs)
        who = "no run that did not diverge" if some else "no run"
        console.print(f"best: none ({who} has eval records yet)", highlight=False)
        return
    console.print(
        escape(
            f"best: {best.id} ({report.metric} {best.value:.4g}): "
            f"{describe_values(best.differences) or 'the recipe defaults'}"
        ),
        highlight=False,
        soft_wrap=True,
    )
    _print_population(report, best)


def _print_population(report: SweepReport, best: RunOutcome) -> None:
    """Population-based training's exploits, and the line the best run descends from."""
    exploits = exploit_lines(report.experiment)
    if len(best.lineage) > 1:
        line = " <- ".join(best.lineage)
        console.print(escape(f"lineage of {best.id}: {line}"), highlight=False, soft_wrap=True)
    if exploits:
        console.print("pbt exploits:", highlight=False)
        for text in exploits:
            console.print(escape(f"  {text}"), highlight=False, soft_wrap=True)


def metric_cell(run: RunOutcome) -> str:
    """The metric at the run's last record of it and that record's step, or why none."""
    return (run.note or "") if run.value is None else f"{run.value:.4g} @ {run.eval_step}"


def evicted_cell(run: RunOutcome) -> str:
    return "diverged" if run.diverged else "yes" if run.evicted_by_scheduler else ""


def describe_fit(fit: SigmoidFit | None) -> str:
    """A run's sigmoid fit in a table cell: its asymptote, or why it is not reliable."""
    if fit is None:
        return "-"
    if not fit.reliable:
        return escape(f"unreliable: {fit.note}")
    return f"{fit.asymptote:.4g} (midpoint step {fit.midpoint:.3g})"
