"""The commands about one run: `workbench runs add` and `runs fork` (a Typer sub-app), `workbench export`
(its adapter with a model card) and `workbench samples` (what its policy wrote lately, or
several runs side by side on the same held-out prompts).

A run added while a supervisor runs is added by the supervisor (its discovery starts the
orchestrator at once); without one, the run directory is written and starts with the
next `workbench up`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer
from rich.markup import escape
from rich.table import Table

from workbench.commands.common import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    ExperimentOption,
    command_group,
    console,
    experiment_or_fail,
    fail,
    say,
)
from workbench.config import (
    ConfigError,
    OrchestratorConfig,
    deep_merge,
    load_partial,
    nest_dotted,
    parse_assignment,
)
from workbench.experiment import RunLookupError, resolve_run, write_run
from workbench.supervisor.client import SupervisorClient, SupervisorError
from workbench.supervisor.control_socket import ControlError, new_run_config

if TYPE_CHECKING:
    from workbench.files.eval_samples import EvalPrompt
    from workbench.side_by_side import SideBySide

SetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="Set one orchestrator setting over the ones the run starts from (repeatable); "
        "dotted keys reach nested tables: --set sampling.temperature=0.7.",
        show_default=False,
    ),
]

runs_app = command_group(
    "runs", "Add runs to an experiment, or fork one from another's checkpoint."
)


@runs_app.command("add")
def runs_add(
    run_id: Annotated[
        str, typer.Argument(help="Id of the new run, e.g. lr3e-3 (its directory: run_lr3e-3).")
    ],
    settings: SetOption = None,
    from_file: Annotated[
        Path | None,
        typer.Option(
            "--from",
            metavar="ORCH_TOML",
            help="A file of orchestrator settings (the keys of \\[defaults], e.g. "
            "configs/orch.toml) over the recipe's defaults; --set values win over it.",
            show_default=False,
        ),
    ] = None,
    experiment: ExperimentOption = None,
) -> None:
    """Add a run: write run_<id>/control/orch.toml from the recipe's defaults, the --from
    file's keys and --set values, in that order.

    Values are read as TOML (1e-3 is a number, true a boolean); anything else is a string.
    The config is validated before anything is written: an unknown key or a bad value exits
    with status 2 and names the key. An id already in use is refused.

    A running supervisor discovers the new run directory within a second and starts its
    orchestrator; the trainer gives the run a slot when one is free. Without a supervisor,
    the run starts with the next `workbench up`.
    """
    path = experiment_or_fail(experiment)
    overrides: dict = {}
    if from_file is not None:
        try:
            overrides = load_partial(OrchestratorConfig, from_file)
        except ConfigError as err:
            raise fail(str(err), EXIT_BAD_INPUT) from None
    overrides = deep_merge(overrides, _set_values(settings))
    try:
        new_id, config = new_run_config(path, run_id, overrides)
    except ControlError as err:
        raise fail(str(err), EXIT_BAD_INPUT) from None
    client = SupervisorClient(path)
    if client.is_running():
        try:
            reply = client.add_run(run_id, overrides)
        except SupervisorError as err:
            raise fail(str(err)) from None
        say(f"added {new_id} ({reply.get('path')}); the supervisor starts its orchestrator")
        return
    run = write_run(path, new_id, config)
    say(f"added {new_id} ({run}); no supervisor is running: it starts with the next `workbench up`")


@runs_app.command("fork")
def runs_fork(
    source: Annotated[
        str,
        typer.Argument(
            metavar="SOURCE[@STEP]",
            help="The run to start from, and the step of one of its kept checkpoints "
            "(default: its newest), e.g. run_lr1e-3@20.",
        ),
    ],
    run_id: Annotated[
        str,
        typer.Argument(
            metavar="NEW", help="Id of the new run, e.g. lr3e-4 (its directory: run_lr3e-4)."
        ),
    ],
    settings: SetOption = None,
    experiment: ExperimentOption = None,
) -> None:
    """Start a new run from a checkpoint another run keeps, with its settings (and any
    --set changes): the same adapter, optimizer state, schedule position and data
    position, going on to its own max_steps.

    The new run's orch.toml records where it came from (`forked_from`: run and step);
    `workbench status` shows it. A run or step that is not there is refused, listing the
    runs or the steps kept (the trainer keeps the last 3 checkpoints of a run). The LoRA
    rank and alpha cannot change (the adapter was trained under them); max_steps must be
    past the step (a finished run's last checkpoint needs --set max_steps=...).

    A running supervisor discovers the new run within a second; without one it starts
    with the next `workbench up`.
    """
    from workbench.supervisor.fork import ForkError, fork_run

    path = experiment_or_fail(experiment)
    try:
        fork = fork_run(path, source, run_id, _set_values(settings))
    except ForkError as err:
        raise fail(str(err), EXIT_BAD_INPUT if err.bad_input else EXIT_FAILED) from None
    state = (
        "its data position and sampling seeds"
        if fork.with_orchestrator_state
        else "no orchestrator state of that step (its data position is assumed: see its log)"
    )
    when = (
        "the supervisor starts it"
        if SupervisorClient(path).is_running()
        else "no supervisor is running: it starts with the next `workbench up`"
    )
    say(f"forked {fork.source}@{fork.step} into {fork.run_id} ({fork.path}) with {state}; {when}")


def _set_values(settings: list[str] | None) -> dict:
    """`--set KEY=VALUE` options as nested tables; a malformed one exits 2 naming it."""
    overrides: dict = {}
    for assignment in settings or []:
        try:
            key, value = parse_assignment(assignment)
        except ValueError as err:
            raise fail(f"--set {assignment}: {err}", EXIT_BAD_INPUT) from None
        overrides = deep_merge(overrides, nest_dotted(key, value))
    return overrides


def export(
    run_id: Annotated[
        str, typer.Argument(metavar="RUN_ID", help="The run whose adapter to export.")
    ],
    output: Annotated[
        Path, typer.Option("--output", "-o", help="A new directory for the adapter.")
    ],
    which: Annotated[
        Literal["best", "latest"],
        typer.Option(help="best: by held-out eval reward (else training reward); latest."),
    ] = "best",
    experiment: ExperimentOption = None,
) -> None:
    """Copy a run's adapter, with a model card (README.md), to a directory of its own.

    The adapter is one the run keeps (broadcast/step_N or checkpoints/step_N/trainer, each
    complete only with its STABLE marker), in peft's layout: adapter_config.json names a
    base model that peft and vLLM load without workbench. The card gives the base model,
    the run's config, the steps trained, its reward and eval curves and how to load it.
    Nothing is left behind when the export fails.
    """
    from workbench.export import ExportError, export_adapter

    try:
        ref = resolve_run(run_id, experiment)
    except RunLookupError as err:
        raise fail(str(err)) from None
    try:
        exported = export_adapter(ref.path, output, which)
    except ExportError as err:
        raise fail(str(err), err.exit_code) from None
    say(
        f"exported {ref.run_id} step {exported.choice.adapter.step} to {exported.path}: "
        f"{exported.choice.note}. Its README.md says how to load it."
    )


def samples(
    run_ids: Annotated[
        list[str],
        typer.Argument(
            metavar="RUN...",
            help="The run to look at; with --compare, the runs (a run id, or "
            "EXPERIMENT/RUN for a run of another experiment).",
        ),
    ],
    compare: Annotated[
        bool,
        typer.Option(
            "--compare",
            help="The runs side by side on one held-out eval's prompts: a row per prompt, "
            "a column per run with its completion and reward.",
        ),
    ] = False,
    step: Annotated[
        int | None,
        typer.Option(
            help="The step to show (default: the newest recorded; with --compare the "
            "newest eval step every run has).",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the step as JSON.")] = False,
    experiment: ExperimentOption = None,
) -> None:
    """Print what a run's policy wrote at a recent step: every prompt and its completions;
    or, with --compare, several runs side by side on the same held-out prompts.

    The orchestrator keeps its last 8 steps as text in run_<id>/samples.jsonl: per GRPO
    group the prompt, the reference answer and each completion with its reward, advantage
    and whether it was cut at max_tokens, plus the step's reward histogram. The TUI shows
    the same with `s`.

    --compare reads each run's held-out evals (run_<id>/eval_samples.jsonl, the last 16):
    the eval step's prompts, each run's completion and reward (the mean of its completions
    when an eval samples several). Runs of several experiments compare when they share an
    environment (env and env_args), else the command refuses, naming the difference. The
    TUI shows the same with `v`.
    """
    if compare:
        _compare_samples(run_ids, step, as_json, experiment)
        return
    if len(run_ids) != 1:
        raise fail(
            f"{len(run_ids)} runs named: without --compare, samples shows one run "
            "(add --compare to see runs side by side)",
            EXIT_BAD_INPUT,
        )
    _one_run_samples(run_ids[0], step, as_json, experiment)


def _one_run_samples(run_id: str, step: int | None, as_json: bool, experiment: Path | None) -> None:
    from workbench.files.samples import describe_step, find_step, read_steps

    try:
        ref = resolve_run(run_id, experiment)
    except RunLookupError as err:
        raise fail(str(err)) from None
    steps = read_steps(ref.path)
    shown = find_step(steps, step)
    if shown is None:
        kept = ", ".join(str(s) for s in sorted({s.step for s in steps})) or "none yet"
        raise fail(
            f"{ref.run_id} has no recorded samples of "
            f"{'step ' + str(step) if step is not None else 'any step'} (steps kept: {kept}); "
            "its orchestrator records the last 8 steps as it goes"
        )
    if as_json:
        sys.stdout.write(json.dumps(shown.to_json(), indent=2) + "\n")
        return
    for line in describe_step(shown):
        sys.stdout.write(line + "\n")


def _compare_samples(
    run_ids: list[str], step: int | None, as_json: bool, experiment: Path | None
) -> None:
    from workbench.side_by_side import SideBySideError, resolve_run_names, side_by_side

    try:
        compared = side_by_side(resolve_run_names(run_ids, experiment), step)
    except SideBySideError as err:
        raise fail(str(err)) from None
    if as_json:
        sys.stdout.write(json.dumps(compared.to_json(), indent=2) + "\n")
        return
    console.print(side_by_side_table(compared))
    for note in compared.notes:
        say(f"note: {note}")


def side_by_side_table(compared: SideBySide) -> Table:
    """A row per prompt, a column per run: its reward, then its (first) completion."""
    table = Table(
        title=f"held-out eval of step {compared.step}",
        show_lines=True,
        title_justify="left",
    )
    table.add_column("prompt", overflow="fold")
    for run in compared.runs:
        evaluated = run.eval_of(compared.step)
        mean = _mean([p.reward for p in evaluated.prompts]) if evaluated else None
        header = run.label if mean is None else f"{run.label}\nmean {mean:.3f}"
        table.add_column(header, overflow="fold")
    for row in compared.rows:
        cells = [
            "-" if cell is None else f"{cell.reward:.2f} {_shown_text(cell)}" for cell in row.cells
        ]
        table.add_row(escape(f"{row.prompt}\n-> {row.answer}"), *map(escape, cells))
    return table


def _shown_text(cell: EvalPrompt) -> str:
    completion = cell.completions[0] if cell.completions else None
    if completion is None:
        return ""
    more = f" (+{len(cell.completions) - 1} more)" if len(cell.completions) > 1 else ""
    cut = " [cut at max_tokens]" if completion.truncated else ""
    return repr(completion.text) + cut + more


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
