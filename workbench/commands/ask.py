"""`workbench ask "PROMPT"`: one prompt to each run's newest adapter and to the base model,
through the experiment's vLLM while training goes on (`workbench.playground`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from workbench.commands.common import (
    EXIT_BAD_INPUT,
    ExperimentOption,
    JsonOption,
    console,
    experiment_or_fail,
    fail,
)

RunsOption = Annotated[
    str | None,
    typer.Option(
        "--runs",
        metavar="RUN,...",
        help="The runs to ask, comma-separated: run ids, or EXPERIMENT/RUN (default: every "
        "run of the experiment).",
        show_default=False,
    ),
]
BaseOption = Annotated[
    bool, typer.Option("--base/--no-base", help="Ask the base model too, in a column of its own.")
]
MaxTokensOption = Annotated[
    int | None,
    typer.Option(
        "--max-tokens",
        min=1,
        help="Completion length limit (default: each run's sampling.max_tokens, at most 128).",
        show_default=False,
    ),
]
TemperatureOption = Annotated[
    float | None,
    typer.Option(
        min=0.0,
        help="Sampling temperature for every run (default: each run's sampling.temperature).",
        show_default=False,
    ),
]
RowOption = Annotated[
    int | None,
    typer.Option(
        "--row",
        min=0,
        help="Ask held-out prompt N of the runs' environment instead of PROMPT, and score "
        "each answer with its reward.",
        show_default=False,
    ),
]


def ask(
    prompt: Annotated[
        str | None, typer.Argument(help="What to ask (or --row N).", show_default=False)
    ] = None,
    runs: RunsOption = None,
    base: BaseOption = True,
    max_tokens: MaxTokensOption = None,
    temperature: TemperatureOption = None,
    row: RowOption = None,
    as_json: JsonOption = False,
    experiment: ExperimentOption = None,
) -> None:
    """Ask every run's newest adapter and the base model the same prompt, side by side.

    The prompt goes through each run's environment as its orchestrator sends prompts (its
    system prompt, the model's chat template) to the adapter version the run generates
    with now, via the experiment's vLLM, sampled with the run's settings (--temperature
    and --max-tokens set them for all). A run with no adapter loaded (not training now) is
    said so. Training is not held up: each run gets one request of at most --max-tokens
    tokens, batched by vLLM with the runs' own requests at the same priority.
    """
    from workbench.playground import AskError, Settings
    from workbench.playground import ask as ask_runs

    if prompt is None and row is None:
        raise fail("nothing to ask: give a PROMPT, or --row N", EXIT_BAD_INPUT)
    path, run_ids = _experiment_and_runs(runs, experiment)
    try:
        answers = ask_runs(
            path,
            prompt,
            run_ids=run_ids,
            base=base,
            settings=Settings(max_tokens, temperature),
            row=row,
        )
    except AskError as err:
        raise fail(str(err)) from None
    if as_json:
        sys.stdout.write(json.dumps([a.to_json() for a in answers], indent=2) + "\n")
        return
    table = Table(show_lines=True)
    for answer in answers:
        header = answer.label if answer.model is None else f"{answer.label}\n{answer.model}"
        table.add_column(escape(header), overflow="fold")
    table.add_row(*(escape(_cell(answer)) for answer in answers))
    console.print(table)


def _cell(answer) -> str:
    if answer.error:
        return f"({answer.error})"
    reward = f"reward {answer.reward:.2f}\n" if answer.reward is not None else ""
    cut = " [cut at max_tokens]" if answer.truncated else ""
    return f"{reward}{answer.text}{cut}"


def _experiment_and_runs(
    runs: str | None, experiment: Path | None
) -> tuple[Path, list[str] | None]:
    """The one experiment asked and its run ids (None: every run)."""
    if not runs:
        return experiment_or_fail(experiment), None
    from workbench.side_by_side import SideBySideError, resolve_run_names

    names = [name.strip() for name in runs.split(",") if name.strip()]
    if experiment is None and not any("/" in name for name in names):
        experiment = experiment_or_fail(None)
    try:
        refs = resolve_run_names(names, experiment)
    except SideBySideError as err:
        raise fail(str(err)) from None
    experiments = {ref.experiment.resolve() for ref in refs}
    if len(experiments) > 1:
        listing = ", ".join(str(path) for path in sorted(experiments))
        raise fail(
            f"--runs names runs of {len(experiments)} experiments ({listing}); each has its "
            "own vLLM: ask one experiment's runs at a time",
            EXIT_BAD_INPUT,
        )
    return refs[0].experiment, [ref.run_id for ref in refs]
