"""The experiment directory, read into plain dataclasses for the TUI.

One `ExperimentReader.poll()` turns the files of an experiment into an immutable
`ExperimentSnapshot`; widgets only ever see snapshots, never files. Reads are cheap enough
to repeat every second:

- the runs, state.json and whether its supervisor still runs are read into one
  `workbench.status.ExperimentState` (`read_experiment`), as `workbench status` and `up`
  read them, so they always agree;
- run states come from `workbench.status.RunStatusReader`; a run's files are read again
  only when they change;
- each run's `metrics.jsonl` is read incrementally from the byte offset reached last time
  (a file that shrinks or is replaced is read again from the start), never whole, by
  `workbench.run_metrics.MetricsReader`, which `workbench status` reads it with too; its
  reward and eval curves by step are gathered as `workbench plot` reads them
  (`workbench.curves.MetricCurve`);
- processes come from `supervisor/state.json`, which may be absent (no supervisor yet),
  or stale (the supervisor died): both are shown, not raised; so does the startup phase
  (`workbench.supervisor.startup`), while a live supervisor publishes one; each process's
  busy share of the last minute from its record (`workbench.files.busy`), as `status` shows it;
  a trainer on several nodes adds a row per joined node (`nodes/`, `workbench.files.nodes`),
  and a warning naming each node that is silent or failed;
- the supervisor's alerts (`alerts.jsonl`, `workbench.files.alerts`) are read as they are
  appended, the newest `ALERTS_KEPT` kept, with the count of all;
- the leaderboard ranks the runs as `workbench sweep report` does (`tui.leaderboard`),
  from the curves of the metric the metrics readers follow.

A poll costs what changed, not how many runs there are: it looks only at the runs and busy
records that file events name (`workbench.files.experiment_changes`, plus a slice of the others
in turn); a run it looks at whose files did not change costs a few `stat`s; the `RunView`
of a run that did not change is the very object of the last poll, so the widgets skip it
by identity; the leaderboard is ranked only for a poll that asks for it
(the TUI does while it shows one) and again only when a run changed.
The snapshot's dataclasses are frozen and compare by value.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from workbench.curves import EVAL_METRIC, REWARD_METRIC
from workbench.files import layout
from workbench.files.alerts import Alert, parse_alert
from workbench.files.busy import BusyReader
from workbench.files.experiment_changes import ExperimentChanges
from workbench.files.nodes import NodeStatus
from workbench.run_metrics import (
    FOLLOWED_CURVES,
    HISTORY_POINTS,
    LossDiagnostics,
    MetricsReader,
    as_int,
)
from workbench.status import (
    RunStatus,
    RunStatusReader,
    describe_fork,
    node_warnings,
    read_experiment,
)
from workbench.supervisor import paths as supervisor_paths
from workbench.supervisor.client import describe_last_exit, read_state, running_supervisor_pid
from workbench.supervisor.startup import StartupPhase
from workbench.sweep.report import RANKINGS
from workbench.system.clock import unix_time
from workbench.system.file_change import SETTLE_NS, OnFileChange, signature
from workbench.system.file_tail import AppendedLines
from workbench.tui.leaderboard import Leaderboard, LeaderboardReader, Ranking, RunMetric

# Alerts kept for the alerts screen (the newest); the count goes on past them.
ALERTS_KEPT = 200

SUPERVISOR_PROCESS = "supervisor"
# A joined node's row: `trainer-node<K>`, the name of its trainer log.
NODE_ROW_PREFIX = "trainer-node"


@dataclass(frozen=True)
class RunView:
    """One row of the runs table: the run's status plus what its metrics say."""

    id: str
    status: str
    step: int
    max_steps: int | None = None
    reason: str | None = None
    slot: int | None = None
    tokens: int = 0
    reward: float | None = None
    rewards: tuple[float, ...] = ()
    losses: tuple[float, ...] = ()
    reward_curve: tuple[tuple[int, float], ...] = ()  # (step, reward_mean), by step
    evals: tuple[tuple[int, float], ...] = ()  # (step, eval_reward_mean), by step
    last_update: float | None = None
    evicted_by: str | None = None
    loss: LossDiagnostics | None = None  # at the latest update
    forked_from: str = ""  # `run_a@20` for a run made by `workbench runs fork`


@dataclass(frozen=True)
class ProcessView:
    """One row of the processes table, from `supervisor/state.json`."""

    name: str
    kind: str
    state: str
    pid: int | None = None
    restarts: int = 0
    started_at: float | None = None
    run_id: str | None = None
    last_exit: str | None = None
    busy: float | None = None  # share of its last minute on its own work (`workbench.files.busy`)


@dataclass(frozen=True)
class SupervisorView:
    """Whether a supervisor is there to take commands, and what it last said about itself."""

    running: bool
    status: str
    pid: int | None = None
    started_at: float | None = None


@dataclass(frozen=True)
class ExperimentSnapshot:
    experiment: Path
    supervisor: SupervisorView
    runs: tuple[RunView, ...] = ()
    processes: tuple[ProcessView, ...] = ()
    leaderboard: Leaderboard | None = None
    startup: StartupPhase | None = None  # None unless a live supervisor published one
    warnings: tuple[str, ...] = ()  # the supervisor's (experiment tracking failing, ...)
    alerts: tuple[Alert, ...] = ()  # the newest ALERTS_KEPT, oldest first
    alerts_raised: int = 0  # every alert of alerts.jsonl, kept or not

    def run(self, run_id: str) -> RunView | None:
        return next((run for run in self.runs if run.id == run_id), None)

    def process(self, name: str) -> ProcessView | None:
        return next((proc for proc in self.processes if proc.name == name), None)


# ---------------------------------------------------------------- supervisor/state.json


def supervisor_view(state: dict[str, Any] | None, live_pid: int | None) -> SupervisorView:
    """What the top bar says: running (with state.json's status), stopped, gone or absent."""
    recorded = str(state.get("status") or "unknown") if state else None
    started_at = unix_time(state.get("started_at")) if state else None
    if live_pid is not None:
        return SupervisorView(
            running=True, status=recorded or "starting", pid=live_pid, started_at=started_at
        )
    if state is None:
        return SupervisorView(running=False, status="absent")
    # state.json outlives a killed supervisor: "gone" unless it recorded a clean stop.
    status = "stopped" if recorded == "stopped" else "gone"
    return SupervisorView(
        running=False, status=status, pid=as_int(state.get("pid")), started_at=started_at
    )


def process_views(
    state: dict[str, Any] | None,
    supervisor: SupervisorView,
    view_of: Callable[[str, dict[str, Any]], ProcessView] | None = None,
) -> tuple[ProcessView, ...]:
    """The supervisor itself first (its log is followable too), then its children, each
    row made by `view_of` (`process_view` unless a reader remembers rows).

    Without a live supervisor, pids and uptimes are left out, as `workbench status` does:
    they describe processes that may be long gone.
    """
    view_of = view_of or process_view
    if state is None:
        return ()
    views = [
        ProcessView(
            name=SUPERVISOR_PROCESS,
            kind=SUPERVISOR_PROCESS,
            state=supervisor.status,
            pid=supervisor.pid,
            started_at=supervisor.started_at,
        )
    ]
    processes = state.get("processes")
    if isinstance(processes, dict):
        for name, entry in processes.items():
            if isinstance(entry, dict):
                view = view_of(str(name), entry)
                if not supervisor.running:
                    view = dataclasses.replace(view, pid=None, started_at=None)
                views.append(view)
    return tuple(views)


def process_view(name: str, entry: dict[str, Any]) -> ProcessView:
    last_exit = describe_last_exit(entry)  # worded as `workbench status` words it
    return ProcessView(
        name=name,
        kind=str(entry.get("kind") or ""),
        state=str(entry.get("state") or "unknown"),
        pid=as_int(entry.get("pid")),
        restarts=as_int(entry.get("restarts")) or 0,
        started_at=unix_time(entry.get("started_at")),
        run_id=entry.get("run_id") if isinstance(entry.get("run_id"), str) else None,
        last_exit=last_exit,
    )


# ---------------------------------------------------------------- the whole experiment


def node_view(node: NodeStatus) -> ProcessView:
    """A joined node's row in the processes table: named as its log (`trainer-node<K>`, so
    Enter follows it), its host and note where the last exit goes. Node 0 is the trainer's
    row."""
    where = f"on {node.host}" if node.host else ""
    note = (node.note or "").splitlines()[0] if node.note else ""
    return ProcessView(
        name=f"{NODE_ROW_PREFIX}{node.node_rank}",
        kind="node",
        state=node.state,
        restarts=node.restarts,
        last_exit=": ".join(part for part in (where, note) if part) or None,
    )


class ExperimentReader:
    """Polls one experiment directory; keeps per-run metrics readers between polls.

    `supervisor_pid` says which supervisor runs for the experiment, if any: by default as
    `workbench status` decides it (the supervisor's pid file, checked alive and still a
    supervisor); tests give a fixed answer, so that a screenshot does not depend on the
    processes of the machine.
    """

    def __init__(
        self,
        experiment: Path,
        history: int = HISTORY_POINTS,
        supervisor_pid: Callable[[Path], int | None] = running_supervisor_pid,
        settle_ns: int = SETTLE_NS,
    ) -> None:
        self.experiment = experiment
        self._history = history
        self._supervisor_pid = supervisor_pid
        self._settle_ns = settle_ns
        self._statuses = RunStatusReader(experiment, settle_ns)
        self._metrics: dict[str, MetricsReader] = {}
        self._histories: dict[str, _Histories] = {}
        # Each run's status and histories at the last poll, and the row made of them.
        self._views: dict[str, tuple[RunStatus, _Histories, RunView]] = {}
        self._recipe_path = layout.recipe_path(experiment)
        # state.json, parsed again only when it changes; the rows made of it
        self._state = OnFileChange(
            supervisor_paths.state_path(experiment),
            partial(read_state, experiment),
            settle_ns,
        )
        self._processes: (
            tuple[Any, SupervisorView, dict[str, float], tuple[ProcessView, ...]] | None
        ) = None
        self._process_rows: dict[str, tuple[dict[str, Any], ProcessView]] = {}
        self._last_leaderboard: tuple[tuple[Any, ...], tuple[RunView, ...], Leaderboard] | None
        self._last_leaderboard = None
        self._leaderboard = LeaderboardReader(experiment)
        self._curve_metrics = FOLLOWED_CURVES
        self._busy = BusyReader(experiment)
        # Which runs and busy records to look at in a poll, from file events.
        self._changes = ExperimentChanges(experiment)
        self._alert_lines = AppendedLines(layout.alerts_path(experiment))
        self._alerts: deque[Alert] = deque(maxlen=ALERTS_KEPT)
        self._alerts_raised = 0
        self._alerts_view: tuple[Alert, ...] = ()

    def close(self) -> None:
        """Stop following the experiment's file events (the reader still polls, looking
        at every run each time)."""
        self._changes.close()

    def rank_leaderboard_by(self, by: str) -> None:
        """Rank the leaderboard from the next poll on by `by` ("last" or "asymptote")."""
        if by not in RANKINGS:
            raise ValueError(f"rank by one of {', '.join(RANKINGS)}, not {by!r}")
        self._leaderboard.by = by

    @property
    def leaderboard_ranked_by(self) -> str:
        return self._leaderboard.by

    def poll(self, *, rank: bool = True) -> ExperimentSnapshot:
        """The experiment as it is now. `rank=False` leaves the leaderboard out (None):
        ranking every run is the one part of a poll whose cost follows the number of runs
        even when few changed, so the TUI asks for it only while a leaderboard is shown."""
        changes = self._changes.take()
        changed = None if changes.everything else changes.runs
        experiment = read_experiment(
            self.experiment,
            read_runs=lambda _: self._statuses.read(changed),
            read_supervisor_state=lambda _: self._state.get(),
            supervisor_pid=self._supervisor_pid,
        )
        statuses = experiment.runs
        ranking = self._leaderboard.ranking()
        self._follow_curves(FOLLOWED_CURVES | {ranking.metric})
        seen = {status.id for status in statuses}
        for gone in set(self._metrics) - seen:
            del self._metrics[gone]
            self._histories.pop(gone, None)
            self._views.pop(gone, None)
        runs = []
        ranked = []
        for status in statuses:
            metrics = self._metrics.get(status.id)
            if metrics is None:
                metrics = MetricsReader(
                    layout.metrics_path(layout.run_dir(self.experiment, status.id)),
                    history=self._history,
                    curve_metrics=self._curve_metrics,
                    settle_ns=self._settle_ns,
                )
                self._metrics[status.id] = metrics
            if changed is None or status.id in changed or not metrics.caught_up:
                metrics.poll()
            histories = self._history_of(status.id, metrics)
            if rank:
                curve = histories.curves[ranking.metric]
                ranked.append(RunMetric(status, curve, metrics.last_step))
            runs.append(self._view_of(status, metrics, histories))
        runs_tuple = tuple(runs)
        state = experiment.supervisor_state
        supervisor = supervisor_view(state, experiment.supervisor_pid)
        nodes = experiment.nodes
        processes = self._processes_of(
            state, supervisor, None if changes.everything else changes.busy
        )
        return ExperimentSnapshot(
            experiment=self.experiment,
            supervisor=supervisor,
            runs=runs_tuple,
            processes=processes + tuple(node_view(node) for node in nodes[1:]),
            leaderboard=self._leaderboard_of(ranking, ranked, runs_tuple) if rank else None,
            startup=experiment.startup,
            warnings=tuple(
                node_warnings(nodes, experiment.supervisor_running) + experiment.warnings
            ),
            alerts=self._poll_alerts(),
            alerts_raised=self._alerts_raised,
        )

    def _poll_alerts(self) -> tuple[Alert, ...]:
        """The kept alerts: the same tuple as the last poll's unless the file grew."""
        restarts = self._alert_lines.restarts
        lines = self._alert_lines.read()
        replaced = self._alert_lines.restarts != restarts
        if replaced:  # a new file: counted again from its start
            self._alerts.clear()
            self._alerts_raised = 0
        new = [alert for line in lines if (alert := parse_alert(line)) is not None]
        if new or replaced:
            self._alerts.extend(new)
            self._alerts_raised += len(new)
            self._alerts_view = tuple(self._alerts)
        return self._alerts_view

    def _processes_of(
        self,
        state: dict[str, Any] | None,
        supervisor: SupervisorView,
        busy_changed: AbstractSet[str] | None,
    ) -> tuple[ProcessView, ...]:
        """The processes' rows; the very tuple of the last poll while state.json and the
        supervisor did not change (it lists every orchestrator that ever ran)."""
        known = self._processes
        # Each process's busy share, to the percent shown: it changes with the clock.
        busy = {
            name: round(shares["busy"], 2)
            for name, shares in self._busy.recent(time.time(), busy_changed).items()
        }
        if known is not None and known[0] is state and known[1] == supervisor and known[2] == busy:
            return known[3]
        views = tuple(
            dataclasses.replace(view, busy=busy[view.name]) if view.name in busy else view
            for view in process_views(state, supervisor, self._process_row)
        )
        # More remembered rows than listed processes (`views` has the supervisor's row
        # besides): some are no longer listed.
        if len(self._process_rows) >= len(views):
            listed = {view.name for view in views}
            self._process_rows = {n: r for n, r in self._process_rows.items() if n in listed}
        if known is not None:  # a process that did not change keeps its row's object
            before = {view.name: view for view in known[3]}
            views = tuple(before[v.name] if before.get(v.name) == v else v for v in views)
        self._processes = (state, supervisor, busy, views)
        return views

    def _process_row(self, name: str, entry: dict[str, Any]) -> ProcessView:
        """The row of one entry of state.json, made again only when the entry changed:
        state.json is rewritten whenever any process changes, and lists every
        orchestrator that ever ran."""
        known = self._process_rows.get(name)
        if known is not None and known[0] == entry:
            return known[1]
        view = process_view(name, entry)
        self._process_rows[name] = (entry, view)
        return view

    def _view_of(self, status: RunStatus, metrics: MetricsReader, histories: _Histories) -> RunView:
        """The run's row; the very object of the last poll when nothing of it changed, so
        that the screens can skip it by identity."""
        known = self._views.get(status.id)
        if (
            known is not None
            and known[1] is histories
            # The status reader keeps a run's status object while nothing of it changed.
            and (known[0] is status or known[0] == status)
        ):
            return known[2]
        rewards = histories.rewards
        view = RunView(
            id=status.id,
            status=status.status,
            # metrics.jsonl gets the trainer's line as soon as a step is done;
            # runs.json only at the next synchronisation: show whichever is ahead.
            step=max(status.step, metrics.trainer_step),
            max_steps=status.max_steps,
            forked_from=describe_fork(status.forked_from),
            reason=status.reason,
            slot=status.slot,
            tokens=max(status.total_tokens, metrics.tokens),
            reward=rewards[-1] if rewards else None,
            rewards=rewards,
            losses=histories.losses,
            reward_curve=histories.curves[REWARD_METRIC],
            evals=histories.curves[EVAL_METRIC],
            # A Tinker client's run: its client's last request counts as an update.
            last_update=max(
                (t for t in (metrics.last_time, status.last_request) if t is not None),
                default=None,
            ),
            evicted_by=status.evicted_by,
            loss=histories.loss,
        )
        self._views[status.id] = (status, histories, view)
        return view

    def _leaderboard_of(
        self, ranking: Ranking, ranked: list[RunMetric], runs: tuple[RunView, ...]
    ) -> Leaderboard:
        """Ranked again only when something it depends on changed: a run's row (it is the
        object of the last poll otherwise), a run's files (its orch.toml sets the values
        shown), the recipe (its defaults) or the ranking."""
        inputs = (ranking, self._statuses.files_read, signature(self._recipe_path))
        last = self._last_leaderboard
        if (
            last is not None
            and last[0] == inputs
            and len(last[1]) == len(runs)
            and all(a is b for a, b in zip(last[1], runs, strict=True))
        ):
            return last[2]
        board = self._leaderboard.leaderboard(ranking, ranked)
        self._last_leaderboard = (inputs, runs, board)
        return board

    def _follow_curves(self, metrics: frozenset[str]) -> None:
        """Have the metrics readers follow the curves of `metrics`: when they change (the
        recipe's early stopping now ranks by another metric), every file is read again."""
        if metrics != self._curve_metrics:
            self._curve_metrics = metrics
            self._metrics.clear()
            self._histories.clear()
            self._views.clear()

    def _history_of(self, run_id: str, metrics: MetricsReader) -> _Histories:
        # Copy the deques into tuples only when they changed: snapshots then share them.
        cached = self._histories.get(run_id)
        if cached is None or cached.version != metrics.version:
            cached = _Histories(
                version=metrics.version,
                rewards=tuple(metrics.rewards),
                losses=tuple(metrics.losses),
                curves={name: tuple(curve.points()) for name, curve in metrics.curves.items()},
                loss=metrics.loss,
            )
            self._histories[run_id] = cached
        return cached


@dataclass(frozen=True)
class _Histories:
    """What one run's metrics reader held at `version`, as tuples snapshots can share."""

    version: int
    rewards: tuple[float, ...]
    losses: tuple[float, ...]
    curves: dict[str, tuple[tuple[int, float], ...]]
    loss: LossDiagnostics | None = None
