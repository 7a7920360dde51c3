"""Runs side by side on the same held-out prompts (`v`): what `workbench samples --compare`
prints, for the runs ticked in the list on the left.

A row per prompt of one eval step (the newest every ticked run has; `[` / `]` move between
the steps they share), a column per run with its reward and completion; under the table,
the highlighted prompt with each run's whole completion. Space ticks a run in the list
(tab moves between the list and the table); the runs with evals are ticked at first. The files are read again when the app's poll
finds one changed. Escape goes back.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, SelectionList, Static

from workbench.experiment import RunRef
from workbench.files import layout
from workbench.side_by_side import SideBySide, SideBySideError, side_by_side
from workbench.tui.widgets.footer import Footer

CELL_CHARS = 40  # a completion's first characters in the table; the whole one below it


class SideBySideScreen(Screen[None]):
    # Here, not in workbench.tcss: the screen's layout is its own.
    DEFAULT_CSS = """
    #sbs-top { height: 1fr; }
    #sbs-runs { width: 22; border: round $primary; }
    #sbs-table { width: 1fr; border: round $primary; }
    #sbs-detail { height: 7; border: round $primary; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,backspace", "app.pop_screen", "back"),
        Binding("left_square_bracket", "older", "older step", priority=True),
        Binding("right_square_bracket", "newer", "newer step", priority=True),
    ]

    def __init__(self, experiment: Path) -> None:
        super().__init__()
        self.experiment = experiment
        self.compared: SideBySide | None = None
        self.step: int | None = None  # None: the newest step the ticked runs share
        self._stamp: tuple | None = None

    def compose(self) -> ComposeResult:
        yield Static(" side by side", id="top-bar")
        with Horizontal(id="sbs-top"):
            runs = SelectionList[str](id="sbs-runs")
            runs.border_title = "runs (space)"
            yield runs
            table = DataTable(id="sbs-table", cursor_type="row", zebra_stripes=True)
            table.border_title = "held-out prompts"
            yield table
        with VerticalScroll(id="sbs-detail"):
            yield Static("", id="sbs-prompt")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        runs = self.query_one(SelectionList)
        for path in layout.list_run_dirs(self.experiment):
            # Ticked at first: the runs with an eval to show.
            evaluated = layout.eval_samples_path(path).is_file()
            runs.add_option((path.name, path.name, evaluated))
        self.query_one(DataTable).focus()
        self.watch(self.app, "snapshot", lambda _: self.refresh_view())

    @property
    def ticked(self) -> list[str]:
        return list(self.query_one(SelectionList).selected)

    def on_selection_list_selected_changed(self) -> None:
        self._stamp = None
        self.refresh_view()

    def refresh_view(self) -> None:
        """Read the runs' evals again if a file changed (or the ticked runs did)."""
        stamp = (tuple(self.ticked), self.step, *map(_stamp_of, self.ticked_paths()))
        if stamp == self._stamp:
            return
        self._stamp = stamp
        refs = [RunRef(self.experiment, run_id) for run_id in self.ticked]
        try:
            self.compared = side_by_side(refs, self.step) if refs else None
            problem = None if refs else "tick runs in the list (space) to compare them"
        except SideBySideError as err:
            self.compared, problem = None, str(err)
        self._show(problem)

    def ticked_paths(self) -> list[Path]:
        return [layout.eval_samples_path(self.experiment / run_id) for run_id in self.ticked]

    def _show(self, problem: str | None) -> None:
        table = self.query_one(DataTable)
        table.clear(columns=True)
        bar = Text(" side by side  ", style="bold", no_wrap=True, overflow="ellipsis")
        if self.compared is None:
            bar.append(problem or "", style="yellow")
            self.query_one("#top-bar", Static).update(bar)
            self.query_one("#sbs-prompt", Static).update("")
            return
        compared = self.compared
        bar.append(f"held-out eval of step {compared.step}  ")
        bar.append(f"steps shared: {', '.join(map(str, self._shared_steps()))}", style="dim")
        self.query_one("#top-bar", Static).update(bar)
        table.add_column("#", key="index")
        table.add_column("prompt", key="prompt")
        for run in compared.runs:
            evaluated = run.eval_of(compared.step)
            rewards = [p.reward for p in evaluated.prompts] if evaluated else []
            mean = sum(rewards) / len(rewards) if rewards else 0.0
            table.add_column(f"{run.label} {mean:.2f}", key=run.label)
        for i, row in enumerate(compared.rows):
            cells = [_cell(cell) for cell in row.cells]
            table.add_row(str(i + 1), row.prompt[:CELL_CHARS], *cells, key=str(i))
        self._show_prompt()

    def _shared_steps(self) -> list[int]:
        if self.compared is None:
            return []
        runs = self.compared.runs
        return sorted(set(runs[0].versions).intersection(*(r.versions for r in runs[1:])))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_prompt()

    def _show_prompt(self) -> None:
        if self.compared is None or not self.compared.rows:
            return
        row_index = self.query_one(DataTable).cursor_row
        if not 0 <= row_index < len(self.compared.rows):
            return
        row = self.compared.rows[row_index]
        text = Text()
        text.append("prompt ", style="bold")
        text.append(row.prompt)
        text.append("\nanswer ", style="bold")
        text.append(row.answer)
        for run, cell in zip(self.compared.runs, row.cells, strict=True):
            text.append(f"\n{run.label} ", style="bold cyan")
            if cell is None:
                text.append("not asked this prompt", style="dim")
                continue
            text.append(f"{cell.reward:.2f} ")
            for completion in cell.completions:
                text.append(completion.text.replace("\n", "⏎"))
                if completion.truncated:
                    text.append(" [cut at max_tokens]", style="yellow")
        self.query_one("#sbs-prompt", Static).update(text)

    def _move(self, offset: int) -> None:
        steps = self._shared_steps()
        if self.compared is None or not steps:
            return
        position = steps.index(self.compared.step) + offset
        if 0 <= position < len(steps):
            self.step = steps[position] if position < len(steps) - 1 else None
            self.refresh_view()

    def action_older(self) -> None:
        self._move(-1)

    def action_newer(self) -> None:
        self._move(1)


def _cell(cell) -> Text:
    if cell is None:
        return Text("-", style="dim")
    first = cell.completions[0].text.replace("\n", "⏎") if cell.completions else ""
    style = "green" if cell.reward >= 1 else "red" if cell.reward <= 0 else ""
    text = Text(f"{cell.reward:.2f} ", style=style)
    text.append(first[:CELL_CHARS])
    return text


def _stamp_of(path: Path) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return (stat.st_mtime_ns, stat.st_size)
