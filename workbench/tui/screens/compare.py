"""The all-experiments screen: every run of every experiment beside this one, ranked
together as `workbench compare` ranks them, read-only.

Opened with `a` from the leaderboard; `a` or Escape goes back. The experiments are those
under this experiment's parent folder (`./outputs` for an experiment `workbench up` made).
The runs are ranked in groups of one base model and one environment
(`workbench.sweep.compare`); a group letter marks each row, and the top lines name each
group and say why they are apart. Below the table, the selected run in full: its
experiment, value, lineage and the values that differ between the runs of its group.

Nothing here evicts or restarts: the runs of other experiments belong to their own
supervisors. The files are read in a worker thread, again every `REFRESH_SECONDS`.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import DataTable, Static

from workbench.experiment import find_experiments
from workbench.sweep.compare import ComparedRun, Comparison, compare_experiments
from workbench.sweep.values import describe_values
from workbench.tui.widgets.footer import Footer
from workbench.tui.widgets.keyed_table import Cell, ColumnSpec, KeyedTable
from workbench.tui.widgets.leaderboard_table import format_metric

REFRESH_SECONDS = 10.0


def group_letter(index: int) -> str:
    letters = string.ascii_uppercase
    return letters[index] if index < len(letters) else str(index + 1)


def row_key(run: ComparedRun) -> str:
    return f"{run.experiment_label}/{run.outcome.id}"


def run_state(run: ComparedRun) -> str:
    if run.outcome.diverged:
        return "diverged"
    return "early-stop" if run.outcome.evicted_by_scheduler else ""


def compare_cells(letter: str, run: ComparedRun) -> dict[str, Cell]:
    outcome = run.outcome
    return {
        "group": letter,
        "rank": Text(str(outcome.rank), style="bold" if outcome.rank == 1 else ""),
        "id": row_key(run),
        "value": format_metric(outcome.value),
        "value_step": "-" if outcome.eval_step is None else str(outcome.eval_step),
        "state": Text(run_state(run), style="bold red" if outcome.diverged else "magenta"),
        "from": Text(run.describe_lineage() or "-", no_wrap=True, overflow="ellipsis"),
        "values": Text(
            describe_values(outcome.differences) or "-", no_wrap=True, overflow="ellipsis"
        ),
    }


def comparison_top_text(parent: Path, comparison: Comparison) -> Text:
    order = "highest" if comparison.mode == "max" else "lowest"
    runs = sum(len(group.runs) for group in comparison.groups)
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(f" all experiments under {parent}  ", style="bold")
    text.append(
        f"{len(comparison.experiments)} experiments · {runs} runs · "
        f"{comparison.metric}, {order} first · read-only",
        style="dim",
    )
    for index, group in enumerate(comparison.groups):
        text.append(f"\n {group_letter(index)}: {group.base_model} · {group.env}")
        text.append(f"  ({', '.join(group.experiments)})", style="dim")
    apart = comparison.apart_reason()
    if apart:
        text.append(f"\n {apart}", style="yellow")
    for note in comparison.notes:
        text.append(f"\n note: {note}", style="dim")
    return text


def selected_text(run: ComparedRun, comparison: Comparison) -> Text:
    outcome = run.outcome
    text = Text()
    text.append(f"#{outcome.rank} {outcome.id}", style="bold")
    text.append(f"  of {run.experiment}  step {outcome.step}")
    text.append(f"\n{comparison.metric} {format_metric(outcome.value)}")
    if outcome.eval_step is not None:
        text.append(f" at step {outcome.eval_step}")
    state = run_state(run)
    if state:
        text.append(f" · {state}")
    text.append("\nfrom: ", style="bold")
    text.append(run.describe_lineage() or "a fresh start (not forked)")
    text.append("\ndiffers: ", style="bold")
    text.append(describe_values(outcome.differences) or "nothing: the runs of its group agree")
    if outcome.note:
        text.append(f"\nnote: {outcome.note}", style="dim")
    return text


class CompareTable(KeyedTable):
    """Group, rank within it, experiment/run, the metric and its step, the state, the
    lineage and the values that differ (as much as fits; the screen shows the whole)."""

    COLUMNS = (
        ColumnSpec("group", "g", width=1),
        ColumnSpec("rank", "#", width=3),
        ColumnSpec("id", "experiment/run"),
        ColumnSpec("value", "value", width=7),
        ColumnSpec("value_step", "@step", width=5),
        ColumnSpec("state", "state", width=len("early-stop"), optional=True),
        ColumnSpec("from", "from", width=12, optional=True),
        ColumnSpec("values", "differs", width=7, fill=True),
    )

    def on_data_table_row_selected(self, event: KeyedTable.RowSelected) -> None:
        event.stop()  # the runs of other experiments have no detail screen here


class CompareScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("a,escape", "app.pop_screen", "back"),
    ]

    def __init__(self, experiment: Path) -> None:
        super().__init__()
        # As the user named it (`outputs`), unless the experiment was named as `.`.
        self.parent_folder = experiment.parent if experiment.name else experiment.resolve().parent
        self.comparison: Comparison | None = None
        self._runs: dict[str, ComparedRun] = {}

    def compose(self) -> ComposeResult:
        yield Static(f" all experiments under {self.parent_folder}: reading…", id="compare-top")
        table = CompareTable(id="compare-table")
        table.border_title = "runs of every experiment"
        yield table
        yield Static("", id="compare-selected")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one(CompareTable).focus()
        self.read_comparison()
        self.set_interval(REFRESH_SECONDS, self.read_comparison)

    @work(thread=True, exclusive=True, group="compare", exit_on_error=False)
    def read_comparison(self) -> None:
        try:
            comparison = compare_experiments(find_experiments(self.parent_folder))
        except (OSError, ValueError) as err:
            # Another experiment's files are not this TUI's to fail on: say so, try again.
            message = f" all experiments under {self.parent_folder}: cannot read them: {err}"
            self.app.call_from_thread(self._show_top, Text(message, style="red"))
            return
        self.app.call_from_thread(self.show_comparison, comparison)

    def _show_top(self, text: Text) -> None:
        self.query_one("#compare-top", Static).update(text)

    def show_comparison(self, comparison: Comparison) -> None:
        self.comparison = comparison
        rows: dict[str, dict[str, Cell]] = {}
        self._runs = {}
        for index, group in enumerate(comparison.groups):
            for run in group.runs:
                rows[row_key(run)] = compare_cells(group_letter(index), run)
                self._runs[row_key(run)] = run
        self._show_top(comparison_top_text(self.parent_folder, comparison))
        table = self.query_one(CompareTable)
        table.border_title = f"runs by {comparison.metric}, ranked within each group"
        table.show_rows(rows)
        self._show_selected()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_selected()

    def _show_selected(self) -> None:
        key = self.query_one(CompareTable).selected_key
        run = self._runs.get(key or "")
        selected = self.query_one("#compare-selected", Static)
        if run is None or self.comparison is None:
            selected.update(Text("no runs yet", style="dim italic"))
            return
        selected.update(selected_text(run, self.comparison))
