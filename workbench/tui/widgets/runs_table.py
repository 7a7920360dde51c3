"""The runs table: one row per run directory, from the poller's snapshots.

Its first column marks each run in the run's colour (the one every view gives it): `●`
selected (space), `○` not; `▲` pinned (`p`: pinned runs stay on top). `/` asks the screen
for the runs filter, `escape` clears it. What is selected, pinned and filtered is the
app's (`workbench.tui.selection`); the table only shows it.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import ClassVar

from rich.text import Text
from textual.binding import Binding, BindingType
from textual.message import Message

from workbench.tui.data import RunView
from workbench.tui.format import (
    format_age,
    format_count,
    format_reward,
    format_steps,
    spark_bounds,
    sparkline,
)
from workbench.tui.selection import RunSelection
from workbench.tui.widgets.keyed_table import Cell, ColumnSpec, KeyedTable

SPARK_WIDTH = 10
STATUS_STYLES = {
    "active": "bold green",
    "waiting": "yellow",
    "finished": "cyan",
    "evicted": "magenta",
    "diverged": "bold red",
    "rejected": "bold red",
}


def _still_cells(run: RunView, spark_scale: tuple[float, float] | None) -> dict[str, Cell]:
    """The cells that change only when the run (or the table's sparkline scale) does."""
    low, high = spark_scale if spark_scale is not None else (None, None)
    return {
        "id": run.id,
        "status": Text(run.status, style=STATUS_STYLES.get(run.status, "")),
        "step": format_steps(run.step, run.max_steps),
        "reward": format_reward(run.reward),
        "trend": Text(sparkline(run.rewards, SPARK_WIDTH, low=low, high=high), style="cyan"),
        "tokens": format_count(run.tokens),
    }


SELECTED, UNSELECTED, PINNED = "●", "○", "▲"


@lru_cache(maxsize=256)
def mark_cell(colour: str, selected: bool, pinned: bool) -> Text:
    """The mark of a run: one Text per state and colour, so an unchanged mark is the very
    cell shown last time and costs nothing at a refresh."""
    text = Text()
    text.append(SELECTED if selected else UNSELECTED, style=colour)
    text.append(PINNED if pinned else " ", style="bold")
    return text


class RunsTable(KeyedTable):
    """Runs: its mark, id, status, step / max steps, reward and its sparkline (one scale
    for all rows: the range of the rewards they show), tokens (below 120 columns left out,
    so that sweep names fit beside the mark at 80), last update.

    Eviction and rejection reasons are on the run's detail screen (enter).
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "filter", "filter"),
        Binding("space", "toggle_selected", "select", show=False),
        Binding("p", "toggle_pinned", "pin", show=False),
        Binding("escape", "clear_filter", "clear filter", show=False),
    ]

    COLUMNS = (
        ColumnSpec("mark", "", width=2),
        ColumnSpec("id", "run"),
        ColumnSpec("status", "status", width=8),
        ColumnSpec("step", "step", width=9),
        ColumnSpec("reward", "reward", width=6),
        ColumnSpec("trend", "trend", width=SPARK_WIDTH),
        ColumnSpec("tokens", "tokens", width=6, optional=True),
        ColumnSpec("updated", "updated", width=9),
    )

    class RunChosen(Message):
        """Enter on a run: open its detail screen."""

        def __init__(self, run_id: str) -> None:
            super().__init__()
            self.run_id = run_id

    class FilterAsked(Message):
        """`/` on the runs table: the screen opens the runs filter."""

    _spark_scale: tuple[float, float] | None = None

    def show_runs(
        self, runs: Sequence[RunView], now: float, selection: RunSelection | None = None
    ) -> None:
        # One scale for every row's trend, the range of the rewards they show (rewards may
        # lie outside [0, 1]); when it moves, every row's trend is drawn again.
        scale = spark_bounds((run.rewards for run in runs), SPARK_WIDTH)
        if scale != self._spark_scale:
            self._spark_scale = scale
            self.forget_made_cells()
        self.show_objects(
            {run.id: run for run in runs},
            lambda run: _still_cells(run, scale),
            lambda run: {
                "updated": format_age(run.last_update, now),
                "mark": _mark(run.id, selection),
            },
        )

    def action_toggle_selected(self) -> None:
        if self.selected_key is not None:
            self.app.toggle_selected(self.selected_key)  # type: ignore[attr-defined]

    def action_toggle_pinned(self) -> None:
        if self.selected_key is not None:
            self.app.toggle_pinned(self.selected_key)  # type: ignore[attr-defined]

    def action_filter(self) -> None:
        self.post_message(self.FilterAsked())

    def action_clear_filter(self) -> None:
        self.app.set_run_filter("")  # type: ignore[attr-defined]

    def on_data_table_row_selected(self, event: KeyedTable.RowSelected) -> None:
        event.stop()
        if event.row_key.value is not None:
            self.post_message(self.RunChosen(event.row_key.value))


def _mark(run_id: str, selection: RunSelection | None) -> Text:
    if selection is None:
        return mark_cell("", selected=False, pinned=False)
    return mark_cell(
        selection.colour(run_id), selection.is_selected(run_id), selection.is_pinned(run_id)
    )
