"""The help screen: every key, what it does, and what quitting does (and does not) do."""

from __future__ import annotations

from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS: tuple[tuple[str, str], ...] = (
    ("tab / shift+tab", "move between the runs table, the processes table and the log"),
    ("up / down", "select a row, or scroll the log"),
    ("enter", "runs: open the run's detail; processes: follow its log"),
    ("b", "the leaderboard: runs ranked by the sweep's metric (f: by fitted asymptote); b: back"),
    ("b then a", "every experiment under the same folder, its runs ranked together; a: back"),
    ("c", "every run's reward curve on one chart (t: eval curves); c or esc: back"),
    ("!", "the alerts the supervisor raised, newest first (clears the banner); ! or esc: back"),
    ("t", "the timeline: each process's last minute, a character a second; t or esc: back"),
    ("s", "the selected run's recent samples: prompts, completions, rewards, per group"),
    ("f", "follow the selected run's or process's log"),
    ("e", "evict the selected run (asks for a reason)"),
    ("r", "restart the selected run (or process, with confirmation)"),
    ("a", "add a run (id and key=value overrides)"),
    ("S", "stop everything: every process, gracefully (with confirmation)"),
    ("/", "search the log; n / N: next / previous match; esc: close"),
    ("space", "runs: select the run (●): the curves show the selected runs"),
    ("p", "runs: pin the run on top of the table (▲); p again: unpin"),
    ("/ on the runs", "filter: id text, key=value, key>value (lr>1e-3); esc: clear"),
    ("s on the curves", "smooth the curves (EMA 0.6) and back"),
    ("end / G", "jump to the end of the log and follow it again"),
    ("y", "copy the visible log lines to the clipboard"),
    ("ctrl+r", "re-read the experiment directory now"),
    ("?", "this help"),
    ("q", "quit the TUI: training keeps running; `workbench attach` reopens it"),
    ("v", "runs side by side on one eval's held-out prompts (space ticks runs; [ / ]: step)"),
    ("A", "playground: a prompt to every ticked run's adapter and the base; ctrl+n: a dataset row"),
)


def help_table() -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column()
    for key, what in KEYS:
        table.add_row(key, what)
    return table


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,question_mark", "dismiss", "close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog help"):
            yield Static(Text("Keys", style="bold"), classes="dialog-title")
            yield Static(help_table())
            yield Static(
                Text("The logs on disk survive the TUI: `workbench logs NAME -f`.", style="dim")
            )
