"""The leaderboard table: one row per run, best first, from the snapshot's leaderboard."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

from workbench.tui.format import spark_bounds, sparkline
from workbench.tui.leaderboard import EARLY_STOPPED, LeaderboardRow
from workbench.tui.messages import ShowRun
from workbench.tui.widgets.keyed_table import Cell, ColumnSpec, KeyedTable
from workbench.tui.widgets.runs_table import SPARK_WIDTH, STATUS_STYLES

STATE_STYLES = {**STATUS_STYLES, EARLY_STOPPED: "bold magenta reverse"}


def format_metric(value: float | None) -> str:
    """A metric as `workbench sweep report` prints it: four significant digits."""
    return "-" if value is None else f"{value:.4g}"


def leaderboard_cells(row: LeaderboardRow, bounds: tuple[float, float] | None) -> dict[str, Cell]:
    low, high = bounds if bounds is not None else (None, None)
    return {
        "rank": Text(
            str(row.rank), style="bold" if row.rank == 1 and row.value is not None else ""
        ),
        "id": row.id,
        "value": format_metric(row.value),
        "value_step": "-" if row.value_step is None else str(row.value_step),
        "rung": "-" if row.rung is None else str(row.rung),
        "state": Text(row.state, style=STATE_STYLES.get(row.state, "")),
        "curve": Text(sparkline(row.curve, SPARK_WIDTH, low=low, high=high), style="cyan"),
        # Text, not str: a list value's brackets are not markup.
        "values": Text(row.values or "defaults", no_wrap=True, overflow="ellipsis"),
    }


class LeaderboardTable(KeyedTable):
    """Rank, run, the metric and the step it was measured at, the highest rung, the state
    (`early-stop` for a run early stopping evicted), the metric's sparkline and the values
    the run sets over `[defaults]` (as much as fits; the screen shows the selected run's
    whole)."""

    COLUMNS = (
        ColumnSpec("rank", "#", width=3),
        ColumnSpec("id", "run"),
        ColumnSpec("value", "value", width=7),
        ColumnSpec("value_step", "@step", width=5),
        ColumnSpec("rung", "rung", width=4),
        ColumnSpec("state", "state", width=len(EARLY_STOPPED)),
        ColumnSpec("curve", "curve", width=SPARK_WIDTH),
        ColumnSpec("values", "values", width=6, fill=True),
    )

    def show_leaderboard(self, rows: Sequence[LeaderboardRow]) -> None:
        bounds = spark_bounds((row.curve for row in rows), SPARK_WIDTH)
        self.show_rows({row.id: leaderboard_cells(row, bounds) for row in rows})

    def on_data_table_row_selected(self, event: KeyedTable.RowSelected) -> None:
        event.stop()
        if event.row_key.value is not None:
            self.post_message(ShowRun(event.row_key.value))
