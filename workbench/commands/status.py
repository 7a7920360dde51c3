"""`workbench status`: every run of an experiment and every process of its supervisor, as
tables or (--json) for scripts. The runs come from `workbench.status`, the processes from
the supervisor's state.json (`workbench.supervisor.client`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from workbench.commands.common import (
    ExperimentArg,
    JsonOption,
    console,
    experiment_or_fail,
    say,
)
from workbench.files import layout
from workbench.files.busy import BusyReader
from workbench.files.nodes import NodeStatus
from workbench.run_metrics import LatestRewards, latest_rewards
from workbench.status import RunStatus, describe_fork, node_warnings, read_experiment
from workbench.supervisor.client import process_summaries
from workbench.supervisor.startup import StartupPhase
from workbench.sweep.values import describe_values
from workbench.system.clock import format_duration


def status(experiment: ExperimentArg = None, as_json: JsonOption = False) -> None:
    """Show every run of an experiment and every process of its supervisor.

    Runs: id, status, step, slot, reward, eval and reason. Reward is the mean reward of
    the run's newest training batch, eval its newest held-out eval reward and the step it
    scored (`0.870 at 40`), as the TUI shows them (read from its metrics.jsonl). Status is
    one of waiting, active, rejected, evicted, diverged, finished; the reason is the
    eviction or validation message. Diverged: the trainer evicted the run because its loss
    or gradient norm was not finite for 3 updates in a row, or its adapter was not (the
    reason says which, and at which updates).

    Processes (from supervisor/state.json): name, state, pid, restarts, uptime, busy and a
    note (why it waits, stopped or failed). State is one of waiting, starting, ready,
    running, backoff, stopping, exited, failed, stopped. When the supervisor is not running,
    its last recorded states are shown without pids. Busy: the share of the last minute
    (of its last minute, once it stopped) the process spent on its own work: the trainer
    updating, an orchestrator generating or scoring, inference answering any orchestrator's
    generation; the rest it waited for the other side or was starting up. A line follows
    with the placement: which GPUs run inference and the trainer, and how many trainer
    ranks hold the base, and how.

    While the experiment starts, a last line says what it is doing: building the built-in
    model (step k/n), starting inference (seconds so far and the last line of its log),
    waiting to restart a process that crashed, or a process that failed. Once every
    process is up, it is left out.

    A trainer on several nodes (`[trainer] nnodes`) adds a table of its nodes: rank, host,
    state, restarts and a note. Node 0 is the supervisor's trainer; each other node is what
    its `workbench join` last reported (nodes/node<K>.json): waiting, running, restarting,
    left or failed, or silent once it has not reported for a minute (its join was killed or
    its node lost: a warning names it; node 0's trainer restarts from its checkpoints and
    waits up to 10 minutes for it to join again).

    A run made by `workbench runs fork` shows where it came from (`from`: run@step).

    A sweep adds the values each run varies and, under early stopping, each run's highest
    rung so far and its rank there (rank 1 is the best; `6/8`: sixth of the eight runs that
    had recorded the rung when it was judged).

    Warnings follow: what the supervisor reports wrong without stopping anything (experiment
    tracking failing, for one).

    --json prints {"experiment", "supervisor": {"running", "pid", "status"}, "runs": [{"id",
    "status", "step", "reason", "reward", "eval": null or {"step", "reward"}, "values",
    "asha": null or {"rung", "step", "value", "cutoff", "rank", "of", "decision"},
    "forked_from": null or {"run", "step"}, ...}],
    "processes": [{"name", "state", "pid",
    "restarts", "uptime_s", "reason", "last_exit", "busy": null or {"window_s", "busy",
    "waiting", "starting", "activities": {"update" or "generation" or "waiting for
    adapter" ...: share}}, ...}], "placement": which GPUs run what and how the trainer's
    ranks hold the base, "nodes": [] on one node, else [{"node_rank", "host", "state",
    "restarts", "note"}, ...], "startup": null or {"phase",
    "text", "since", "process", "step", "steps", "detail", "last_line", "model"},
    "warnings": ["..."]}; phase is one of building model, starting, failed, ready.
    """
    report = read_status(experiment_or_fail(experiment))
    if as_json:
        print(json.dumps(report.to_json(), indent=2))
        return
    print_status(report)


def print_status(report: StatusReport) -> None:
    """The tables of `workbench status`: runs, processes, placement, nodes, startup, warnings."""
    console.print(_runs_table(report))
    _print_processes(report.supervisor, report.processes)
    if report.placement:
        say(f"placement: {report.placement}")
    if report.nodes:
        console.print(_nodes_table(report.nodes))
    if report.startup is not None and not report.startup.ready:
        console.print(
            escape(report.startup.describe(report.now)),
            style="bold yellow",
            highlight=False,
            soft_wrap=True,
        )
    for warning in report.warnings:
        console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False, soft_wrap=True)


@dataclass
class StatusReport:
    """What `workbench status` shows, read once: the runs, the supervisor and its processes."""

    path: Path
    runs: list[RunStatus]
    supervisor: dict
    processes: list[dict]
    placement: str | None
    startup: StartupPhase | None
    warnings: list[str]
    now: float
    nodes: list[NodeStatus] = field(default_factory=list)
    rewards: dict[str, LatestRewards] = field(default_factory=dict)  # by run id

    def rewards_of(self, run_id: str) -> LatestRewards:
        return self.rewards.get(run_id) or LatestRewards()

    def to_json(self) -> dict:
        return {
            "experiment": str(self.path),
            "supervisor": self.supervisor,
            "runs": [{**r.to_json(), **self.rewards_of(r.id).to_json()} for r in self.runs],
            "processes": self.processes,
            "placement": self.placement,
            "nodes": [node.to_json() for node in self.nodes],
            "startup": _startup_json(self.startup, self.now),
            "warnings": self.warnings,
        }


def read_status(path: Path) -> StatusReport:
    """The experiment as `read_experiment` reads it, each run's newest rewards from its
    metrics.jsonl, the processes from the supervisor's state.json with each one's busy
    share of the last minute."""
    experiment = read_experiment(path)
    state = experiment.supervisor_state
    processes = process_summaries(state, live=experiment.supervisor_running)
    recent = BusyReader(path).recent(experiment.now)
    for row in processes:
        row["busy"] = recent.get(row["name"])
    nodes = experiment.nodes
    return StatusReport(
        path=path,
        runs=experiment.runs,
        supervisor={
            "running": experiment.supervisor_running,
            "pid": experiment.supervisor_pid,
            "status": (state or {}).get("status")
            if experiment.supervisor_running
            else "not running",
        },
        processes=processes,
        placement=experiment.placement,
        startup=experiment.startup,
        warnings=node_warnings(nodes, experiment.supervisor_running) + experiment.warnings,
        now=experiment.now,
        nodes=nodes,
        rewards={run.id: latest_rewards(layout.run_dir(path, run.id)) for run in experiment.runs},
    )


# The runs table's columns whose cells may be long: they wrap in a narrow terminal.
_LONG_CELLS = frozenset({"from", "values", "reason"})


def _runs_table(report: StatusReport) -> Table:
    runs = report.runs
    table = Table(title=str(report.path), title_justify="left")
    show_values = any(run.values for run in runs)
    show_asha = any(run.asha for run in runs)
    show_forks = any(run.forked_from for run in runs)
    columns = ["run", "status", "step", "slot", "reward", "eval"]
    columns += ["from"] if show_forks else []
    columns += ["values"] if show_values else []
    columns += ["rung", "rank"] if show_asha else []
    for column in [*columns, "reason"]:
        # Short cells stay whole in a narrow terminal: the long ones wrap first.
        table.add_column(column, overflow="fold", no_wrap=column not in _LONG_CELLS)
    for run in runs:
        steps = f"{run.step}/{run.max_steps}" if run.max_steps else str(run.step)
        slot = "" if run.slot is None else str(run.slot)
        reason = (run.reason or "").splitlines()[0] if run.reason else _client_note(run, report.now)
        cells = [run.id, run.status, steps, slot, *_reward_cells(report.rewards_of(run.id))]
        if show_forks:
            cells.append(escape(describe_fork(run.forked_from)))
        if show_values:
            cells.append(escape(describe_values(run.values or {})))
        if show_asha:
            cells += _asha_cells(run.asha)
        table.add_row(*cells, escape(reason))
    return table


def _client_note(run: RunStatus, now: float) -> str:
    """What a Tinker client's run says in place of a reason: how long ago its client last
    sent work (a client gone quiet holds its slot until its session times out)."""
    if run.last_request is None:
        return ""
    age = format_duration(max(0.0, now - run.last_request))
    return f"Tinker client, last request {age} ago"


def _reward_cells(rewards: LatestRewards) -> list[str]:
    """The reward and eval cells: `0.870`, `0.910 at 40`; empty before the first."""
    reward = "" if rewards.reward is None else f"{rewards.reward:.3f}"
    if rewards.eval_reward is None:
        return [reward, ""]
    return [reward, f"{rewards.eval_reward:.3f} at {rewards.eval_step}"]


def _startup_json(startup: StartupPhase | None, now: float) -> dict | None:
    if startup is None:
        return None
    return {**startup.to_json(), "text": startup.describe(now)}


def _print_processes(supervisor: dict, processes: list[dict]) -> None:
    if supervisor["running"]:
        title = f"processes (supervisor pid {supervisor['pid']}, {supervisor['status']})"
    elif processes:
        title = "processes (supervisor not running; last recorded states)"
    else:
        say("supervisor: not running (start it with `workbench up`)")
        return
    table = Table(title=title, title_justify="left")
    for column in ("process", "state", "pid", "restarts", "uptime", "busy", "note"):
        table.add_column(column, overflow="fold")
    for row in processes:
        note = row["reason"] or (f"last: {row['last_exit']}" if row["last_exit"] else "")
        table.add_row(
            escape(row["name"]),
            row["state"] or "",
            "" if row["pid"] is None else str(row["pid"]),
            str(row["restarts"]),
            format_duration(row["uptime_s"]),
            "" if row["busy"] is None else f"{row['busy']['busy']:.0%}",
            escape(note.splitlines()[0] if note else ""),
        )
    console.print(table)


def _nodes_table(nodes: list[NodeStatus]) -> Table:
    table = Table(title="trainer nodes", title_justify="left")
    for column in ("node", "host", "state", "restarts", "note"):
        table.add_column(column, overflow="fold")
    for node in nodes:
        table.add_row(
            str(node.node_rank),
            escape(node.host or "?"),
            node.state,
            str(node.restarts),
            escape((node.note or "").splitlines()[0] if node.note else ""),
        )
    return table


def _asha_cells(standing: dict | None) -> list[str]:
    if not standing:
        return ["", ""]
    rung = f"{standing['rung']} (step {standing['step']})"
    if standing["rank"] is None:
        return [rung, standing["decision"].replace("_", " ")]
    return [rung, f"{standing['rank']}/{standing['of']}"]
