"""The runs table: one row per run directory, from the poller's snapshots."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
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


class RunsTable(KeyedTable):
    """Runs: id, status, step / max steps, reward and its sparkline (one scale for all
    rows: the range of the rewards they show), tokens, last update.

    Eviction and rejection reasons are on the run's detail screen (enter).
    """

    COLUMNS = (
        ColumnSpec("id", "run"),
        ColumnSpec("status", "status", width=8),
        ColumnSpec("step", "step", width=9),
        ColumnSpec("reward", "reward", width=6),
        ColumnSpec("trend", "trend", width=SPARK_WIDTH),
        ColumnSpec("tokens", "tokens", width=6),
        ColumnSpec("updated", "updated", width=9),
    )

    class RunChosen(Message):
        """Enter on a run: open its detail screen."""

        def __init__(self, run_id: str) -> None:
            super().__init__()
            self.run_id = run_id

    _spark_scale: tuple[float, float] | None = None

    def show_runs(self, runs: Sequence[RunView], now: float) -> None:
        # One scale for every row's trend, the range of the rewards they show (rewards may
        # lie outside [0, 1]); when it moves, every row's trend is drawn again.
        scale = spark_bounds((run.rewards for run in runs), SPARK_WIDTH)
        if scale != self._spark_scale:
            self._spark_scale = scale
            self.forget_made_cells()
        self.show_objects(
            {run.id: run for run in runs},
            lambda run: _still_cells(run, scale),
            lambda run: {"updated": format_age(run.last_update, now)},
        )

    def on_data_table_row_selected(self, event: KeyedTable.RowSelected) -> None:
        event.stop()
        if event.row_key.value is not None:
            self.post_message(self.RunChosen(event.row_key.value))
