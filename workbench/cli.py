"""The `workbench` command line: one thin function per command, that parses options and
prints; the work lives elsewhere (`workbench.up` is all of `up`). Here: the app and the
commands that run an experiment (up, evict, attach, down, join, restart, logs). In modules of
their own: `status`, `alerts`, `trace`, `plot`, `compare`, `slurm`, `export`, `samples`, `ask` and `runs`, `sft` and
`model`, `env`, `sweep`, `web` (`workbench/commands/`) and `bench` (`bench/cli.py`).

Exit codes: 0 success, 1 the command failed (a run or experiment it names is unknown, ...),
2 bad input (an invalid recipe or option).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from workbench.bench.cli import bench_app
from workbench.commands.alerts import alerts
from workbench.commands.ask import ask
from workbench.commands.common import (
    EXIT_BAD_INPUT,
    ExperimentArg,
    ExperimentOption,
    err_console,
    experiment_or_fail,
    fail,
    recipe_or_fail,
    say,
    warn,
)
from workbench.commands.compare import compare
from workbench.commands.envs import env_app
from workbench.commands.models import model_app, sft
from workbench.commands.plot import plot
from workbench.commands.runs import export, runs_app, samples
from workbench.commands.serve import serve
from workbench.commands.slurm import slurm
from workbench.commands.status import status
from workbench.commands.sweep import print_run_plan, sweep_app
from workbench.commands.trace import trace
from workbench.commands.web import web
from workbench.experiment import RunLookupError, resolve_run
from workbench.files import layout
from workbench.supervisor import launch
from workbench.supervisor.client import (
    SupervisorClient,
    SupervisorError,
    evict_and_tell,
    running_supervisor_pid,
)
from workbench.supervisor.join import AgentInterrupted, JoinError, joining_node, wait_for_supervisor
from workbench.supervisor.join import join as run_join
from workbench.supervisor.plan import recipe_devices, recipe_rendezvous
from workbench.system.file_tail import AppendedLines, last_lines
from workbench.system.gpus import detect_gpu_count
from workbench.up import (
    LaunchError,
    RecipeError,
    Report,
    follow_experiment,
    launch_experiment,
    report_still_running,
)

app = typer.Typer(
    name="workbench",
    help="Run several LoRA reinforcement-learning experiments at once on one machine.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    add_completion=False,
)
PRINTED = Report(say=say, warn=warn)

# The options of `up` and `join`, named once so each signature reads as its parameters.
RecipeArg = Annotated[
    Path, typer.Argument(help="Recipe TOML file, e.g. recipes/reverse_text.toml.")
]
HeadlessOption = Annotated[
    bool,
    typer.Option(
        help="No TUI: print one line per change and exit when every run is done, with "
        "status 0 if every run finished and 1 otherwise (scripts, CI)."
    ),
]
DetachOption = Annotated[
    bool,
    typer.Option(help="Start everything and return at once; `workbench attach` later."),
]
MaxStepsOption = Annotated[
    int | None,
    typer.Option(min=1, help="Override \\[defaults] max_steps for every run."),
]
DryRunOption = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Check the recipe and print its runs (a sweep expanded, in the order they "
        "get trainer slots) without writing or starting anything.",
    ),
]
SharedExperimentArg = Annotated[
    Path,
    typer.Argument(
        help="The experiment directory, on a filesystem every node shares, at the same "
        "path as on node 0."
    ),
]
NodeRankOption = Annotated[
    int, typer.Option(min=1, help="This node's rank: 1 to \\[trainer] nnodes - 1.")
]
InterfaceOption = Annotated[
    str | None,
    typer.Option(
        help="This node's network interface for gloo and nccl (default: the one this "
        "node reaches node 0's rendezvous address through).",
        show_default=False,
    ),
]
WaitOption = Annotated[
    float,
    typer.Option(
        min=0,
        help="Wait up to this many seconds for node 0's supervisor to start (a node "
        "started with node 0, as in a Slurm job); 0: it must run already.",
    ),
]


@app.command()
def up(
    recipe: RecipeArg,
    headless: HeadlessOption = False,
    detach: DetachOption = False,
    max_steps: MaxStepsOption = None,
    dry_run: DryRunOption = False,
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
    the command exits when every run is done (Ctrl-C stops the experiment). Until every
    process is up, both say what startup is doing: building the built-in model (step k/n),
    starting inference (seconds so far, the last line of its log), then ready. With --detach,
    it returns at once; with --headless as well, the supervisor still stops by itself once
    every run is done.

    A second `up` on an experiment whose supervisor is running is refused, naming its pid.
    Running `up` again after `down` resumes every run from its last checkpoint.

    With --dry-run, the runs are printed (id and the values each sets over \\[defaults]) with
    which GPUs run vLLM and the trainer, where the trainer's nodes meet and how many slots
    the memory holds (what one slot and one vLLM adapter cost on each device, the sum
    against what each has), and nothing is written or started; `workbench sweep plan RECIPE` prints the runs too.
    """
    if dry_run:
        _print_dry_run(recipe, max_steps)
        return
    try:
        status = launch_experiment(
            recipe,
            PRINTED,
            max_steps=max_steps,
            headless=headless,
            detach=detach,
            load_tui=_load_tui,
        )
    except RecipeError as err:
        raise fail(str(err), EXIT_BAD_INPUT) from None
    except LaunchError as err:
        raise fail(str(err)) from None
    raise typer.Exit(status)


# Commands that live in modules of their own; registered in the order `--help` lists them.
app.command()(status)
app.command()(plot)
app.command()(compare)
app.command()(slurm)
app.command()(web)
app.command()(alerts)
app.command()(trace)
app.command()(serve)


@app.command()
def evict(
    run_id: Annotated[str, typer.Argument(help="Run to evict, e.g. run_lr1e-3.")],
    reason: Annotated[str, typer.Option(help="Why; shown to the user and in the TUI.")] = (
        "evicted by the user"
    ),
    experiment: ExperimentOption = None,
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
        raise fail(str(err)) from None
    evicted = evict_and_tell(ref.experiment, ref.run_id, reason, by="user")
    eviction = evicted.eviction
    if evicted.already:
        say(f"{ref.run_id} is already evicted ({eviction.evicted_at}): {eviction.reason}")
    else:
        say(f"evicted {ref.run_id} ({ref.path}): {reason}")
    if evicted.not_taken is not None:
        warn(
            f"warning: the supervisor did not take the eviction ({evicted.not_taken}); it "
            "stops the orchestrator when it next scans the run directories"
        )
    elif evicted.stopping:
        say(f"the supervisor is stopping {ref.run_id}'s orchestrator")


@app.command()
def attach(experiment: ExperimentArg = None) -> None:
    """Open the TUI on a running experiment.

    Quitting the TUI (q) or losing the terminal leaves the experiment running; attach again
    at any time (`workbench web` opens the same TUI in a browser). Without the TUI installed, progress is followed in the terminal instead,
    one line per change (Ctrl-C detaches).
    """
    path = experiment_or_fail(experiment)
    if running_supervisor_pid(path) is None:
        raise fail(
            f"no supervisor is running for {path}; start it with "
            f"`workbench up {layout.recipe_path(path)}` (see `workbench status {path}`)"
        )
    run_tui = _load_tui()
    if run_tui is None:
        follow_experiment(path, PRINTED, ctrl_c_stops=False)
        return
    run_tui(path)
    report_still_running(path, PRINTED)


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
    path = experiment_or_fail(experiment)
    pid = running_supervisor_pid(path)
    if pid is not None:
        say(f"stopping the supervisor of {path} (pid {pid})...")
    report = launch.stop_experiment(path, timeout_s=timeout)
    if report.supervisor_pid is None and not report.leftovers:
        say(f"nothing to stop: no supervisor is running for {path}")
        return
    if report.leftovers:
        say(
            f"stopped {len(report.leftovers)} process group(s) left by a supervisor that was "
            f"gone (pids {', '.join(map(str, report.leftovers))})"
        )
    elif not report.graceful:
        err_console.print(
            f"[yellow]warning:[/] the supervisor did not stop within {timeout:g}s and was killed",
            highlight=False,
            soft_wrap=True,
        )
    say(f"stopped {path}")


@app.command()
def join(
    experiment: SharedExperimentArg,
    node_rank: NodeRankOption,
    interface: InterfaceOption = None,
    wait: WaitOption = 0,
) -> None:
    """Run this machine's share of an experiment's trainer, as one more node.

    Start the experiment with `workbench up` on node 0 first (its recipe sets \\[trainer]
    nnodes, rendezvous_interface and rendezvous_port), then run this on each other node
    with its own --node-rank. torchrun's agent starts here with \\[trainer] nproc_per_node
    ranks and meets node 0's at the address in supervisor/rendezvous.json; its log is
    logs/trainer-node<K>.log.

    When a node's ranks die, node 0's trainer restarts from its checkpoints and the agent
    here starts again to meet it. The command returns 0 once the experiment stops, and 1 if
    it was not running or its trainer gave up. Its state and a heartbeat go to
    nodes/node<K>.json, which `workbench status` and the TUI show. Ctrl-C takes this node
    out: its ranks are killed and node 0's trainer restarts, waiting (up to 10 minutes) for
    it to join again. Stopped together with node 0 (scancel, SIGTERM to every node), its
    ranks stay until node 0's trainer has checkpointed, and leave with it.
    """
    if wait > 0 and not wait_for_supervisor(experiment.resolve(), wait, say):
        raise fail(
            f"node 0's supervisor did not start within {wait:g} s: see "
            f"{layout.process_log_path(experiment.resolve(), 'supervisor')} on node 0"
        )
    try:
        node = joining_node(experiment, node_rank, interface)
    except JoinError as err:
        raise fail(str(err), EXIT_BAD_INPUT) from None
    try:
        code = run_join(node, say)
    except AgentInterrupted as stopped:
        left = "were killed" if stopped.ranks_killed else "left with node 0's trainer"
        say(f"node {node_rank}: stopped; its ranks {left}")
        code = 130
    except KeyboardInterrupt:
        say(f"node {node_rank}: stopped")
        code = 130
    raise typer.Exit(code)


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
        path = experiment_or_fail(experiment)
        run_id = None
    else:
        try:
            ref = resolve_run(target, experiment)
        except RunLookupError as err:
            raise fail(str(err)) from None
        path, run_id = ref.experiment, ref.run_id
    client = _running_client(path)
    try:
        if run_id is None:
            client.restart_process(target)
            say(f"restarting {target} of {path}")
        else:
            reply = client.restart_run(run_id)
            lifted = " (eviction lifted)" if reply.get("cleared_eviction") else ""
            say(f"restarting {run_id}{lifted}")
    except SupervisorError as err:
        raise fail(str(err)) from None


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
        path = layout.process_log_path(experiment_or_fail(experiment), name)
    else:
        try:
            ref = resolve_run(name, experiment)
        except RunLookupError as err:
            raise fail(f"{err}\n(or name a process: inference, trainer, supervisor)") from None
        path = layout.orchestrator_log_path(ref.path)
    if not follow:
        if not path.is_file():
            raise fail(
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


app.command()(export)
app.command()(samples)
app.command()(ask)
app.command()(sft)
app.add_typer(runs_app, name="runs")
app.add_typer(sweep_app, name="sweep")
app.add_typer(bench_app, name="bench")
app.add_typer(model_app, name="model")
app.add_typer(env_app, name="env")


# ------------------------------------------------------------------ helpers of the commands


def _print_dry_run(recipe: Path, max_steps: int | None) -> None:
    """`up --dry-run`: the runs, the devices, the slot arithmetic and the rendezvous."""
    _, resolved = recipe_or_fail(recipe, max_steps)
    print_run_plan(recipe, resolved, as_json=False)
    say(recipe_devices(resolved, detect_gpu_count())[1])
    for line in resolved.slot_arithmetic:
        say(line)
    say(recipe_rendezvous(resolved).describe())
    say("nothing was written or started (--dry-run)")


def _running_client(experiment: Path) -> SupervisorClient:
    client = SupervisorClient(experiment)
    if not client.is_running():
        raise fail(
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


def main() -> None:  # pragma: no cover - console script entry
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
