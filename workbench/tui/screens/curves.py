"""The curves screen: the runs' reward curves overlaid on one chart, or their eval curves,
each run in its own colour and named in the legend below.

The runs are the ones selected in the runs table (space), or when none is, every run the
runs filter keeps (`app.plotted_runs()`): every run by default. Each run has the colour
it has in every view (`app.run_colour`, derived from its id).

The curves are those `workbench plot` draws (`workbench.curves`: the same metrics, each run
in the same colour), followed as the runs write them: the reward of each step's batch
(`reward_mean`) and the held-out eval of each policy version scored (`eval_reward_mean`).
`t` switches between the two; `s` smooths the curves (an exponential moving average,
TensorBoard's, weight `SMOOTHING`, debiased so the first points are not pulled toward 0)
and back; `c` or Escape goes back. The legend gives each run's last recorded value,
smoothed or not. The chart is the runs' data in
braille dots, readable at 80x24 over SSH.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Static

from workbench.curves import COMPARED_METRICS, EVAL_METRIC, REWARD_METRIC, RunColours
from workbench.tui.data import ExperimentSnapshot, RunView
from workbench.tui.format import format_reward
from workbench.tui.widgets.curves import RunsChart, RunSeries
from workbench.tui.widgets.footer import Footer
from workbench.tui.widgets.runs_table import STATUS_STYLES

SWATCH = "━━"
SMOOTHING = 0.6  # the EMA's weight of the past: TensorBoard's default


def run_series(
    snapshot: ExperimentSnapshot,
    metric: str,
    run_ids: Sequence[str] | None = None,
    colour: Callable[[str], str] | None = None,
) -> tuple[RunSeries, ...]:
    """The curve of `metric` of each of `run_ids` (every run if None; empty where a run has
    no record yet), in their order, each in its `colour` (by default derived from its id)."""
    if colour is None:
        colour = RunColours().colour
    ids = [run.id for run in snapshot.runs] if run_ids is None else run_ids
    views = [view for view in map(snapshot.run, ids) if view is not None]
    return tuple(RunSeries(run.id, colour(run.id), _curve(run, metric)) for run in views)


def ema(points: Sequence[tuple[int, float]], weight: float) -> tuple[tuple[int, float], ...]:
    """`points` smoothed by an exponential moving average giving `weight` to the past,
    debiased (divided by 1 - weight^n) so the first points are their own mean, not pulled
    toward 0; a NaN point is skipped (it stays NaN, the average goes on without it)."""
    out = []
    average, total_weight = 0.0, 0.0
    for step, value in points:
        if math.isnan(value):
            out.append((step, value))
            continue
        average = average * weight + (1 - weight) * value
        total_weight = total_weight * weight + (1 - weight)
        out.append((step, average / total_weight))
    return tuple(out)


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
    snapshot: ExperimentSnapshot,
    series: tuple[RunSeries, ...],
    metric: str,
    which: str = "",
    smoothed: bool = False,
) -> Text:
    """The experiment, the metric, how many of the runs shown have records, which runs
    they are (`which`: "selected", "filtered" or "" for every run), and the smoothing."""
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(f" {snapshot.experiment.name}  ", style="bold")
    text.append("curves")
    with_records = sum(1 for run in series if run.points)
    runs = f"{which} runs" if which else "runs"
    text.append(f"  {metric} by step · {with_records} of {len(series)} {runs}", style="dim")
    if smoothed:
        text.append(f" · EMA {SMOOTHING}", style="dim")
    return text


class CurvesScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("c,escape", "app.pop_screen", "back"),
        Binding("t", "toggle_metric", "reward/eval"),
        Binding("s", "toggle_smoothing", "smooth"),
    ]

    def __init__(self, metric: str = REWARD_METRIC) -> None:
        super().__init__()
        self.metric = metric
        self.snapshot: ExperimentSnapshot | None = None
        self._shown: dict[str, Text] = {}  # what each Static shows, by id
        self.smoothed = False
        # Each run's curve and its smoothing, as last made: a curve that is the very tuple
        # of the last poll is not smoothed again.
        self._smoothings: dict[str, tuple[tuple[tuple[int, float], ...], tuple]] = {}

    def compose(self) -> ComposeResult:
        yield Static(" curves", id="top-bar")
        yield RunsChart("", low=0.0, high=1.0, id="curves-chart")
        with VerticalScroll(id="curves-legend"):
            yield Static("", id="curves-legend-text")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.watch(self.app, "snapshot", self._show_snapshot)
        self.watch(self.app, "selection_version", self._selection_changed, init=False)

    @property
    def chart(self) -> RunsChart:
        return self.query_one(RunsChart)

    def _show_snapshot(self, snapshot: ExperimentSnapshot | None) -> None:
        if snapshot is None:
            return
        self.snapshot = snapshot
        app = self.app
        series = run_series(snapshot, self.metric, app.plotted_runs(), app.run_colour)  # type: ignore[attr-defined]
        chart = self.chart
        chart.title = f"{COMPARED_METRICS[self.metric]} by step"
        chart.series = self._smoothed(series)  # a reactive: redrawn only when a curve changed
        top_bar = curves_top_bar(snapshot, series, self.metric, self._which(), self.smoothed)
        self._update("top-bar", top_bar)
        self._update("curves-legend-text", legend_text(snapshot, series, self.metric))

    def _update(self, static_id: str, text: Text) -> None:
        if self._shown.get(static_id) != text:
            self._shown[static_id] = text
            self.query_one(f"#{static_id}", Static).update(text)

    def _which(self) -> str:
        selection = self.app.run_selection  # type: ignore[attr-defined]
        if self.app.selected_runs():  # type: ignore[attr-defined]
            return "selected"
        return "filtered" if selection.filter is not None else ""

    def _smoothed(self, series: tuple[RunSeries, ...]) -> tuple[RunSeries, ...]:
        if not self.smoothed:
            return series
        smoothings = {}
        out = []
        for run in series:
            known = self._smoothings.get(run.run_id)
            if known is None or known[0] is not run.points:
                known = (run.points, ema(run.points, SMOOTHING))
            smoothings[run.run_id] = known
            out.append(RunSeries(run.run_id, run.colour, known[1]))
        self._smoothings = smoothings
        return tuple(out)

    def _selection_changed(self) -> None:
        self._show_snapshot(self.snapshot)

    def action_toggle_smoothing(self) -> None:
        self.smoothed = not self.smoothed
        self._smoothings = {}
        self._show_snapshot(self.snapshot)

    def action_toggle_metric(self) -> None:
        self.metric = EVAL_METRIC if self.metric == REWARD_METRIC else REWARD_METRIC
        self._show_snapshot(self.snapshot)
