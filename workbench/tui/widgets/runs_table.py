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


def run_cells(run: RunView, now: float) -> dict[str, Cell]:
    return {**_still_cells(run), "updated": format_age(run.last_update, now)}


def _still_cells(run: RunView) -> dict[str, Cell]:
    """The cells that change only when the run does (not with the clock)."""
    # Most environments' rewards are in [0, 1]: fixed bounds make every row's sparkline
    # comparable. A verifiers environment's may not be: its row's scale widens to take them in.
    shown = run.rewards[-SPARK_WIDTH:]
    low, high = min([0.0, *shown]), max([1.0, *shown])
    return {
        "id": run.id,
        "status": Text(run.status, style=STATUS_STYLES.get(run.status, "")),
        "step": format_steps(run.step, run.max_steps),
        "reward": format_reward(run.reward),
        "trend": Text(sparkline(run.rewards, SPARK_WIDTH, low=low, high=high), style="cyan"),
        "tokens": format_count(run.tokens),
    }


class RunsTable(KeyedTable):
    """Runs: id, status, step / max steps, reward and its sparkline, tokens, last update.

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

    def show_runs(self, runs: Sequence[RunView], now: float) -> None:
        self.show_objects(
            {run.id: run for run in runs},
            _still_cells,
            lambda run: {"updated": format_age(run.last_update, now)},
        )

    def on_data_table_row_selected(self, event: KeyedTable.RowSelected) -> None:
        event.stop()
        if event.row_key.value is not None:
            self.post_message(self.RunChosen(event.row_key.value))
