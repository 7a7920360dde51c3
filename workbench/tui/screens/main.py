"""The main screen: runs and processes on top, the followed log below, keys in the footer.

While the experiment starts, a line under the top bar says what it is doing (building the
model, step k/n; starting inference, seconds so far and its log's last line); it goes
once every process is up. A banner under it says when the supervisor raised alerts not
yet seen (how many, and the newest); `!` opens the list of alerts and clears it. `t` opens
the timeline: the last minute of each process (`screens.timeline`).

At 120 columns and more the two tables sit side by side; below that they stack, capped in
height so the log keeps most of the screen, and the processes' "last exit" column is
hidden: 80x24 over SSH stays readable.
The runs table shows the runs the app's filter keeps, pinned runs first, each marked in
its colour (`widgets.runs_table`); `/` on it opens the filter line above the tables
(typing filters as it goes, enter keeps the filter, escape clears it), and its title says
how many runs the filter keeps and how many are selected. `/` elsewhere searches the log.
The screen turns snapshots into table updates and keys into requests to the app; it does
no I/O of its own besides what the log pane's worker reads.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import ClassVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Container
from textual.events import Resize
from textual.screen import Screen
from textual.widgets import Input, Static

from workbench.files import layout
from workbench.supervisor.startup import FAILED, StartupPhase
from workbench.tui.data import ExperimentSnapshot, SupervisorView
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
)
from workbench.tui.screens.timeline import TimelineScreen
from workbench.tui.selection import FilterError, RunSelection
from workbench.tui.widgets.footer import Footer
from workbench.tui.widgets.log_pane import LOG_MAX_LINES, LogPane, LogTarget
from workbench.tui.widgets.processes_table import ProcessesTable
from workbench.tui.widgets.runs_table import RunsTable

# Below this width the tables stack and drop their optional columns.
WIDE_LAYOUT_COLUMNS = 120


# Order of the run counts in the top bar: work in progress first, problems last.
_STATUS_ORDER = ("active", "waiting", "finished", "evicted", "diverged", "rejected")


def top_bar_text(snapshot: ExperimentSnapshot) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(f" {snapshot.experiment.name}  ", style="bold")
    text.append_text(_supervisor_text(snapshot.supervisor))
    counts: dict[str, int] = {}
    for run in snapshot.runs:
        counts[run.status] = counts.get(run.status, 0) + 1
    order = {status: index for index, status in enumerate(_STATUS_ORDER)}
    summary = " · ".join(
        f"{counts[status]} {status}" for status in sorted(counts, key=lambda s: order.get(s, 99))
    )
    text.append(f"  runs: {summary or 'none'}", style="dim")
    return text


def _supervisor_text(supervisor: SupervisorView) -> Text:
    if supervisor.running:
        return Text(f"supervisor {supervisor.status}", style="green")
    if supervisor.status in ("absent", "stopped"):
        return Text("supervisor not running", style="yellow")
    # state.json is there but no supervisor runs and it never recorded a clean stop:
    # it was killed, or the machine rebooted.
    return Text("supervisor gone", style="bold red")


def alerts_banner_text(snapshot: ExperimentSnapshot, seen: int) -> Text | None:
    """The banner of alerts raised since the list was last opened; None when none was."""
    new = snapshot.alerts_raised - seen
    if new <= 0 or not snapshot.alerts:
        return None
    newest = snapshot.alerts[-1]
    text = Text(no_wrap=True, overflow="ellipsis", style="bold black on yellow")
    text.append(f" ! {new} new alert{'s' if new > 1 else ''} (! lists them): ")
    text.append(f"{newest.run or newest.process} {newest.rule}: {newest.message}")
    return text


def startup_text(startup: StartupPhase | None, now: float) -> Text | None:
    """The startup line at unix time `now`; None when there is nothing starting."""
    if startup is None or startup.ready:
        return None
    style = "bold red" if startup.phase == FAILED else "yellow"
    return Text(f" {startup.describe(now)}", style=style, no_wrap=True, overflow="ellipsis")


def runs_title(snapshot: ExperimentSnapshot, shown: int, selection: RunSelection) -> str:
    """The runs table's title: the filter and how many runs it keeps, how many selected."""
    title = "runs"
    if selection.filter is not None:
        title += f" · /{selection.filter.text}: {shown} of {len(snapshot.runs)}"
    selected = len(selection.selected_of(run.id for run in snapshot.runs))
    if selected:
        title += f" · {selected} selected"
    return title


class RunsFilterInput(Input):
    """The runs filter line: escape clears the filter and closes it."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "close", "clear", show=False)]

    def action_close(self) -> None:
        self.value = ""
        self.screen.close_runs_filter()  # type: ignore[attr-defined]


class MainScreen(Screen[None]):
    # Focused when the screen is shown: the runs, not the first focusable (the filter line).
    AUTO_FOCUS = "#runs"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("e", "evict", "evict"),
        Binding("r", "restart", "restart"),
        Binding("a", "add_run", "add"),
        Binding("f", "follow", "follow"),
        Binding("slash", "search", "search"),
        Binding("S", "stop_all", "stop"),
        Binding("b", "leaderboard", "ranks"),
        Binding("s", "samples", "samples"),
        Binding("l", "focus_log", "log", show=False),
        # Not in the footer, which 80 columns fill: the help lists it, and the leaderboard's
        # and a run's footers show it.
        Binding("c", "curves", "curves", show=False),
        Binding("exclamation_mark", "alerts", "alerts", show=False),
        Binding("t", "timeline", "timeline", show=False),
    ]

    def __init__(
        self, experiment: Path, clock: Callable[[], float], log_max_lines: int = LOG_MAX_LINES
    ) -> None:
        super().__init__()
        self.experiment = experiment
        self.clock = clock
        self.log_max_lines = log_max_lines
        self.snapshot: ExperimentSnapshot | None = None
        self._top_bar: Text | None = None
        self._startup: Text | None = None
        self._alerts_banner: Text | None = None
        self.alerts_seen = 0  # alerts raised when the list was last opened
        # What `f`, `r` and `e` act on: the selected row of the table focused last.
        self.selected_kind = "run"

    def compose(self) -> ComposeResult:
        yield Static(" workbench", id="top-bar")
        yield Static(id="startup")
        yield Static(id="alerts-banner")
        yield RunsFilterInput(
            placeholder="filter runs: id text, key=value, key>value (enter: keep, esc: clear)",
            compact=True,
            id="runs-filter",
        )
        with Container(id="tables"):
            runs = RunsTable(id="runs")
            runs.border_title = "runs"
            yield runs
            processes = ProcessesTable(id="processes")
            processes.border_title = "processes"
            yield processes
        yield LogPane(max_lines=self.log_max_lines, id="log-pane")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.watch(self.app, "snapshot", self._show_snapshot)
        self.watch(self.app, "selection_version", self._show_runs, init=False)
        self.query_one(RunsTable).focus()

    def on_resize(self, event: Resize) -> None:
        compact = event.size.width < WIDE_LAYOUT_COLUMNS
        self.query_one(RunsTable).set_compact(compact)
        self.query_one(ProcessesTable).set_compact(compact)

    # ------------------------------------------------------------ snapshots

    def _show_snapshot(self, snapshot: ExperimentSnapshot | None) -> None:
        if snapshot is None:
            return
        self.snapshot = snapshot
        now = self.clock()
        top_bar = top_bar_text(snapshot)
        if top_bar != self._top_bar:  # redraw only what changed: idle costs nothing
            self._top_bar = top_bar
            self.query_one("#top-bar", Static).update(top_bar)
        startup = startup_text(snapshot.startup, now)
        if startup != self._startup:
            self._startup = startup
            line = self.query_one("#startup", Static)
            line.display = startup is not None
            line.update(startup or "")
        self._show_alerts_banner()
        self._show_runs()
        self.query_one(ProcessesTable).show_processes(snapshot.processes, now)
        log_pane = self.query_one(LogPane)
        if log_pane.target is None:
            # Something useful on screen from the start: the first run's log, else the
            # supervisor's (it says why nothing runs yet).
            if snapshot.runs:
                log_pane.follow(self._run_target(snapshot.runs[0].id))
            elif snapshot.processes:
                target = self._process_target(snapshot.processes[0].name)
                if target is not None:
                    log_pane.follow(target)

    def _show_runs(self) -> None:
        if self.snapshot is None:
            return
        selection: RunSelection = self.app.run_selection  # type: ignore[attr-defined]
        shown = selection.shown(self.snapshot.runs)
        table = self.query_one(RunsTable)
        table.show_runs(shown, self.clock(), selection)
        title = runs_title(self.snapshot, len(shown), selection)
        if table.border_title != title:
            table.border_title = title

    # ------------------------------------------------------------ runs filter

    @on(RunsTable.FilterAsked)
    def _open_runs_filter(self) -> None:
        line = self.query_one(RunsFilterInput)
        selection: RunSelection = self.app.run_selection  # type: ignore[attr-defined]
        line.value = selection.filter.text if selection.filter else ""
        line.display = True
        line.focus()

    @on(Input.Changed, "#runs-filter")
    def _runs_filter_typed(self, event: Input.Changed) -> None:
        # Filter as the user types; a term not finished yet (`lr>`) keeps the last filter.
        with suppress(FilterError):
            self.app.set_run_filter(event.value)  # type: ignore[attr-defined]

    @on(Input.Submitted, "#runs-filter")
    def _runs_filter_entered(self, event: Input.Submitted) -> None:
        try:
            self.app.set_run_filter(event.value)  # type: ignore[attr-defined]
        except FilterError as err:
            self.notify(f"runs filter: {err}", severity="error")
            return
        self.close_runs_filter()

    def close_runs_filter(self) -> None:
        """Hide the filter line (an empty one clears the filter) and go back to the runs."""
        line = self.query_one(RunsFilterInput)
        if not line.value.strip():
            self.app.set_run_filter("")  # type: ignore[attr-defined]
        line.display = False
        self.query_one(RunsTable).focus()

    def _show_alerts_banner(self) -> None:
        if self.snapshot is None:
            return
        banner = alerts_banner_text(self.snapshot, self.alerts_seen)
        if banner != self._alerts_banner:
            self._alerts_banner = banner
            line = self.query_one("#alerts-banner", Static)
            line.display = banner is not None
            line.update(banner or "")

    def _run_target(self, run_id: str) -> LogTarget:
        return LogTarget(title=run_id, path=layout.process_log_path(self.experiment, run_id))

    def _process_target(self, name: str) -> LogTarget | None:
        process = self.snapshot.process(name) if self.snapshot else None
        if process is None:
            return None
        return LogTarget(title=name, path=layout.process_log_path(self.experiment, process.name))

    # ------------------------------------------------------------ selection

    def on_descendant_focus(self) -> None:
        # The table focused last decides what `f`, `r` and `e` act on (the log pane keeps
        # the choice: following a process's log, `r` still restarts that process).
        focused = self.focused
        if isinstance(focused, RunsTable):
            self.selected_kind = "run"
        elif isinstance(focused, ProcessesTable):
            self.selected_kind = "process"

    @property
    def selected_run(self) -> str | None:
        return self.query_one(RunsTable).selected_key

    @property
    def selected_process(self) -> str | None:
        return self.query_one(ProcessesTable).selected_key

    @on(RunsTable.RunChosen)
    def _run_chosen(self, event: RunsTable.RunChosen) -> None:
        self.post_message(ShowRun(event.run_id))

    @on(ProcessesTable.ProcessChosen)
    def _process_chosen(self, event: ProcessesTable.ProcessChosen) -> None:
        target = self._process_target(event.name)
        if target is not None:
            self.query_one(LogPane).follow(target)

    # ------------------------------------------------------------ actions

    def action_follow(self) -> None:
        log_pane = self.query_one(LogPane)
        if self.selected_kind == "process" and self.selected_process:
            target = self._process_target(self.selected_process)
        elif self.selected_run:
            target = self._run_target(self.selected_run)
        else:
            target = None
        if target is None:
            self.notify("nothing selected: pick a run or a process first", severity="warning")
            return
        log_pane.follow(target)

    def action_evict(self) -> None:
        run_id = self.selected_run
        process = self.snapshot.process(self.selected_process or "") if self.snapshot else None
        if self.selected_kind == "process" and process is not None and process.run_id:
            run_id = process.run_id  # an orchestrator's row stands for its run
        if run_id is None:
            self.notify("no run to evict", severity="warning")
            return
        self.post_message(EvictRun(run_id))

    def action_restart(self) -> None:
        if self.selected_kind == "process" and self.selected_process:
            self.post_message(RestartProcess(self.selected_process))
        elif self.selected_run:
            self.post_message(RestartRun(self.selected_run))
        else:
            self.notify("nothing selected to restart", severity="warning")

    def action_add_run(self) -> None:
        self.post_message(AddRun())

    def action_stop_all(self) -> None:
        self.post_message(StopAll())

    def action_samples(self) -> None:
        if self.selected_run:
            self.post_message(ShowSamples(self.selected_run))

    def action_leaderboard(self) -> None:
        self.post_message(ShowLeaderboard())

    def action_alerts(self) -> None:
        if self.snapshot is not None:
            self.alerts_seen = self.snapshot.alerts_raised
            self._show_alerts_banner()
        self.post_message(ShowAlerts())

    def action_curves(self) -> None:
        self.post_message(ShowCurves())

    def action_timeline(self) -> None:
        self.app.push_screen(TimelineScreen(self.experiment, self.clock))

    def action_search(self) -> None:
        self.query_one(LogPane).start_search()

    def action_focus_log(self) -> None:
        self.query_one(LogPane).log.focus()
