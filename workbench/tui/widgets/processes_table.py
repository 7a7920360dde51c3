"""The processes table: the supervisor and its children, from `supervisor/state.json`."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.message import Message

from workbench.supervisor.lifecycle import LIVE_STATES
from workbench.system.clock import format_duration
from workbench.tui.data import ProcessView
from workbench.tui.widgets.keyed_table import Cell, ColumnSpec, KeyedTable

STATE_STYLES = {
    "running": "green",
    "ready": "bold green",
    "starting": "yellow",
    "backoff": "bold yellow",
    "stopping": "yellow",
    "exited": "dim",
    "stopped": "dim",
    "failed": "bold red",
    "gone": "bold red",
    # A joined node's states (`workbench.files.nodes`).
    "restarting": "bold yellow",
    "left": "dim",
    "silent": "bold red",
    "not joined": "yellow",
}


def process_cells(process: ProcessView, now: float) -> dict[str, Cell]:
    return {**_still_cells(process), "uptime": format_uptime(process, now)}


def format_uptime(process: ProcessView, now: float) -> str:
    # Only a live process has an uptime.
    live = process.state in LIVE_STATES and process.started_at is not None
    return format_duration(now - process.started_at) if live and process.started_at else "-"


def _still_cells(process: ProcessView) -> dict[str, Cell]:
    """The cells that change only when the process does (not with the clock)."""
    return {
        "name": process.name,
        "state": Text(process.state, style=STATE_STYLES.get(process.state, "")),
        "pid": "-" if process.pid is None else str(process.pid),
        "restarts": str(process.restarts),
        "busy": "-" if process.busy is None else f"{process.busy:.0%}",
        "last_exit": process.last_exit or "",
    }


class ProcessesTable(KeyedTable):
    """Processes: name, state, pid, restarts, uptime, busy (the share of its last minute on
    its own work, so the side that holds the others up shows) and, when there is room, the
    last exit."""

    COLUMNS = (
        ColumnSpec("name", "process"),
        ColumnSpec("state", "state", width=8),
        ColumnSpec("pid", "pid", width=7),
        ColumnSpec("restarts", "restarts", width=8),
        ColumnSpec("uptime", "uptime", width=6),
        ColumnSpec("busy", "busy", width=4),
        ColumnSpec("last_exit", "last exit", width=11, optional=True),
    )

    class ProcessChosen(Message):
        """Enter on a process: follow its log."""

        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

    def show_processes(self, processes: Sequence[ProcessView], now: float) -> None:
        # state.json lists every orchestrator that ever ran: hundreds in a long sweep.
        self.show_objects(
            {process.name: process for process in processes},
            _still_cells,
            lambda process: {"uptime": format_uptime(process, now)},
        )

    def on_data_table_row_selected(self, event: KeyedTable.RowSelected) -> None:
        event.stop()
        if event.row_key.value is not None:
            self.post_message(self.ProcessChosen(event.row_key.value))
