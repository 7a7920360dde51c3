"""The leaderboard screen: every run ranked by the sweep's metric, the selected one in full.

The table (`widgets.leaderboard_table`) has a row per run, best first; below it, the
selected run's whole story: its value and where it was measured, every value it sets
over `[defaults]`, its rung, and why it stopped (early stopping's reason, or who evicted
it and why). It follows the app's snapshots like the main screen; `b` or Escape goes
back to it, enter opens the run's detail, `f` ranks by the asymptote of each run's fitted
eval curve instead of its last value, and back; `a` opens the runs of every experiment
under the same folder, ranked together (`screens.compare`).
"""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import DataTable, Static

from workbench.sweep.fit import SigmoidFit
from workbench.tui.data import ExperimentSnapshot
from workbench.tui.format import format_steps
from workbench.tui.leaderboard import EARLY_STOPPED, Leaderboard, LeaderboardRow
from workbench.tui.messages import EvictRun, RestartRun, ShowCurves, SwitchRanking
from workbench.tui.screens.compare import CompareScreen
from workbench.tui.widgets.footer import Footer
from workbench.tui.widgets.leaderboard_table import (
    STATE_STYLES,
    LeaderboardTable,
    format_metric,
)


def ranking_words(board: Leaderboard) -> str:
    order = "highest" if board.mode == "max" else "lowest"
    if board.by == "asymptote":
        return f"asymptote of {board.metric}'s fit, {order} first; no reliable fit: last value"
    return f"{board.metric}, {order} first"


def fit_words(fit: SigmoidFit | None) -> str:
    """The run's sigmoid fit in a line, as `sweep report --by asymptote` judges it."""
    if fit is None:
        return "fit: none yet (needs the version-0 eval and a later one)"
    words = f"fit: asymptote {format_metric(fit.asymptote)}, midpoint step {fit.midpoint:.0f}"
    return words + (" (reliable)" if fit.reliable else f" (not reliable: {fit.note})")


def leaderboard_top_bar(snapshot: ExperimentSnapshot, board: Leaderboard) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(f" {snapshot.experiment.name}  ", style="bold")
    text.append("leaderboard")
    counts = [f"{len(board.rows)} runs"]
    states = ((EARLY_STOPPED, "stopped early"), ("evicted", "evicted"), ("diverged", "diverged"))
    for state, words in states:
        count = sum(1 for row in board.rows if row.state == state)
        if count:
            counts.append(f"{count} {words}")
    text.append(f"  {' · '.join(counts)}", style="dim")
    return text


def selected_run_text(row: LeaderboardRow, board: Leaderboard, max_steps: int | None) -> Text:
    """The selected run in full, a few short lines: the table shortens what does not fit."""
    text = Text()
    text.append(f"#{row.rank} {row.id}", style="bold")
    text.append("  ")
    text.append(row.state, style=STATE_STYLES.get(row.state, ""))
    text.append(f"  step {format_steps(row.step, max_steps)}")
    text.append(f"\n{board.metric} {format_metric(row.value)}")
    if row.value_step is not None:
        text.append(f" at step {row.value_step}")
    if row.rung is not None:
        text.append(f" · early stopping rung {row.rung} (step {row.rung_step})")
    if board.by == "asymptote":
        text.append(f"\n{fit_words(row.fit)}", style="" if row.fit and row.fit.reliable else "dim")
    text.append("\nvalues: ", style="bold")
    text.append(row.values or "the recipe's [defaults]")
    why = _why_stopped(row)
    if why:
        text.append("\n")
        text.append(why, style=STATE_STYLES.get(row.state, ""))
    if row.note:
        text.append(f"\nnote: {row.note}", style="dim")
    return text


def _why_stopped(row: LeaderboardRow) -> str | None:
    if row.state == EARLY_STOPPED:
        return f"stopped early: {row.reason}"
    if row.state == "evicted":
        return f"evicted by {row.evicted_by}: {row.reason}" if row.evicted_by else row.reason
    if row.state == "diverged":
        return row.reason  # `diverged: gradient norm nan at updates 3-5; ...`
    if row.state == "rejected":
        return f"rejected: {row.reason}"
    return None


class LeaderboardScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("b,escape", "app.pop_screen", "back"),
        Binding("c", "curves", "curves"),
        Binding("e", "evict", "evict"),
        Binding("r", "restart", "restart"),
        Binding("f", "switch_ranking", "fit/last"),
        Binding("a", "all_experiments", "all exps"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.snapshot: ExperimentSnapshot | None = None
        self._shown: dict[str, Text] = {}  # what each Static shows, by id

    def compose(self) -> ComposeResult:
        yield Static(" leaderboard", id="top-bar")
        table = LeaderboardTable(id="leaderboard")
        table.border_title = "leaderboard"
        yield table
        yield Static("", id="leaderboard-selected")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.watch(self.app, "snapshot", self._show_snapshot)
        self.query_one(LeaderboardTable).focus()

    def _show_snapshot(self, snapshot: ExperimentSnapshot | None) -> None:
        if snapshot is None or snapshot.leaderboard is None:
            return
        self.snapshot = snapshot
        board = snapshot.leaderboard
        self._update("top-bar", leaderboard_top_bar(snapshot, board))
        table = self.query_one(LeaderboardTable)
        table.border_title = f"runs by {ranking_words(board)}"
        table.show_leaderboard(board.rows)
        self._show_selected()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_selected()

    def _show_selected(self) -> None:
        board = self.snapshot.leaderboard if self.snapshot else None
        row = board.row(self.selected_run or "") if board else None
        if board is None or row is None:
            self._update("leaderboard-selected", Text("no runs yet", style="dim italic"))
            return
        run = self.snapshot.run(row.id) if self.snapshot else None
        text = selected_run_text(row, board, run.max_steps if run else None)
        self._update("leaderboard-selected", text)

    def _update(self, static_id: str, text: Text) -> None:
        # Redraw only what changed: an idle leaderboard costs nothing.
        if self._shown.get(static_id) != text:
            self._shown[static_id] = text
            self.query_one(f"#{static_id}", Static).update(text)

    @property
    def selected_run(self) -> str | None:
        return self.query_one(LeaderboardTable).selected_key

    def action_switch_ranking(self) -> None:
        self.post_message(SwitchRanking())

    def action_curves(self) -> None:
        self.post_message(ShowCurves())

    def action_all_experiments(self) -> None:
        if self.snapshot is not None:
            self.app.push_screen(CompareScreen(self.snapshot.experiment))

    def action_evict(self) -> None:
        if self.selected_run:
            self.post_message(EvictRun(self.selected_run))

    def action_restart(self) -> None:
        if self.selected_run:
            self.post_message(RestartRun(self.selected_run))
