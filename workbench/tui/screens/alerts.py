"""The alerts screen: every alert the supervisor raised (`alerts.jsonl`), newest first, as
`workbench alerts` prints them; `!` or Escape goes back. The main screen's banner says when
there are alerts not yet seen here."""

from __future__ import annotations

import datetime as dt
from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Static

from workbench.files.alerts import Alert
from workbench.tui.data import ExperimentSnapshot
from workbench.tui.widgets.footer import Footer

# Rules whose alerts say training itself went wrong; the others that it may have.
ERROR_RULES = frozenset({"non_finite", "restarts"})


def alerts_table(alerts: tuple[Alert, ...], raised: int) -> Table | Text:
    if not alerts:
        return Text("No alerts: the supervisor raised none for this experiment.", style="dim")
    table = Table(box=None, pad_edge=False, expand=True)
    table.add_column("time", no_wrap=True)
    table.add_column("run", no_wrap=True, max_width=24, overflow="ellipsis")
    table.add_column("rule", no_wrap=True)
    table.add_column("message", ratio=1, overflow="fold")
    for alert in reversed(alerts):
        when = dt.datetime.fromtimestamp(alert.time).strftime("%m-%d %H:%M")
        style = "red" if alert.rule in ERROR_RULES else "yellow"
        table.add_row(
            when, alert.run or alert.process or "-", Text(alert.rule, style), alert.message
        )
    if raised > len(alerts):
        table.caption = f"the newest {len(alerts)} of {raised}: `workbench alerts` lists all"
    return table


class AlertsScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,exclamation_mark", "app.pop_screen", "back"),
    ]

    def compose(self) -> ComposeResult:
        yield Static(Text(" alerts", style="bold"), id="top-bar")
        with VerticalScroll(id="alerts-list"):
            yield Static(id="alerts-table")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self._shown: tuple[tuple[Alert, ...], int] | None = None
        self.watch(self.app, "snapshot", self._show_snapshot)

    def _show_snapshot(self, snapshot: ExperimentSnapshot | None) -> None:
        if snapshot is None:
            return
        shown = (snapshot.alerts, snapshot.alerts_raised)
        if shown != self._shown:  # redraw only when an alert came
            self._shown = shown
            self.query_one("#alerts-table", Static).update(alerts_table(*shown))
