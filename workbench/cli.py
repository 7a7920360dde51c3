"""The `workbench` command line: one thin function per command; the work lives elsewhere.

Exit codes: 0 success, 1 the command failed (a run or experiment it names is unknown, ...),
2 bad input (an invalid recipe or option).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from workbench import control
from workbench.config import ConfigError, parse_toml, recipe_from_document
from workbench.experiment import (
    RunLookupError,
    create_experiment,
    resolve_experiment,
    resolve_run,
)
from workbench.status import run_statuses

app = typer.Typer(
    name="workbench",
    help="Run several LoRA reinforcement-learning experiments at once on one machine.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    add_completion=False,
)
console = Console()
err_console = Console(stderr=True)

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


def _fail(message: str, code: int = EXIT_FAILED) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


ExperimentArg = Annotated[
    Path | None,
    typer.Argument(
        help="Experiment directory (default: the only experiment under ./outputs).",
        show_default=False,
    ),
]


@app.command()
def up(
    recipe: Annotated[
        Path, typer.Argument(help="Recipe TOML file, e.g. recipes/reverse_text.toml.")
    ],
    headless: Annotated[bool, typer.Option(help="Run without the TUI (scripts, CI).")] = False,
    max_steps: Annotated[
        int | None,
        typer.Option(min=1, help="Override [defaults] max_steps for every run."),
    ] = None,
) -> None:
    """Start an experiment from RECIPE: create its directory and every run's control/orch.toml.

    The recipe is validated first; any error names the file, line and key and nothing is
    written. The experiment directory gets recipe.toml (the recipe as launched, comments
    kept) and run_<id>/control/orch.toml for each [[runs]] entry.
    """
    try:
        document = parse_toml(_read_text(recipe), recipe)
        if max_steps is not None:
            document.setdefault("defaults", {})["max_steps"] = max_steps
        resolved = recipe_from_document(document, recipe)
    except ConfigError as err:
        raise _fail(f"invalid recipe\n{err}", EXIT_BAD_INPUT) from None
    experiment = create_experiment(resolved, document)
    console.print(
        f"experiment [bold]{resolved.experiment.name}[/] at {experiment}", highlight=False
    )
    for run_id in resolved.run_configs():
        console.print(
            f"  {run_id}: {experiment / run_id / 'control' / 'orch.toml'}", highlight=False
        )
    err_console.print(
        "[yellow]not implemented yet:[/] the supervisor (vLLM inference, the shared trainer, "
        "one orchestrator per run) and the TUI. The experiment directory is ready for them.",
        highlight=False,
    )
    del headless  # the TUI/headless choice arrives with the supervisor


@app.command()
def status(
    experiment: ExperimentArg = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
) -> None:
    """Show every run of an experiment: id, status, step and reason.

    Status is one of waiting, active, rejected, evicted, finished. The reason is the eviction
    or validation message. --json prints {"runs": [{"id", "status", "step", "reason", ...}]}.
    """
    try:
        path = resolve_experiment(experiment)
    except RunLookupError as err:
        raise _fail(str(err)) from None
    runs = run_statuses(path)
    if as_json:
        print(json.dumps({"experiment": str(path), "runs": [r.to_json() for r in runs]}, indent=2))
        return
    table = Table(title=str(path), title_justify="left")
    for column in ("run", "status", "step", "slot", "reason"):
        table.add_column(column, overflow="fold")
    for run in runs:
        steps = f"{run.step}/{run.max_steps}" if run.max_steps else str(run.step)
        slot = "" if run.slot is None else str(run.slot)
        reason = (run.reason or "").splitlines()[0] if run.reason else ""
        table.add_row(run.id, run.status, steps, slot, reason)
    console.print(table)


@app.command()
def evict(
    run_id: Annotated[str, typer.Argument(help="Run to evict, e.g. run_lr1e-3.")],
    reason: Annotated[str, typer.Option(help="Why; shown to the user and in the TUI.")] = (
        "evicted by the user"
    ),
    experiment: Annotated[
        Path | None,
        typer.Option(help="Experiment directory (default: search every experiment in ./outputs)."),
    ] = None,
) -> None:
    """Evict a run: write control/evicted.txt with the reason and a timestamp.

    The trainer frees the run's slot at its next discovery and the run's orchestrator exits
    with the reason. Evicting an already evicted run changes nothing.
    """
    try:
        ref = resolve_run(run_id, experiment)
    except RunLookupError as err:
        raise _fail(str(err)) from None
    existing = control.read_eviction(ref.path)
    if existing is not None:
        console.print(
            escape(f"{ref.run_id} is already evicted ({existing.evicted_at}): {existing.reason}"),
            highlight=False,
        )
        return
    control.write_eviction(ref.path, reason, by="user")
    console.print(escape(f"evicted {ref.run_id} ({ref.path}): {reason}"), highlight=False)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise _fail(f"{path}: file not found; check the path", EXIT_BAD_INPUT) from None
    except (IsADirectoryError, UnicodeDecodeError) as err:
        raise _fail(f"{path}: cannot read: {err}", EXIT_BAD_INPUT) from None


def main() -> None:  # pragma: no cover - console script entry
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
