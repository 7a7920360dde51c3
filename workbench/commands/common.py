"""What every command of the CLI shares: its consoles, exit codes, failing, sub-apps, the
experiment argument, reading a recipe.

Exit codes: 0 success, 1 the command failed (a run or experiment it names is unknown, ...),
2 bad input (an invalid recipe or option).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from tomlkit import TOMLDocument

from workbench.experiment import (
    DEFAULT_OUTPUTS,
    RunLookupError,
    find_experiments,
    resolve_experiment,
)
from workbench.recipe import Recipe
from workbench.system.console import output_console
from workbench.up import RecipeError, read_recipe

# Tables on stdout are printed whole when piped or logged (`workbench.system.console`).
console = output_console()
err_console = Console(stderr=True)

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


def command_group(name: str, help: str) -> typer.Typer:
    """A sub-app, `workbench NAME ...`, that shows its help when called without a command."""
    return typer.Typer(name=name, help=help, no_args_is_help=True, rich_markup_mode="rich")


def fail(message: str, code: int = EXIT_FAILED) -> typer.Exit:
    """Print `error: message` on stderr; raise what this returns to exit with `code`."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def say(text: str) -> None:
    """One line of plain text on stdout (no markup, no highlighting, never wrapped)."""
    console.print(escape(text), highlight=False, soft_wrap=True)


def warn(text: str) -> None:
    """One line of plain text on stderr."""
    err_console.print(escape(text), highlight=False, soft_wrap=True)


JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
ExperimentArg = Annotated[
    Path | None,
    typer.Argument(
        help="Experiment directory (default: the only experiment under ./outputs).",
        show_default=False,
    ),
]
ExperimentOption = Annotated[
    Path | None,
    typer.Option(
        "--experiment",
        "-e",
        help="Experiment directory (default: the only experiment under ./outputs, or for a "
        "run id the experiment that has that run).",
        show_default=False,
    ),
]


ExperimentsArg = Annotated[
    list[Path] | None,
    typer.Argument(
        help="Experiment directories (default: every experiment under ./outputs).",
        metavar="EXPERIMENT",
        show_default=False,
    ),
]


def experiment_or_fail(experiment: Path | None) -> Path:
    try:
        return resolve_experiment(experiment)
    except RunLookupError as err:
        raise fail(str(err)) from None


def experiments_or_fail(experiments: list[Path] | None) -> list[Path]:
    """The experiments given (each checked, every bad one named at once, repeats dropped),
    or every experiment under ./outputs."""
    if not experiments:
        found = find_experiments(DEFAULT_OUTPUTS)
        if not found:
            raise fail(
                f"no experiment found under ./{DEFAULT_OUTPUTS}; pass experiment directories"
            )
        return found
    problems = []
    for path in experiments:
        try:
            resolve_experiment(path)
        except RunLookupError as err:
            problems.append(str(err))
    if problems:
        raise fail("\n".join(problems))
    unique: dict[Path, Path] = {}
    for path in experiments:
        unique.setdefault(path.resolve(), path)
    return list(unique.values())


def recipe_or_fail(path: Path, max_steps: int | None) -> tuple[TOMLDocument, Recipe]:
    """The recipe (with `--max-steps` applied), or exit 2 listing every problem."""
    try:
        return read_recipe(path, max_steps)
    except RecipeError as err:
        raise fail(str(err), EXIT_BAD_INPUT) from None
