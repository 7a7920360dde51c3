"""The timeline screen: the last minute of every process, a row each, a character a second
coloured by what the process was doing (its busy record, `workbench.files.busy`: the same
activities `workbench trace` writes whole). vLLM's row is seen from the runs' requests, as in
the trace. `t` or Escape goes back; it redraws every second."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Static

from workbench.files import busy, layout
from workbench.files.spans import Span
from workbench.files.trace import inference_spans
from workbench.system.procfs import process_is_alive
from workbench.tui.widgets.footer import Footer

SECONDS = 60  # one character a second
NAME_WIDTH = 14  # 14 + 1 + 60 fits 80 columns

# (character, style, what the legend calls it) by activity; waiting for anything is one.
STARTING = ("~", "blue", "starting")
WAITING = ("·", "bright_black", "waiting")
OTHER = ("#", "white", "other")
ACTIVITIES: dict[str, tuple[str, str, str]] = {
    busy.GENERATION: ("G", "green", "generation"),
    "scoring and writing": ("s", "cyan", "scoring"),
    "update": ("U", "magenta", "train step"),
    "publishing adapters": ("P", "yellow", "publish adapter"),
    "loading adapter": ("L", "yellow", "load adapter"),
}
LEGEND = (*ACTIVITIES.values(), WAITING, STARTING)


def look(label: str, kind: str) -> tuple[str, str, str]:
    if kind == busy.STARTING:
        return STARTING
    if kind == busy.WAITING:
        return WAITING
    return ACTIVITIES.get(label, OTHER)


def timeline_row(intervals: Iterable[busy.Interval], now: float) -> Text:
    """The last `SECONDS` before `now`, a character a second: the activity that covered most
    of that second; blank where nothing is known (before the process started)."""
    cells: list[dict[tuple[str, str, str], float]] = [{} for _ in range(SECONDS)]
    start = now - SECONDS
    for part in busy.clipped(intervals, start, now):
        first, last = int(part.start - start), min(int(part.end - start), SECONDS - 1)
        for cell in range(first, last + 1):
            lo, hi = max(part.start, start + cell), min(part.end, start + cell + 1)
            if hi > lo:
                key = look(part.label, part.kind)
                cells[cell][key] = cells[cell].get(key, 0.0) + hi - lo
    row = Text(no_wrap=True)
    for cell in cells:
        if not cell:
            row.append(" ")
            continue
        char, style, _ = max(cell.items(), key=lambda item: item[1])[0]
        row.append(char, style)
    return row


def process_rows(records: dict[str, busy.BusyRecord], now: float) -> list[tuple[str, Text]]:
    """A row per process: vLLM's first, then the trainer's, then the runs'."""
    intervals = {}
    for name, record in records.items():
        # A running process's activity goes on until now; an ended one's until its last write.
        alive = record.pid is not None and process_is_alive(record.pid)
        intervals[name] = record.intervals_until(now if alive else record.written_at)
    runs = [name for name in intervals if layout.is_run_dir_name(name)]
    requests = [Span(i.label, i.kind, i.start, i.end) for name in runs for i in intervals[name]]
    inference = [busy.Interval(s.label, s.kind, s.start, s.end) for s in inference_spans(requests)]
    ordered = ([busy.INFERENCE] if inference else []) + sorted(
        intervals, key=lambda name: (name != "trainer", name)
    )
    rows = []
    for name in ordered:
        shown = inference if name == busy.INFERENCE else intervals[name]
        rows.append((name, timeline_row(shown, now)))
    return rows


def timeline_text(records: dict[str, busy.BusyRecord], now: float) -> Text:
    rows = process_rows(records, now)
    if not rows:
        return Text("No process has recorded what it does yet.", style="dim")
    text = Text(no_wrap=True)
    text.append(f"{'':{NAME_WIDTH}} -{SECONDS}s{'now':>{SECONDS - 4}}\n", "dim")
    for name, row in rows:
        label = name if len(name) <= NAME_WIDTH else name[: NAME_WIDTH - 1] + "…"
        text.append(f"{label:<{NAME_WIDTH}} ")
        text.append_text(row)
        text.append("\n")
    text.append("\n")
    width = 0
    for char, style, what in LEGEND:
        entry = f"{char} {what}  "
        if width + len(entry) > 78:  # the legend in lines that fit 80 columns
            text.append("\n")
            width = 0
        text.append(char, style)
        text.append(entry[1:])
        width += len(entry)
    return text


class TimelineScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,t", "app.pop_screen", "back"),
    ]

    def __init__(self, experiment: Path, clock: Callable[[], float]) -> None:
        super().__init__()
        self.reader = busy.BusyReader(experiment)
        self.clock = clock

    def compose(self) -> ComposeResult:
        yield Static(Text(" timeline: the last minute of each process", style="bold"), id="top-bar")
        with VerticalScroll(id="timeline"):
            yield Static(id="timeline-rows")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.redraw()
        self.set_interval(1.0, self.redraw)

    def redraw(self) -> None:
        text = timeline_text(self.reader.records(), self.clock())
        self.query_one("#timeline-rows", Static).update(text)
