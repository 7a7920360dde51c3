"""The workbench TUI: a client of the experiment directory and of the supervisor.

Data flow:
- a timer starts a thread worker every `poll_interval` seconds; it reads the experiment
  directory (`data.ExperimentReader`, incremental) into an immutable snapshot and hands it
  to the app, which sets its reactive `snapshot`; the screens watch it and update only the
  cells that changed. At most one poll runs at a time, so a slow disk delays, never piles up.
  Runs are ranked only while the leaderboard screen is open.
- the log pane tails its file in its own worker (`widgets.log_pane`).
- screens post requests (`messages`); the app runs the dialog, evicts as the CLI does
  (`supervisor.client.evict_and_tell`: `evicted.txt`, then the supervisor) and sends
  commands to the supervisor in thread workers, reporting outcomes as notifications.

Runs picked by the user (`workbench.tui.selection`) are the app's, in one place, for every
screen: `app.selected_runs()` is the runs selected with space in the runs table, in the
table's order (pinned first), empty when none is; `app.plotted_runs()` is what a view of
"the selected runs" shows: those, or when none is selected every run the filter (`/`)
keeps; `app.run_colour(run_id)` is the run's colour in every view. A screen that shows
them watches `selection_version` (it goes up at each select, pin or filter change).

Quitting exits the TUI only: the supervisor and its children live in their own session
and are never signalled from here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from textual import on, work
from textual.app import App
from textual.binding import Binding, BindingType
from textual.reactive import var

from workbench.files import layout
from workbench.supervisor.client import SupervisorError, evict_and_tell
from workbench.tui.collector import QuietCollector
from workbench.tui.commands import CommandOutcome, CommandSender, SupervisorCommands
from workbench.tui.data import (
    NODE_ROW_PREFIX,
    SUPERVISOR_PROCESS,
    ExperimentReader,
    ExperimentSnapshot,
)
from workbench.tui.messages import (
    AddRun,
    EvictRun,
    RestartProcess,
    RestartRun,
    ShowAlerts,
    ShowCurves,
    ShowLeaderboard,
    ShowRun,
    ShowSamples,
    StopAll,
    SwitchRanking,
)
from workbench.tui.screens.add_run import AddRunRequest, AddRunScreen
from workbench.tui.screens.alerts import AlertsScreen
from workbench.tui.screens.confirm import ConfirmScreen
from workbench.tui.screens.curves import CurvesScreen
from workbench.tui.screens.evict import EvictScreen
from workbench.tui.screens.help import HelpScreen
from workbench.tui.screens.leaderboard import LeaderboardScreen
from workbench.tui.screens.main import WIDE_LAYOUT_COLUMNS, MainScreen
from workbench.tui.screens.playground import PlaygroundScreen
from workbench.tui.screens.run_detail import RunDetailScreen
from workbench.tui.screens.samples import SamplesScreen
from workbench.tui.screens.side_by_side import SideBySideScreen
from workbench.tui.selection import RunSelection
from workbench.tui.widgets.log_pane import LOG_MAX_LINES

# Processes whose restart interrupts every run: asked for confirmation first.
SHARED_PROCESSES = frozenset({"inference", "trainer"})


class WorkbenchApp(App[None]):
    """The TUI of one experiment directory.

    `clock` gives "now" for ages and uptimes (tests freeze it); `commands` is the link to
    the supervisor (tests record what would be sent); `reader` turns the directory into
    snapshots.
    """

    CSS_PATH = "workbench.tcss"
    TITLE = "workbench"
    ENABLE_COMMAND_PALETTE = False
    HORIZONTAL_BREAKPOINTS: ClassVar[list[tuple[int, str]]] = [
        (0, "-narrow"),
        (WIDE_LAYOUT_COLUMNS, "-wide"),
    ]
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "quit"),
        Binding("question_mark", "help", "help"),
        Binding("ctrl+r", "poll_now", "refresh", show=False),
        Binding("v", "side_by_side", "side by side", show=False),
        Binding("A", "playground", "playground", show=False),
    ]

    # Set on every poll, even when equal to the last one: ages and uptimes move on.
    snapshot: var[ExperimentSnapshot | None] = var(None, always_update=True)
    # Goes up at every change of the selected or pinned runs or of the runs filter.
    selection_version: var[int] = var(0)

    def __init__(
        self,
        experiment: Path,
        *,
        clock: Callable[[], float] = time.time,
        commands: CommandSender | None = None,
        reader: ExperimentReader | None = None,
        poll_interval: float = 1.0,
        log_max_lines: int = LOG_MAX_LINES,
    ) -> None:
        super().__init__()
        self.experiment = Path(experiment)
        self.clock = clock
        self.commands: CommandSender = commands or SupervisorCommands(self.experiment)
        self.poll_interval = poll_interval
        self.log_max_lines = log_max_lines
        self._reader = reader or ExperimentReader(self.experiment)
        self._polling = False
        self._run_detail: RunDetailScreen | None = None
        self._warned: set[str] = set()
        self.polls = 0  # completed polls; tests wait on it
        self._collector = QuietCollector()
        self.run_selection = RunSelection(self.experiment)

    def on_mount(self) -> None:
        self.push_screen(MainScreen(self.experiment, self.clock, self.log_max_lines))
        self.action_poll_now()
        self.set_interval(self.poll_interval, self.action_poll_now)

    def on_unmount(self) -> None:
        self._collector.restore()
        self._reader.close()

    # ------------------------------------------------------------ polling

    def action_poll_now(self) -> None:
        if self._polling:
            return
        self._polling = True
        self._poll(rank=self._leaderboard_shown())

    def _leaderboard_shown(self) -> bool:
        # Only the leaderboard screen shows the ranking: polls leave it out otherwise.
        return any(isinstance(screen, LeaderboardScreen) for screen in self.screen_stack)

    @work(thread=True, group="poll", exit_on_error=False)
    def _poll(self, rank: bool) -> None:
        try:
            snapshot = self._reader.poll(rank=rank)
        except Exception as err:  # a broken file must not take the TUI down: say so, go on
            self.call_from_thread(self._poll_failed, err)
            return
        self.call_from_thread(self._poll_done, snapshot)

    def _poll_done(self, snapshot: ExperimentSnapshot) -> None:
        self._polling = False
        self.polls += 1
        self.snapshot = snapshot
        if not self._collector.settled:  # what lives long exists once one is shown
            self.call_after_refresh(self._collector.settle)
        if snapshot.leaderboard is None and self._leaderboard_shown():
            self.action_poll_now()  # the leaderboard opened during a poll without it
        for warning in snapshot.warnings:  # each once: state.json keeps listing it
            if warning not in self._warned:
                self._warned.add(warning)
                self.notify(warning, title="supervisor warning", severity="warning", timeout=10)

    def _poll_failed(self, err: Exception) -> None:
        self._polling = False
        self.polls += 1
        self.notify(f"reading {self.experiment} failed: {err}", severity="error", timeout=5)

    # ------------------------------------------------------------ picked runs

    def selected_runs(self) -> list[str]:
        """The runs selected (space in the runs table) that the experiment has, pinned
        first, then in the runs table's order; empty when none is selected."""
        runs = self.snapshot.runs if self.snapshot else ()
        return self.run_selection.selected_of(run.id for run in self.run_selection.order(runs))

    def plotted_runs(self) -> list[str]:
        """The runs a view of "the selected runs" shows: the selected ones, or when none
        is, every run the runs filter keeps (every run without a filter)."""
        runs = self.snapshot.runs if self.snapshot else ()
        return self.selected_runs() or [run.id for run in self.run_selection.shown(runs)]

    def run_colour(self, run_id: str) -> str:
        """The run's colour ("#rrggbb"), the same in every view for the TUI's whole life."""
        return self.run_selection.colour(run_id)

    def toggle_selected(self, run_id: str) -> bool:
        selected = self.run_selection.toggle_selected(run_id)
        self.selection_version = self.run_selection.version
        return selected

    def toggle_pinned(self, run_id: str) -> bool:
        pinned = self.run_selection.toggle_pinned(run_id)
        self.selection_version = self.run_selection.version
        return pinned

    def set_run_filter(self, text: str) -> None:
        """Filter the runs table (`workbench.tui.selection`); raises FilterError."""
        self.run_selection.set_filter(text)
        self.selection_version = self.run_selection.version

    # ------------------------------------------------------------ screens

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_side_by_side(self) -> None:
        # Runs side by side on their held-out prompts (`workbench samples --compare`).
        if not isinstance(self.screen, SideBySideScreen):
            self.push_screen(SideBySideScreen(self.experiment))

    def action_playground(self) -> None:
        # One prompt to every run's adapter and the base (`workbench ask`).
        if not isinstance(self.screen, PlaygroundScreen):
            self.push_screen(PlaygroundScreen(self.experiment))

    @on(ShowRun)
    def _show_run(self, message: ShowRun) -> None:
        # One detail screen, installed so that going back keeps it: `enter` shows it for
        # the chosen run instead of building its widgets again.
        if self._run_detail is None:
            self._run_detail = RunDetailScreen(message.run_id, self.experiment, self.clock)
            self.install_screen(self._run_detail, name="run-detail")
        screen = self._run_detail
        if screen in self.screen_stack:  # open below another screen: a second one on top
            screen = RunDetailScreen(message.run_id, self.experiment, self.clock)
        screen.show_run(message.run_id, self.snapshot)
        self.push_screen(screen)

    @on(ShowSamples)
    def _show_samples(self, message: ShowSamples) -> None:
        self.push_screen(SamplesScreen(message.run_id, self.experiment))

    @on(ShowLeaderboard)
    def _show_leaderboard(self) -> None:
        self.push_screen(LeaderboardScreen())
        self.action_poll_now()  # rank now rather than at the next tick

    @on(ShowAlerts)
    def _show_alerts(self) -> None:
        self.push_screen(AlertsScreen())

    @on(ShowCurves)
    def _show_curves(self) -> None:
        self.push_screen(CurvesScreen())

    @on(SwitchRanking)
    def _switch_ranking(self) -> None:
        by = "asymptote" if self._reader.leaderboard_ranked_by == "last" else "last"
        self._reader.rank_leaderboard_by(by)
        self.action_poll_now()

    # ------------------------------------------------------------ eviction

    @on(EvictRun)
    def _evict_requested(self, message: EvictRun) -> None:
        run_id = message.run_id
        run = self.snapshot.run(run_id) if self.snapshot else None
        if run is not None and run.status in ("evicted", "diverged"):
            self.notify(f"{run_id} is already evicted: {run.reason}", severity="warning")
            return

        def confirmed(reason: str | None) -> None:
            if reason is not None:
                self._evict(run_id, reason)

        self.push_screen(EvictScreen(run_id), confirmed)

    @work(thread=True, group="commands")
    def _evict(self, run_id: str, reason: str) -> None:
        try:
            evicted = evict_and_tell(
                self.experiment, run_id, reason, by="tui", supervisor=_Evictions(self.commands)
            )
        except FileNotFoundError:
            self.call_from_thread(self._report, CommandOutcome(False, f"{run_id} is gone"))
            return
        except OSError as err:
            outcome = CommandOutcome(False, f"could not evict {run_id}: {err}")
            self.call_from_thread(self._report, outcome)
            return
        said = f"{run_id} was already evicted" if evicted.already else f"evicted {run_id}"
        outcome = CommandOutcome(True, f"{said}: {evicted.eviction.reason}")
        self.call_from_thread(self._report, outcome)
        self.call_from_thread(self.action_poll_now)

    # ------------------------------------------------------------ restart, add, stop

    @on(RestartRun)
    def _restart_run(self, message: RestartRun) -> None:
        self._send("restart_run", run_id=message.run_id)

    @on(RestartProcess)
    def _restart_process(self, message: RestartProcess) -> None:
        name = message.name
        if name == SUPERVISOR_PROCESS:
            self.notify(
                "the supervisor is not restarted from the TUI: `workbench down`, then `up`",
                severity="warning",
            )
            return
        if name.startswith(NODE_ROW_PREFIX):
            self.notify(
                f"{name} is another machine's `workbench join`: restart the trainer to have "
                "every node meet again",
                severity="warning",
            )
            return
        if name not in SHARED_PROCESSES:
            self._send("restart_process", name=name)
            return

        def confirmed(yes: bool | None) -> None:
            if yes:
                self._send("restart_process", name=name)

        self.push_screen(
            ConfirmScreen(
                f"Restart {name}?",
                f"Every run waits while {name} restarts; runs resume from their last checkpoint.",
                "Restart",
            ),
            confirmed,
        )

    @on(AddRun)
    def _add_run(self) -> None:
        def entered(request: AddRunRequest | None) -> None:
            if request is None:
                return
            if layout.run_dir(self.experiment, request.run_id).exists():
                self.notify(f"{request.run_id} already exists", severity="error")
                return
            self._send("add_run", run_id=request.run_id, overrides=request.overrides)

        self.push_screen(AddRunScreen(), entered)

    @on(StopAll)
    def _stop_all(self) -> None:
        def confirmed(yes: bool | None) -> None:
            if yes:
                self._send("stop_all")

        self.push_screen(
            ConfirmScreen(
                "Stop everything?",
                "The supervisor stops every orchestrator, the trainer and inference "
                "(checkpoints are written first). The TUI stays open.",
                "Stop all",
            ),
            confirmed,
        )

    @work(thread=True, group="commands")
    def _send(self, cmd: str, **fields: object) -> None:
        # Thread: the control socket may be slow to answer; the UI must not wait on it.
        outcome = self.commands.send(cmd, **fields)
        self.call_from_thread(self._report, outcome)
        self.call_from_thread(self.action_poll_now)

    def _report(self, outcome: CommandOutcome) -> None:
        self.notify(outcome.message, severity="information" if outcome.ok else "error")


class _Evictions:
    """The TUI's commands as the supervisor `evict_and_tell` tells of an eviction."""

    def __init__(self, commands: CommandSender) -> None:
        self._commands = commands

    def is_running(self) -> bool:
        return self._commands.is_running()

    def evict(self, run_id: str, reason: str, by: str) -> dict[str, Any]:
        outcome = self._commands.send("evict", run_id=run_id, reason=reason, by=by)
        if not outcome.ok:
            raise SupervisorError(outcome.message)
        return {}


def run_tui(experiment: Path) -> None:
    """Open the TUI on `experiment`; returns when the user quits (training keeps running)."""
    WorkbenchApp(experiment).run()
