"""The curves screen: every run's reward curve on one chart, or every run's eval curve,
each run in its own colour and named in the legend below.

The curves are those `workbench plot` draws (`workbench.curves`: the same metrics, each run
in the same colour), followed as the runs write them: the reward of each step's batch
(`reward_mean`) and the held-out eval of each policy version scored (`eval_reward_mean`).
`t` switches between the two; `c` or Escape goes back. The chart is the runs' data in
braille dots, readable at 80x24 over SSH.
"""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Static

from workbench.curves import COMPARED_METRICS, EVAL_METRIC, REWARD_METRIC, run_colours
from workbench.tui.data import ExperimentSnapshot, RunView
from workbench.tui.format import format_reward
from workbench.tui.widgets.curves import RunsChart, RunSeries
from workbench.tui.widgets.footer import Footer
from workbench.tui.widgets.runs_table import STATUS_STYLES

SWATCH = "━━"


def run_series(snapshot: ExperimentSnapshot, metric: str) -> tuple[RunSeries, ...]:
    """Every run's curve of `metric` (empty where it has no record yet), in the order of the
    runs table. Colours go by every run, with or without records, so that a run keeps its
    colour when another gets its first point."""
    colours = run_colours([run.id for run in snapshot.runs])
    return tuple(RunSeries(run.id, colours[run.id], _curve(run, metric)) for run in snapshot.runs)


def _curve(run: RunView, metric: str) -> tuple[tuple[int, float], ...]:
    return run.reward_curve if metric == REWARD_METRIC else run.evals


def legend_text(snapshot: ExperimentSnapshot, series: tuple[RunSeries, ...], metric: str) -> Text:
    """One line per run: its colour, id, last value of `metric` and its step, its status."""
    text = Text(no_wrap=True, overflow="ellipsis")
    for index, run in enumerate(series):
        if index:
            text.append("\n")
        text.append(f"{SWATCH} ", style=run.colour)
        text.append(run.run_id, style="bold")
        if run.points:
            step, value = run.points[-1]
            text.append(f"  {format_reward(value)} at step {step}")
        else:
            text.append(f"  no {metric} yet", style="dim")
        view = snapshot.run(run.run_id)
        if view is not None:
            text.append("  ")
            text.append(view.status, style=STATUS_STYLES.get(view.status, ""))
    return text


def curves_top_bar(
    snapshot: ExperimentSnapshot, series: tuple[RunSeries, ...], metric: str
) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(f" {snapshot.experiment.name}  ", style="bold")
    text.append("curves")
    with_records = sum(1 for run in series if run.points)
    text.append(f"  {metric} by step · {with_records} of {len(series)} runs", style="dim")
    return text


class CurvesScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("c,escape", "app.pop_screen", "back"),
        Binding("t", "toggle_metric", "reward/eval"),
    ]

    def __init__(self, metric: str = REWARD_METRIC) -> None:
        super().__init__()
        self.metric = metric
        self.snapshot: ExperimentSnapshot | None = None
        self._shown: dict[str, Text] = {}  # what each Static shows, by id

    def compose(self) -> ComposeResult:
        yield Static(" curves", id="top-bar")
        yield RunsChart("", low=0.0, high=1.0, id="curves-chart")
        with VerticalScroll(id="curves-legend"):
            yield Static("", id="curves-legend-text")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.watch(self.app, "snapshot", self._show_snapshot)

    @property
    def chart(self) -> RunsChart:
        return self.query_one(RunsChart)

    def _show_snapshot(self, snapshot: ExperimentSnapshot | None) -> None:
        if snapshot is None:
            return
        self.snapshot = snapshot
        series = run_series(snapshot, self.metric)
        chart = self.chart
        chart.title = f"{COMPARED_METRICS[self.metric]} by step"
        chart.series = series  # a reactive: redrawn only when a curve changed
        self._update("top-bar", curves_top_bar(snapshot, series, self.metric))
        self._update("curves-legend-text", legend_text(snapshot, series, self.metric))

    def _update(self, static_id: str, text: Text) -> None:
        if self._shown.get(static_id) != text:
            self._shown[static_id] = text
            self.query_one(f"#{static_id}", Static).update(text)

    def action_toggle_metric(self) -> None:
        self.metric = EVAL_METRIC if self.metric == REWARD_METRIC else REWARD_METRIC
        self._show_snapshot(self.snapshot)
