"""The `workbench` command line: one thin function per command; the work lives elsewhere.

Exit codes: 0 success, 1 the command failed (a run or experiment it names is unknown, ...),
2 bad input (an invalid recipe or option).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from tomlkit import TOMLDocument

from workbench import layout, run_control
from workbench.bench.cli import bench_app
from workbench.clock import format_duration
from workbench.config import (
    ConfigError,
    Recipe,
    deep_merge,
    nest_dotted,
    parse_assignment,
    parse_toml,
    read_toml,
    recipe_from_document,
)
from workbench.experiment import (
    RunLookupError,
    create_experiment,
    resolve_experiment,
    resolve_run,
    write_run,
)
from workbench.file_tail import AppendedLines, last_lines
from workbench.status import run_statuses
from workbench.supervisor import launch
from workbench.supervisor.client import (
    SupervisorClient,
    SupervisorError,
    process_summaries,
    read_state,
    running_supervisor_pid,
)
from workbench.supervisor.control_socket import ControlError, new_run_config
from workbench.sweep import scheduler
from workbench.sweep.expand import planned_runs
from workbench.sweep.fit import SigmoidFit
from workbench.sweep.report import SweepReport, build_report, write_report
from workbench.sweep.scheduler import EVICTED_BY
from workbench.sweep.values import describe_values

app = typer.Typer(
    name="workbench",
    help="Run several LoRA reinforcement-learning experiments at once on one machine.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    add_completion=False,
)
runs_app = typer.Typer(
    name="runs",
    help="Add runs to an experiment.",
    no_args_is_help=True,
    rich_markup_mode="rich",
)
sweep_app = typer.Typer(
    name="sweep",
    help="Sweeps: preview the runs a recipe's [sweep] expands to; rank them once they ran.",
    no_args_is_help=True,
    rich_markup_mode="rich",
)
app.add_typer(runs_app, name="runs")
app.add_typer(sweep_app, name="sweep")
app.add_typer(bench_app, name="bench")
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


@app.command()
def up(
    recipe: Annotated[
        Path, typer.Argument(help="Recipe TOML file, e.g. recipes/reverse_text.toml.")
    ],
    headless: Annotated[
        bool,
        typer.Option(
            help="No TUI: print one line per change and exit when every run is done, with "
            "status 0 if every run finished and 1 otherwise (scripts, CI)."
        ),
    ] = False,
    detach: Annotated[
        bool,
        typer.Option(help="Start everything and return at once; `workbench attach` later."),
    ] = False,
    max_steps: Annotated[
        int | None,
        typer.Option(min=1, help="Override \\[defaults] max_steps for every run."),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Check the recipe and print its runs (a sweep expanded, in the order they "
            "get trainer slots) without writing or starting anything.",
        ),
    ] = False,
) -> None:
    """Start an experiment from RECIPE: its directory, the supervisor and every process.

    The recipe is validated first; any error names the file, line and key, and nothing is
    written or started. The experiment directory gets recipe.toml (the recipe as launched,
    comments kept) and run_<id>/control/orch.toml for each run of the recipe.

    A supervisor then starts in its own session: the vLLM inference server, the trainer
    shared by all runs, and one orchestrator per run once inference is ready. Closing the
    terminal or the TUI never stops it: `workbench attach` reopens the TUI, `workbench down`
    stops everything, `workbench logs supervisor` shows what it did.

    By default the TUI opens. With --headless, one line per change is printed instead and
    the command exits when every run is done (Ctrl-C stops the experiment). With --detach,
    it returns at once; with --headless as well, the supervisor still stops by itself once
    every run is done.

    A second `up` on an experiment whose supervisor is running is refused, naming its pid.
    Running `up` again after `down` resumes every run from its last checkpoint.

    With --dry-run, the runs are printed (id and the values each sets over [defaults]) and
    nothing is written or started; `workbench sweep plan RECIPE` does the same.
    """
    document, resolved = _load_recipe_or_fail(recipe, max_steps)
    if dry_run:
        _print_run_plan(recipe, resolved, as_json=False)
        console.print("nothing was written or started (--dry-run)", highlight=False)
        return
    running = running_supervisor_pid(resolved.output_dir)
    if running is not None:
        raise _fail(launch.already_running_message(resolved.output_dir, running))
    run_tui = None if headless or detach else _load_tui()
    headless = headless or (run_tui is None and not detach)
    experiment = create_experiment(resolved, document)
    console.print(
        f"experiment [bold]{resolved.experiment.name}[/] at {experiment}", highlight=False
    )
    for run_id in resolved.run_configs():
        console.print(
            f"  {run_id}: {layout.orch_config_path(layout.run_dir(experiment, run_id))}",
            highlight=False,
        )
    try:
        started = launch.start_daemon(experiment, exit_when_done=headless)
    except launch.SupervisorStartError as err:
        raise _fail(str(err)) from None
    supervisor_log = layout.process_log_path(experiment, "supervisor")
    console.print(
        f"supervisor started (pid {started.pid}), log: {supervisor_log}",
        highlight=False,
        soft_wrap=True,
    )
    if detach:
        _print_how_to_reach(experiment)
    elif headless:
        raise typer.Exit(_follow(experiment, ctrl_c_stops=True, supervisor=started.process))
    else:
        assert run_tui is not None
        run_tui(experiment)
        _print_how_to_reach(experiment)


@sweep_app.command("plan")
def sweep_plan(
    recipe: Annotated[Path, typer.Argument(help="Recipe TOML file with a [sweep] table.")],
    max_steps: Annotated[
        int | None,
        typer.Option(min=1, help="Override \\[defaults] max_steps, as `up --max-steps` would."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
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
    "min_runs", "rung_steps"}}.
    """
    _, resolved = _load_recipe_or_fail(recipe, max_steps)
    _print_run_plan(recipe, resolved, as_json=as_json)


@sweep_app.command("report")
def sweep_report(
    experiment: ExperimentArg = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
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
    was judged at, whether early stopping evicted it, and the values its control/orch.toml
    sets over the recipe's [defaults]. A run without a record of the metric ranks last and
    says so. The best configuration follows the table. The TUI's leaderboard (`b`) is the
    same ranking, live.

    --by asymptote ranks the runs whose sigmoid fit of eval reward against steps is
    reliable (4 evals after version 0 or more, and past the fitted midpoint) by its
    asymptote, and the others after them as above; an asymptote column is added.

    Also writes sweep_report.json (the same as --json) and sweep_report.png (every run's
    eval curve; evicted runs dashed) into the experiment directory.

    --json prints {"experiment", "metric", "mode", "runs": [{"id", "rank", "value",
    "eval_step", "step", "rung", "rung_step", "evicted_by_scheduler", "differences",
    "evals": [[step, value]], "fit": null or {"asymptote", "midpoint", "slope", "start",
    "rmse", "points", "reliable", "note"}, "note"}], "ranked_by", "best": null or {"id",
    "value", "differences"}}.
    """
    path = _experiment_or_fail(experiment)
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


@app.command()
def status(
    experiment: ExperimentArg = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
) -> None:
    """Show every run of an experiment and every process of its supervisor.

    Runs: id, status, step and reason. Status is one of waiting, active, rejected, evicted,
    finished; the reason is the eviction or validation message.

    Processes (from supervisor/state.json): name, state, pid, restarts, uptime and a note
    (why it waits, stopped or failed). State is one of waiting, starting, ready, running,
    backoff, stopping, exited, failed, stopped. When the supervisor is not running, its last
    recorded states are shown without pids.

    A sweep adds the values each run varies and, under early stopping, each run's highest
    rung so far and its rank there (rank 1 is the best; `6/8`: sixth of the eight runs that
    had recorded the rung when it was judged).

    --json prints {"experiment", "supervisor": {"running", "pid", "status"}, "runs": [{"id",
    "status", "step", "reason", "values", "asha": null or {"rung", "step", "value",
    "cutoff", "rank", "of", "decision"}, ...}], "processes": [{"name", "state", "pid",
    "restarts", "uptime_s", "reason", "last_exit", ...}]}.
    """
    try:
        path = resolve_experiment(experiment)
    except RunLookupError as err:
        raise _fail(str(err)) from None
    runs = run_statuses(path)
    state = read_state(path)
    supervisor_pid = running_supervisor_pid(path)
    processes = process_summaries(state, live=supervisor_pid is not None)
    supervisor = {
        "running": supervisor_pid is not None,
        "pid": supervisor_pid,
        "status": (state or {}).get("status") if supervisor_pid else "not running",
    }
    if as_json:
        print(
            json.dumps(
                {
                    "experiment": str(path),
                    "supervisor": supervisor,
                    "runs": [r.to_json() for r in runs],
                    "processes": processes,
                },
                indent=2,
            )
        )
        return
    table = Table(title=str(path), title_justify="left")
    show_values = any(run.values for run in runs)
    show_asha = any(run.asha for run in runs)
    columns = ["run", "status", "step", "slot"]
    columns += ["values"] if show_values else []
    columns += ["rung", "rank"] if show_asha else []
    for column in [*columns, "reason"]:
        table.add_column(column, overflow="fold")
    for run in runs:
        steps = f"{run.step}/{run.max_steps}" if run.max_steps else str(run.step)
        slot = "" if run.slot is None else str(run.slot)
        reason = (run.reason or "").splitlines()[0] if run.reason else ""
        cells = [run.id, run.status, steps, slot]
        if show_values:
            cells.append(escape(describe_values(run.values or {})))
        if show_asha:
            cells += _asha_cells(run.asha)
        table.add_row(*cells, escape(reason))
    console.print(table)
    _print_processes(supervisor, processes)


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

    The trainer frees the run's slot at its next discovery. A running supervisor is told at
    once and stops the run's orchestrator (which would also exit by itself at its next
    step). Evicting an already evicted run changes nothing.

    `workbench restart RUN_ID` lifts the eviction; the run resumes from its last checkpoint.
    """
    try:
        ref = resolve_run(run_id, experiment)
    except RunLookupError as err:
        raise _fail(str(err)) from None
    eviction, already = run_control.evict(ref.path, reason, by="user")
    if already:
        console.print(
            escape(f"{ref.run_id} is already evicted ({eviction.evicted_at}): {eviction.reason}"),
            highlight=False,
            soft_wrap=True,
        )
    else:
        console.print(
            escape(f"evicted {ref.run_id} ({ref.path}): {reason}"), highlight=False, soft_wrap=True
        )
    _tell_supervisor_about_eviction(ref.experiment, ref.run_id, reason)


@app.command()
def attach(experiment: ExperimentArg = None) -> None:
    """Open the TUI on a running experiment.

    Quitting the TUI (q) or losing the terminal leaves the experiment running; attach again
    at any time. Without the TUI installed, progress is followed in the terminal instead,
    one line per change (Ctrl-C detaches).
    """
    path = _experiment_or_fail(experiment)
    if running_supervisor_pid(path) is None:
        raise _fail(
            f"no supervisor is running for {path}; start it with "
            f"`workbench up {layout.recipe_path(path)}` (see `workbench status {path}`)"
        )
    run_tui = _load_tui()
    if run_tui is None:
        _follow(path, ctrl_c_stops=False)
        return
    run_tui(path)
    _print_how_to_reach(path)


@app.command()
def down(
    experiment: ExperimentArg = None,
    timeout: Annotated[
        float,
        typer.Option(min=1, help="Seconds to wait for a graceful stop before killing."),
    ] = 300.0,
) -> None:
    """Stop an experiment: its orchestrators, then the trainer, then inference, then the supervisor.

    Each process gets SIGTERM (the trainer and orchestrators write their checkpoints) and
    SIGKILL only if it still runs after its stop timeout; the command returns once the
    supervisor has exited and nothing it started is left. If the supervisor is already gone
    (it was killed) but processes it started remain, their process groups are stopped using
    supervisor/state.json.

    `workbench up` with the same recipe resumes every run from its last checkpoint.
    """
    path = _experiment_or_fail(experiment)
    pid = running_supervisor_pid(path)
    if pid is not None:
        console.print(
            f"stopping the supervisor of {path} (pid {pid})...", highlight=False, soft_wrap=True
        )
    report = launch.stop_experiment(path, timeout_s=timeout)
    if report.supervisor_pid is None and not report.leftovers:
        console.print(
            f"nothing to stop: no supervisor is running for {path}", highlight=False, soft_wrap=True
        )
        return
    if report.leftovers:
        console.print(
            f"stopped {len(report.leftovers)} process group(s) left by a supervisor that was "
            f"gone (pids {', '.join(map(str, report.leftovers))})",
            highlight=False,
            soft_wrap=True,
        )
    elif not report.graceful:
        err_console.print(
            f"[yellow]warning:[/] the supervisor did not stop within {timeout:g}s and was killed",
            highlight=False,
            soft_wrap=True,
        )
    console.print(f"stopped {path}", highlight=False, soft_wrap=True)


@app.command()
def restart(
    target: Annotated[
        str,
        typer.Argument(
            metavar="RUN_ID|inference|trainer",
            help="A run id (its orchestrator), or inference, or trainer.",
        ),
    ],
    experiment: ExperimentOption = None,
) -> None:
    """Restart a run's orchestrator, the inference server or the trainer.

    For a run: its eviction (control/evicted.txt) is lifted and its orchestrator starts
    again, resuming from the run's last checkpoint; the trainer takes the run back when it
    has a free slot. For inference or trainer: the process is stopped gracefully (SIGTERM,
    SIGKILL after a timeout) and started again with a fresh restart budget.

    The experiment's supervisor must be running (`workbench up`).
    """
    if target in ("inference", "trainer"):
        path = _experiment_or_fail(experiment)
        run_id = None
    else:
        try:
            ref = resolve_run(target, experiment)
        except RunLookupError as err:
            raise _fail(str(err)) from None
        path, run_id = ref.experiment, ref.run_id
    client = _running_client(path)
    try:
        if run_id is None:
            client.restart_process(target)
            console.print(f"restarting {target} of {path}", highlight=False, soft_wrap=True)
        else:
            reply = client.restart_run(run_id)
            lifted = " (eviction lifted)" if reply.get("cleared_eviction") else ""
            console.print(f"restarting {run_id}{lifted}", highlight=False, soft_wrap=True)
    except SupervisorError as err:
        raise _fail(str(err)) from None


@runs_app.command("add")
def runs_add(
    run_id: Annotated[
        str, typer.Argument(help="Id of the new run, e.g. lr3e-3 (its directory: run_lr3e-3).")
    ],
    settings: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            metavar="KEY=VALUE",
            help="Override one orchestrator setting of the recipe's defaults (repeatable); "
            "dotted keys reach nested tables: --set sampling.temperature=0.7.",
            show_default=False,
        ),
    ] = None,
    from_file: Annotated[
        Path | None,
        typer.Option(
            "--from",
            metavar="ORCH_TOML",
            help="A file of orchestrator settings (the keys of [defaults], e.g. "
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
    path = _experiment_or_fail(experiment)
    overrides: dict = {}
    if from_file is not None:
        try:
            overrides = read_toml(from_file)[0].unwrap()
        except ConfigError as err:
            raise _fail(str(err), EXIT_BAD_INPUT) from None
    for assignment in settings or []:
        try:
            key, value = parse_assignment(assignment)
        except ValueError as err:
            raise _fail(f"--set {assignment}: {err}", EXIT_BAD_INPUT) from None
        overrides = deep_merge(overrides, nest_dotted(key, value))
    try:
        new_id, config = new_run_config(path, run_id, overrides)
    except ControlError as err:
        raise _fail(str(err), EXIT_BAD_INPUT) from None
    client = SupervisorClient(path)
    if client.is_running():
        try:
            reply = client.add_run(run_id, overrides)
        except SupervisorError as err:
            raise _fail(str(err)) from None
        console.print(
            f"added {new_id} ({reply.get('path')}); the supervisor starts its orchestrator",
            highlight=False,
            soft_wrap=True,
        )
        return
    run = write_run(path, new_id, config)
    console.print(
        f"added {new_id} ({run}); no supervisor is running: it starts with the next `workbench up`",
        highlight=False,
        soft_wrap=True,
    )


@app.command()
def logs(
    name: Annotated[
        str,
        typer.Argument(
            metavar="NAME",
            help="inference, trainer, supervisor, or a run id (its orchestrator's log).",
        ),
    ],
    follow: Annotated[
        bool,
        typer.Option("--follow", "-f", help="Keep printing lines as they are written (Ctrl-C)."),
    ] = False,
    lines: Annotated[
        int, typer.Option("--lines", "-n", min=0, help="How many of the last lines to print.")
    ] = 50,
    experiment: ExperimentOption = None,
) -> None:
    """Print the log of a process: inference, trainer, supervisor or a run's orchestrator.

    Logs are files under the experiment (logs/NAME.log, run_<id>/logs/orchestrator.log):
    they survive restarts, the TUI and the supervisor. The supervisor marks each start and
    exit of a process with a line of its own in the process's log. With --follow, new lines
    are printed as they arrive, across restarts of the process, until Ctrl-C.
    """
    if name in layout.PROCESS_LOG_NAMES:
        path = layout.process_log_path(_experiment_or_fail(experiment), name)
    else:
        try:
            ref = resolve_run(name, experiment)
        except RunLookupError as err:
            raise _fail(f"{err}\n(or name a process: inference, trainer, supervisor)") from None
        path = layout.orchestrator_log_path(ref.path)
    if not follow:
        if not path.is_file():
            raise _fail(
                f"no log yet at {path}: {name} has not been started (see `workbench status`; "
                "--follow waits for it)"
            )
        for line in last_lines(path, lines):
            sys.stdout.write(line + "\n")
        return
    tail = AppendedLines.from_last_lines(path, lines)
    try:
        while True:
            for raw in tail.read():
                sys.stdout.write(raw.decode("utf-8", errors="replace") + "\n")
            sys.stdout.flush()
            time.sleep(0.2)
    except KeyboardInterrupt:
        return


@app.command()
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
        raise _fail(str(err)) from None
    try:
        exported = export_adapter(ref.path, output, which)
    except ExportError as err:
        raise _fail(str(err), err.exit_code) from None
    console.print(
        f"exported {ref.run_id} step {exported.choice.adapter.step} to {exported.path}: "
        f"{exported.choice.note}. Its README.md says how to load it.",
        highlight=False,
        soft_wrap=True,
    )


@app.command()
def samples(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID", help="The run to look at.")],
    step: Annotated[
        int | None, typer.Option(help="The step to show (default: the newest recorded).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the step as JSON.")] = False,
    experiment: ExperimentOption = None,
) -> None:
    """Print what a run's policy wrote at a recent step: every prompt and its completions.

    The orchestrator keeps its last 8 steps as text in run_<id>/samples.jsonl: per GRPO
    group the prompt, the reference answer and each completion with its reward, advantage
    and whether it was cut at max_tokens, plus the step's reward histogram. The TUI shows
    the same with `s`.
    """
    from workbench.samples import describe_step, find_step, read_steps

    try:
        ref = resolve_run(run_id, experiment)
    except RunLookupError as err:
        raise _fail(str(err)) from None
    steps = read_steps(ref.path)
    shown = find_step(steps, step)
    if shown is None:
        kept = ", ".join(str(s) for s in sorted({s.step for s in steps})) or "none yet"
        raise _fail(
            f"{ref.run_id} has no recorded samples of "
            f"{'step ' + str(step) if step is not None else 'any step'} (steps kept: {kept}); "
            "its orchestrator records the last 8 steps as it goes"
        )
    if as_json:
        sys.stdout.write(json.dumps(shown.to_json(), indent=2) + "\n")
        return
    for line in describe_step(shown):
        sys.stdout.write(line + "\n")


# ------------------------------------------------------------------ sft and built-in models

model_app = typer.Typer(
    name="model",
    help="The models the project builds itself (builtin:tiny-reverse).",
    no_args_is_help=True,
    rich_markup_mode="rich",
)
app.add_typer(model_app, name="model")


@app.command()
def sft(
    output_dir: Annotated[
        Path,
        typer.Option("--output-dir", "-o", help="Where to save the model (or LoRA adapter)."),
    ],
    model: Annotated[
        str, typer.Option(help="builtin:tiny-reverse, a local model directory or a hub id.")
    ] = "builtin:tiny-reverse",
    env: Annotated[
        str | None,
        typer.Option(help="Train on this environment's prompts and reference answers."),
    ] = None,
    env_arg: Annotated[
        list[str] | None,
        typer.Option(
            "--env-arg",
            metavar="KEY=VALUE",
            help="Environment argument, repeatable, e.g. --env-arg max_length=8.",
        ),
    ] = None,
    data: Annotated[
        Path | None,
        typer.Option(help='JSONL file of {"prompt", "completion"} or {"messages"} lines.'),
    ] = None,
    steps: Annotated[int, typer.Option(min=1, help="Optimizer steps.")] = 200,
    batch_size: Annotated[int, typer.Option(min=1, help="Examples per step.")] = 64,
    lr: Annotated[float, typer.Option(min=0.0, help="AdamW learning rate.")] = 1e-3,
    warmup_steps: Annotated[int, typer.Option(min=0, help="Linear warm-up steps.")] = 0,
    schedule: Annotated[str, typer.Option(help="constant or cosine (after warm-up).")] = (
        "constant"
    ),
    seed: Annotated[int, typer.Option(help="Seeds the data order and initialisation.")] = 0,
    lora: Annotated[
        bool, typer.Option("--lora/--full", help="Train a LoRA adapter, or every weight.")
    ] = False,
    lora_rank: Annotated[int, typer.Option(min=1)] = 8,
    lora_alpha: Annotated[float, typer.Option(min=0.0)] = 16.0,
    eval_prompts: Annotated[
        int, typer.Option(min=0, help="Greedy reward on this many held-out prompts (needs --env).")
    ] = 0,
    eval_every: Annotated[int, typer.Option(min=0, help="Also evaluate every N steps.")] = 0,
    threads: Annotated[
        int | None,
        typer.Option(min=1, help="torch threads; 1 is fastest for builtin:tiny-reverse."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Supervised fine-tuning of one model on chat (prompt, completion) pairs.

    The data is an environment's prompt stream (--env reverse_text) or a JSONL file (--data).
    The loss covers completion tokens only. Full fine-tuning saves a Hugging Face model
    directory; --lora saves a peft adapter (adapter_config.json, adapter_model.safetensors).
    The output appears whole when training ends, with sft_summary.json (losses, rewards).
    This is how builtin:tiny-reverse is warmed up.
    """
    from pydantic import ValidationError

    from workbench.envs import EnvironmentConfigError
    from workbench.models import ModelResolutionError
    from workbench.trainer.sft import SFTConfig, SFTLoraConfig, train_sft

    try:
        env_args = dict(parse_assignment(item) for item in env_arg or [])
        config = SFTConfig(
            model=model,
            output_dir=output_dir,
            env=env,
            env_args=env_args,
            data=data,
            steps=steps,
            batch_size=batch_size,
            lr=lr,
            warmup_steps=warmup_steps,
            schedule=schedule,
            seed=seed,
            lora=SFTLoraConfig(rank=lora_rank, alpha=lora_alpha) if lora else None,
            eval_prompts=eval_prompts,
            eval_every=eval_every,
            threads=threads,
        )
    except (ValueError, ValidationError) as err:
        raise _fail(f"invalid sft options: {err}", EXIT_BAD_INPUT) from None

    def log(entry: dict) -> None:
        if "eval_reward" in entry:
            err_console.print(f"step {entry['step']}: eval reward {entry['eval_reward']:.4f}")
        else:
            err_console.print(
                f"step {entry['step']}: loss {entry['loss']:.4f}, lr {entry['lr']:.2e}"
            )

    try:
        result = train_sft(config, console=err_console, on_log=None if as_json else log)
    except (EnvironmentConfigError, ModelResolutionError, ValueError) as err:
        raise _fail(str(err), EXIT_BAD_INPUT) from None
    except OSError as err:
        raise _fail(str(err)) from None
    if as_json:
        print(json.dumps(result.to_json(), indent=2))
        return
    console.print(
        f"saved {'LoRA adapter' if lora else 'model'} to {result.output_dir} "
        f"({result.trainable_params:,} trainable parameters, {result.seconds:.0f} s); "
        f"loss {result.losses[0]:.4f} -> {result.losses[-1]:.4f}"
        + (f"; eval reward {result.final_reward:.4f}" if result.final_reward is not None else ""),
        highlight=False,
        soft_wrap=True,
    )


@model_app.command("build")
def model_build(
    name: Annotated[
        str, typer.Argument(help="The builtin model to build.")
    ] = "builtin:tiny-reverse",
    as_json: Annotated[bool, typer.Option("--json", help="Print the build info as JSON.")] = False,
) -> None:
    """Build a builtin model into the cache now (it is otherwise built on first use).

    Prints its directory and build info (parameters, warm-up time, greedy rewards). A model
    already built is reused. The cache is $WORKBENCH_CACHE_DIR/models, else the user cache
    directory (~/.cache/workbench/models on Linux).
    """
    from workbench.models import ModelResolutionError, is_builtin, resolve_model
    from workbench.models.tiny_reverse import read_build_info

    if not is_builtin(name):
        raise _fail(f"{name!r} is not a builtin model (builtin:tiny-reverse)", EXIT_BAD_INPUT)
    try:
        path = resolve_model(name, console=err_console)
    except ModelResolutionError as err:
        raise _fail(str(err)) from None
    info = read_build_info(path) or {}
    if as_json:
        print(json.dumps({"path": str(path), **info}, indent=2))
        return
    console.print(str(path), highlight=False, soft_wrap=True)
    for key in ("params", "warmup_seconds", "greedy_reward"):
        if key in info:
            console.print(f"  {key}: {info[key]}", highlight=False, soft_wrap=True)


# ------------------------------------------------------------------ helpers of the commands


def _experiment_or_fail(experiment: Path | None) -> Path:
    try:
        return resolve_experiment(experiment)
    except RunLookupError as err:
        raise _fail(str(err)) from None


def _running_client(experiment: Path) -> SupervisorClient:
    client = SupervisorClient(experiment)
    if not client.is_running():
        raise _fail(
            f"no supervisor is running for {experiment}; start it with "
            f"`workbench up {layout.recipe_path(experiment)}`"
        )
    return client


def _load_tui() -> Callable[[Path], None] | None:
    """The TUI's entry point, or None (with a message) when it cannot be imported."""
    try:
        from workbench.tui import run_tui
    except ImportError as err:
        err_console.print(
            f"[yellow]the TUI is not available ({escape(str(err))}); following the "
            "experiment in this terminal instead[/]",
            highlight=False,
            soft_wrap=True,
        )
        return None
    return run_tui


def _print_how_to_reach(experiment: Path) -> None:
    if running_supervisor_pid(experiment) is None:
        return
    console.print(
        "the experiment keeps running in the background:\n"
        f"  workbench attach {experiment}        reopen the TUI\n"
        f"  workbench status {experiment}        runs and processes\n"
        f"  workbench logs supervisor -e {experiment}\n"
        f"  workbench down {experiment}          stop everything",
        highlight=False,
        soft_wrap=True,
    )


def _follow(
    experiment: Path,
    *,
    ctrl_c_stops: bool,
    supervisor: subprocess.Popen[bytes] | None = None,
) -> int:
    """Print one line per change until the supervisor exits; return the headless status."""
    client = SupervisorClient(experiment)
    previous: launch.Snapshot | None = None

    def show_changes() -> None:
        nonlocal previous
        current = launch.snapshot(experiment)
        for line in launch.describe_changes(previous, current):
            console.print(
                f"{time.strftime('%H:%M:%S')} {escape(line)}", highlight=False, soft_wrap=True
            )
        previous = current

    try:
        while True:
            show_changes()
            if not client.is_running():
                break
            time.sleep(0.5)
    except KeyboardInterrupt:
        if not ctrl_c_stops:
            _print_how_to_reach(experiment)
            return 0
        console.print("stopping the experiment (Ctrl-C again leaves it running)...")
        try:
            launch.stop_experiment(experiment)
        except KeyboardInterrupt:
            _print_how_to_reach(experiment)
            return EXIT_FAILED
    if supervisor is not None:
        supervisor.wait()
    show_changes()
    return _report_outcome(experiment)


def _report_outcome(experiment: Path) -> int:
    runs = run_statuses(experiment)
    # A run early stopping gave up on is an outcome of the sweep, not a failure.
    stopped_early = [r for r in runs if r.status == "evicted" and r.evicted_by == EVICTED_BY]
    unfinished = [r for r in runs if r.status != "finished" and r not in stopped_early]
    if not unfinished:
        finished = len(runs) - len(stopped_early)
        early = f", {len(stopped_early)} stopped early by {EVICTED_BY}" if stopped_early else ""
        console.print(f"every run finished ({finished}{early})", highlight=False, soft_wrap=True)
        return 0
    for run in unfinished:
        reason = f": {run.reason.splitlines()[0]}" if run.reason else ""
        err_console.print(
            escape(f"{run.id} did not finish ({run.status}{reason})"), highlight=False
        )
    state = read_state(experiment) or {}
    for row in process_summaries(state, live=False):
        if row["state"] == "failed":
            err_console.print(
                escape(f"{row['name']} failed: {row['reason'] or row['last_exit']}"),
                highlight=False,
                soft_wrap=True,
            )
    return EXIT_FAILED


def _tell_supervisor_about_eviction(experiment: Path, run_id: str, reason: str) -> None:
    client = SupervisorClient(experiment)
    if not client.is_running():
        return
    try:
        reply = client.evict(run_id, reason)
    except SupervisorError as err:
        err_console.print(
            escape(
                f"warning: the supervisor did not take the eviction ({err}); it stops the "
                "orchestrator when it next scans the run directories"
            ),
            highlight=False,
            soft_wrap=True,
        )
        return
    if reply.get("stopped"):
        console.print(
            f"the supervisor is stopping {run_id}'s orchestrator", highlight=False, soft_wrap=True
        )


def _print_processes(supervisor: dict, processes: list[dict]) -> None:
    if supervisor["running"]:
        title = f"processes (supervisor pid {supervisor['pid']}, {supervisor['status']})"
    elif processes:
        title = "processes (supervisor not running; last recorded states)"
    else:
        console.print(
            "supervisor: not running (start it with `workbench up`)",
            highlight=False,
            soft_wrap=True,
        )
        return
    table = Table(title=title, title_justify="left")
    for column in ("process", "state", "pid", "restarts", "uptime", "note"):
        table.add_column(column, overflow="fold")
    for row in processes:
        note = row["reason"] or (f"last: {row['last_exit']}" if row["last_exit"] else "")
        table.add_row(
            escape(row["name"]),
            row["state"] or "",
            "" if row["pid"] is None else str(row["pid"]),
            str(row["restarts"]),
            format_duration(row["uptime_s"]),
            escape(note.splitlines()[0] if note else ""),
        )
    console.print(table)


def _load_recipe_or_fail(path: Path, max_steps: int | None) -> tuple[TOMLDocument, Recipe]:
    """The recipe (with `--max-steps` applied), or exit 2 listing every problem."""
    try:
        document = parse_toml(_read_text(path), path)
        if max_steps is not None:
            document.setdefault("defaults", {})["max_steps"] = max_steps
        return document, recipe_from_document(document, path)
    except ConfigError as err:
        raise _fail(f"invalid recipe\n{err}", EXIT_BAD_INPUT) from None


def _print_run_plan(path: Path, recipe: Recipe, *, as_json: bool) -> None:
    runs = planned_runs(recipe)
    slots = recipe.trainer.max_concurrent_runs
    spec = recipe.sweep.scheduler if recipe.sweep is not None else None
    if as_json:
        stopping = None
        if spec is not None:
            stopping = {
                **spec.model_dump(mode="json"),
                "rung_steps": spec.rung_steps(recipe.defaults.max_steps),
            }
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
    if spec is not None:
        console.print(
            escape(f"early stopping: {scheduler.describe(spec, recipe.defaults.max_steps)}"),
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
        value = (run.note or "") if run.value is None else f"{run.value:.4g} @ {run.eval_step}"
        rung = "" if run.rung is None else f"{run.rung} (step {run.rung_step})"
        fit = [] if not by_fit else [_describe_fit(run.fit)]
        table.add_row(
            str(run.rank),
            run.id,
            escape(value),
            *fit,
            str(run.step),
            rung,
            "yes" if run.evicted_by_scheduler else "",
            escape(describe_values(run.differences) or "-"),
        )
    console.print(table)
    best = report.best
    if best is None:
        console.print("best: none (no run has eval records yet)", highlight=False)
        return
    console.print(
        escape(
            f"best: {best.id} ({report.metric} {best.value:.4g}): "
            f"{describe_values(best.differences) or 'the recipe defaults'}"
        ),
        highlight=False,
        soft_wrap=True,
    )


def _describe_fit(fit: SigmoidFit | None) -> str:
    if fit is None:
        return "-"
    if not fit.reliable:
        return escape(f"unreliable: {fit.note}")
    return f"{fit.asymptote:.4g} (midpoint step {fit.midpoint:.3g})"


def _asha_cells(standing: dict | None) -> list[str]:
    if not standing:
        return ["", ""]
    rung = f"{standing['rung']} (step {standing['step']})"
    if standing["rank"] is None:
        return [rung, standing["decision"].replace("_", " ")]
    return [rung, f"{standing['rank']}/{standing['of']}"]


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
