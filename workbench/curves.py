"""Every run's curves, read from its metrics.jsonl, and drawn side by side with matplotlib.

The one owner of reading a metric's curve and of drawing runs on one chart.

Reading: `MetricCurve` takes records one at a time (the TUI follows each metrics.jsonl as
it grows, early stopping's ranking reads the same way), `metric_curve` a list of them;
`experiment_panels` reads every run of an experiment, `run_panels` any runs (of several
experiments: `workbench.sweep.compare`). Any record may carry a metric: eval
records carry `eval_reward_mean`, the orchestrator's `reward_mean`. Reading needs no
matplotlib.

Drawing: `workbench plot` (every run's reward curve and, where it has evals, its eval
curve; of one experiment or several), `workbench sweep report` (every run's eval curve), `bench e2e` (reward against
wall-clock time) and `bench sweep` all draw through `draw` or `draw_panel`, on a `Figure`
with its own Agg canvas, never pyplot, so no global backend and no display are involved
(SSH, CI). Each run keeps one colour in every panel, and the legend names it once. The
TUI draws the same curves in the terminal (`workbench.tui.widgets.curves`).
"""

from __future__ import annotations

import colorsys
import io
import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.files import layout
from workbench.files.metrics import read_metrics

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Points = list[tuple[int, float]]  # (step, value), by step

REWARD_METRIC = "reward_mean"  # the orchestrator's mean reward of each step's batch
EVAL_METRIC = "eval_reward_mean"  # the held-out score of each policy version evaluated
# What a chart of every run shows, and what to call each: `workbench plot`'s panels, the
# TUI's curves screen.
COMPARED_METRICS = {
    REWARD_METRIC: f"{REWARD_METRIC} (training batch)",
    EVAL_METRIC: f"{EVAL_METRIC} (held-out prompts)",
}
# matplotlib's tab10 and tab20, written out so that the TUI draws each run in the colour
# `workbench plot` gives it, without matplotlib.
TAB10 = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip
TAB20 = (
    "#1f77b4", "#aec7e8", "#ff7f0e", "#ffbb78", "#2ca02c", "#98df8a", "#d62728",
    "#ff9896", "#9467bd", "#c5b0d5", "#8c564b", "#c49c94", "#e377c2", "#f7b6d2",
    "#7f7f7f", "#c7c7c7", "#bcbd22", "#dbdb8d", "#17becf", "#9edae5",
)  # fmt: skip


class NothingToPlot(Exception):
    """No run has a point to draw yet (the message says which experiment)."""


@dataclass(frozen=True)
class Line:
    run_id: str  # picks the colour: the same run has the same colour in every panel
    points: Sequence[tuple[float, float]]  # (x, value): x is a step, or seconds
    label: str = ""  # default: the run id
    dashed: bool = False


@dataclass(frozen=True)
class Panel:
    ylabel: str
    lines: list[Line]
    markers: bool = False  # for sparse curves (evals), so a lone point shows
    xlabel: str = "step"
    ylim: tuple[float, float] | None = None
    title: str | None = None


# ---------------------------------------------------------------- reading


class MetricCurve:
    """(step, value) of the records holding a finite `metric`, by step; fed one record at
    a time. A step recorded twice (a step retried, an eval redone after a restart) keeps
    the value written last."""

    def __init__(self, metric: str) -> None:
        self.metric = metric
        self._by_step: dict[int, float] = {}

    def add(self, record: dict[str, Any]) -> bool:
        """Take `record`'s value of the metric, if it has one; True if it did."""
        value, step = record.get(self.metric), record.get("step")
        if not (
            isinstance(step, int)
            and isinstance(value, int | float)
            and not isinstance(value, bool)
            and math.isfinite(value)
        ):
            return False
        self._by_step[step] = float(value)
        return True

    def points(self) -> Points:
        return sorted(self._by_step.items())


def metric_curve(records: list[dict[str, Any]], metric: str) -> Points:
    """The `MetricCurve` of `records`."""
    curve = MetricCurve(metric)
    for record in records:
        curve.add(record)
    return curve.points()


def experiment_panels(experiment: Path) -> list[Panel]:
    """Every run's reward curve; a second panel of eval curves once any run has one."""
    panels = run_panels([(run.name, run) for run in layout.list_run_dirs(experiment)])
    if not any(panel.lines for panel in panels):
        raise NothingToPlot(
            f"no run of {experiment} has a reward or eval record in its metrics.jsonl yet"
        )
    return panels


def run_panels(
    runs: Sequence[tuple[str, Path]], title: str | None = None, *, eval_panel: bool = False
) -> list[Panel]:
    """The reward curve of each (name, run directory), and a second panel of eval curves
    once any run has one (always, with `eval_panel`). Each line is named, and coloured,
    by its run's name."""
    rewards, evals = [], []
    for name, run in runs:
        records = read_metrics(run)
        reward = metric_curve(records, REWARD_METRIC)
        scored = metric_curve(records, EVAL_METRIC)
        if reward:
            rewards.append(Line(name, reward))
        if scored:
            evals.append(Line(name, scored))
    panels = [Panel(COMPARED_METRICS[REWARD_METRIC], rewards, title=title)]
    if evals or eval_panel:
        panels.append(Panel(COMPARED_METRICS[EVAL_METRIC], evals, markers=True, title=title))
    return panels


# ---------------------------------------------------------------- drawing


def draw(
    panels: list[Panel], title: str, run_ids: Sequence[str] = (), columns: int | None = None
) -> Figure:
    """The panels side by side (in rows of `columns`, by default all in one), every run in
    its own colour, one legend on the right. `run_ids`, every run in order, gives each its
    colour whether or not it has a line (as the TUI does); by default the runs of the lines
    do.

    Raises ImportError without matplotlib.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    columns = columns or len(panels)
    rows = -(-len(panels) // columns)
    figure = Figure(figsize=(6 * columns + 2, 5 * rows), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes_list = list(figure.subplots(rows, columns, squeeze=False).flat)
    for unused in axes_list[len(panels) :]:
        unused.set_visible(False)
    axes_list = axes_list[: len(panels)]
    colours = run_colours([*run_ids, *(line.run_id for panel in panels for line in panel.lines)])
    legend: dict[str, Any] = {}
    for axes, panel in zip(axes_list, panels, strict=True):
        for label, drawn in draw_panel(axes, panel, colours).items():
            legend.setdefault(label, drawn)
    figure.suptitle(title)
    if legend:
        figure.legend(
            list(legend.values()),
            list(legend),
            loc="outside right upper",
            fontsize="small",
            ncols=1 if len(legend) <= 20 else 2,
        )
    return figure


def draw_panel(axes: Any, panel: Panel, colours: dict[str, str]) -> dict[str, Any]:
    """`panel` on matplotlib `axes`, each line in its run's colour (`run_colours`); returns
    the drawn lines by legend label, for the caller to place a legend."""
    drawn_by_label: dict[str, Any] = {}
    for line in panel.lines:
        steps, values = zip(*line.points, strict=True) if line.points else ((), ())
        label = line.label or line.run_id
        (drawn,) = axes.plot(
            steps,
            values,
            color=colours[line.run_id],
            linestyle="--" if line.dashed else "-",
            marker="o" if panel.markers else None,
            markersize=3,
            label=label,
        )
        drawn_by_label.setdefault(label, drawn)
    axes.set_xlabel(panel.xlabel)
    axes.set_ylabel(panel.ylabel)
    if panel.title:
        axes.set_title(panel.title)
    if panel.ylim is not None:
        axes.set_ylim(*panel.ylim)
    axes.grid(alpha=0.3)
    return drawn_by_label


def image_bytes(figure: Figure, image_format: str = "png") -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format=image_format)
    return buffer.getvalue()


def save(figure: Figure, path: Path) -> None:
    """Write the figure atomically, in the format its file name ends with."""
    layout.atomic_write_bytes(path, image_bytes(figure, image_format(path)))


def image_format(path: Path) -> str:
    """The format `path`'s suffix names; ValueError (naming the formats) for any other."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    supported = FigureCanvasAgg.get_supported_filetypes()
    suffix = path.suffix.lower().lstrip(".")
    if suffix not in supported:
        raise ValueError(
            f"{path}: cannot tell the image format from its name; end it with "
            f"{', '.join('.' + name for name in sorted(supported))}"
        )
    return suffix


def run_colours(run_ids: list[str]) -> dict[str, str]:
    """A colour per run ("#rrggbb"), derived from its id (`RunColours`): the same run has
    the same colour in every figure and in the TUI, whichever runs are beside it."""
    return RunColours().assign(run_ids)


class RunColours:
    """Each run's colour, derived from its id and kept once given.

    A run's id hashes (crc32: the same in every process, unlike `hash`) to one of tab10's
    ten colours; if another run already has it, the next free one of tab10, then of
    tab20's ten lighter shades; beyond twenty runs, a hue from the hash (two may then
    look alike). Runs given colours together are taken in sorted order, so a set of runs
    gets the same colours wherever it is drawn; a run added later takes a free colour and
    no run's colour ever changes.
    """

    def __init__(self) -> None:
        self._given: dict[str, str] = {}

    def assign(self, run_ids: Sequence[str]) -> dict[str, str]:
        """The colour of each of `run_ids`, giving one to each run without one."""
        for run_id in sorted(set(run_ids) - self._given.keys()):
            self._given[run_id] = self._free_colour(run_id)
        return {run_id: self._given[run_id] for run_id in run_ids}

    def colour(self, run_id: str) -> str:
        if run_id not in self._given:
            self._given[run_id] = self._free_colour(run_id)
        return self._given[run_id]

    def _free_colour(self, run_id: str) -> str:
        digest = zlib.crc32(run_id.encode())
        taken = set(self._given.values())
        for palette in (TAB10, TAB20[1::2]):
            for offset in range(len(palette)):
                colour = palette[(digest + offset) % len(palette)]
                if colour not in taken:
                    return colour
        rgb = colorsys.hsv_to_rgb((digest % 360) / 360, 0.65, 0.95)
        return "#" + "".join(f"{round(c * 255):02x}" for c in rgb)


def experiment_figure(experiment: Path) -> Figure:
    """`workbench plot`: every run's reward and eval curves (NothingToPlot without any)."""
    run_ids = [run.name for run in layout.list_run_dirs(experiment)]
    return draw(experiment_panels(experiment), f"{experiment.name}: every run by step", run_ids)
