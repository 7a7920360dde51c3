"""Text plots of curves: braille line charts for the run detail and the curves screen.

Each terminal cell holds a 2x4 grid of braille dots, so a 60x8 cell chart plots 120 x 32
points: enough to read the shape of a reward curve over SSH without any plotting library.
`BrailleCanvas` and `braille_plot` are pure; `CurveChart` is the widget around them, one
point per record; `StepCurveChart` plots (step, value) points against their steps (eval
records come every few steps, and not always evenly: the last step is scored too);
`RunsChart` plots several runs' (step, value) curves on one step axis, each in its colour.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rich.text import Text
from textual.app import RenderResult
from textual.reactive import reactive
from textual.widget import Widget

_BRAILLE_BASE = 0x2800
# Bit of the dot at (column, row) within one braille cell, rows counted from the top.
_DOT_BITS = ((0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80))
# A runs chart's value axis: the curves' range, this share of it wider each side.
AXIS_PAD = 0.1
MIN_AXIS_PAD = 0.01
AXIS_WIDTH = 10  # a label of up to 9 cells (e.g. -1.235e+04), then the axis line


def resample(values: Sequence[float], points: int) -> list[float]:
    """`points` values spanning the series: bucket means when shrinking, linear when stretching."""
    count = len(values)
    if count == 0 or points <= 0:
        return []
    if count == 1:
        return [values[0]] * points
    if count >= points:
        out = []
        for i in range(points):
            start = i * count // points
            end = max(start + 1, (i + 1) * count // points)
            bucket = values[start:end]
            out.append(sum(bucket) / len(bucket))
        return out
    out = []
    for i in range(points):
        position = i * (count - 1) / (points - 1) if points > 1 else 0.0
        left = int(position)
        right = min(left + 1, count - 1)
        fraction = position - left
        out.append(values[left] * (1 - fraction) + values[right] * fraction)
    return out


def resample_by_step(points: Sequence[tuple[int, float]], count: int) -> list[float]:
    """`count` values at evenly spaced steps from the first point's to the last's, linear
    between the points: a point 10 steps after the one before sits 10 steps further right."""
    if not points or count <= 0:
        return []
    first, last = points[0][0], points[-1][0]
    if count == 1 or first == last:
        return [points[-1][1]] * count
    out = []
    index = 0
    for i in range(count):
        step = first + (last - first) * i / (count - 1)
        while index < len(points) - 2 and points[index + 1][0] < step:
            index += 1
        (left_step, left), (right_step, right) = points[index], points[index + 1]
        fraction = (step - left_step) / (right_step - left_step) if right_step > left_step else 1.0
        out.append(left + (right - left) * min(1.0, max(0.0, fraction)))
    return out


class BrailleCanvas:
    """`width` x `height` cells of braille dots. Each cell takes the colour of the last
    series that put a dot in it: where curves cross, the one drawn last shows."""

    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = max(0, width), max(0, height)
        self.dots_x, self.dots_y = self.width * 2, self.height * 4
        self._bits = [[0] * self.width for _ in range(self.height)]
        self._owners = [[-1] * self.width for _ in range(self.height)]

    def draw_line(
        self, columns: Iterable[tuple[int, float]], low: float, high: float, series: int = 0
    ) -> None:
        """A connected line through (dot column, value) points, columns in order, values
        scaled from [low, high] to the canvas's height."""
        span = high - low if high > low else 1.0
        previous: int | None = None
        for x, value in columns:
            if math.isnan(value) or not 0 <= x < self.dots_x:
                continue
            scaled = (value - low) / span * (self.dots_y - 1)
            y = self.dots_y - 1 - min(self.dots_y - 1, max(0, round(scaled)))
            # Fill from the previous column's height so a steep change stays connected.
            top, bottom = (y, y) if previous is None else (min(y, previous), max(y, previous))
            for row in range(top, bottom + 1):
                self._bits[row // 4][x // 2] |= _DOT_BITS[x % 2][row % 4]
                self._owners[row // 4][x // 2] = series
            previous = y

    def rows(self) -> list[str]:
        return ["".join(chr(_BRAILLE_BASE + bits) for bits in line) for line in self._bits]

    def styled_rows(self, styles: Sequence[str]) -> list[Text]:
        """Each row as text, every cell in the style of the series that owns it."""
        out = []
        for bits_row, owners in zip(self._bits, self._owners, strict=True):
            line = Text(no_wrap=True)
            for bits, owner in zip(bits_row, owners, strict=True):
                line.append(chr(_BRAILLE_BASE + bits), style=styles[owner] if owner >= 0 else "")
            out.append(line)
        return out


def braille_plot(
    values: Sequence[float], width: int, height: int, low: float, high: float
) -> list[str]:
    """`height` rows of `width` braille characters drawing `values` as a connected line."""
    if width <= 0 or height <= 0:
        return []
    canvas = BrailleCanvas(width, height)
    values = [v for v in values if not math.isnan(v)]
    canvas.draw_line(enumerate(resample(values, canvas.dots_x)), low, high)
    return canvas.rows()


def step_columns(
    points: Sequence[tuple[int, float]], dots: int, first: int, last: int
) -> list[tuple[int, float]]:
    """(dot column, value) of `points` on a step axis from `first` to `last`, `dots` columns
    wide: the columns from the first point's step to the last's, linear between points."""
    if not points or dots <= 0:
        return []
    if last <= first:
        return list(enumerate(resample_by_step(points, dots)))
    start = round((points[0][0] - first) / (last - first) * (dots - 1))
    end = round((points[-1][0] - first) / (last - first) * (dots - 1))
    return list(zip(range(start, end + 1), resample_by_step(points, end - start + 1), strict=True))


def _append_axis_rows(text: Text, rows: Sequence[Text], low: float, high: float) -> None:
    """The plot's rows after a left axis labelled with `high` at the top, `low` below."""
    for index, line in enumerate(rows):
        if index == 0:
            label = _axis_label(high)
        elif index == len(rows) - 1:
            label = _axis_label(low)
        else:
            label = ""
        text.append(label[: AXIS_WIDTH - 1].rjust(AXIS_WIDTH - 1) + "│", style="dim")
        text.append_text(line)
        if index < len(rows) - 1:
            text.append("\n")


def _append_step_axis(text: Text, first: int, last: int, width: int) -> None:
    """The first and last step under a plot `width` cells wide."""
    first_label = f"step {first}"
    text.append("\n" + " " * AXIS_WIDTH + first_label, style="dim")
    text.append(str(last).rjust(width - len(first_label)), style="dim")


class CurveChart(Widget):
    """A titled line chart of one series, with its range on a left axis: the values' own
    range, a little wider (`padded_range`), kept within [low, high] where those are given
    unless a value lies outside them."""

    # No wrapping: a title longer than the chart is cut, not pushed onto the plot's rows.
    DEFAULT_CSS = """
    CurveChart { height: 10; text-wrap: nowrap; text-overflow: clip; }
    """

    title: reactive[str] = reactive("", always_update=False)
    values: reactive[tuple[float, ...]] = reactive((), always_update=False)
    line_style = "cyan"

    def __init__(
        self,
        title: str,
        *,
        low: float | None = None,
        high: float | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(id=id, classes=classes)
        self.title = title
        self.fixed_low = low
        self.fixed_high = high

    def render(self) -> RenderResult:
        values = [v for v in self.values if not math.isnan(v)]
        width = max(1, self.size.width - AXIS_WIDTH)
        rows = max(1, self.size.height - 1)
        text = Text(no_wrap=True, overflow="crop")
        last = _axis_label(values[-1]) if values else "-"
        text.append(f"{self.title}", style="bold")
        text.append(f"  last {last}  ({len(values)} points)\n", style="dim")
        if not values:
            text.append("no data yet", style="dim italic")
            return text
        self._append_plot(text, values, values, width, rows)
        return text

    def _append_plot(
        self, text: Text, values: Sequence[float], plotted: Sequence[float], width: int, rows: int
    ) -> None:
        """The chart of `plotted` (`width` x `rows` cells), its axis spanning `values`."""
        low, high = padded_range(values, self.fixed_low, self.fixed_high)
        plot = braille_plot(plotted, width, rows, low, high)
        _append_axis_rows(text, [Text(line, style=self.line_style) for line in plot], low, high)


class StepCurveChart(CurveChart):
    """A titled line chart of (step, value) points, by step: the last value and its step
    in the title, the first and last step under the plot."""

    points: reactive[tuple[tuple[int, float], ...]] = reactive((), always_update=False)
    line_style = "green"

    def render(self) -> RenderResult:
        points = [(step, value) for step, value in self.points if not math.isnan(value)]
        width = max(1, self.size.width - AXIS_WIDTH)
        rows = max(1, self.size.height - 2)  # a line for the steps under the plot
        text = Text(no_wrap=True, overflow="crop")
        text.append(f"{self.title}", style="bold")
        if not points:
            text.append("  last -\n", style="dim")
            text.append("no records yet", style="dim italic")
            return text
        last_step, last = points[-1]
        text.append(f"  last {_axis_label(last)} at step {last_step}", style="dim")
        text.append(f"  ({len(points)} points)\n", style="dim")
        values = [value for _, value in points]
        self._append_plot(text, values, resample_by_step(points, width * 2), width, rows)
        _append_step_axis(text, points[0][0], last_step, width)
        return text


@dataclass(frozen=True)
class RunSeries:
    """One run's curve on a chart of several runs."""

    run_id: str
    colour: str  # a Rich colour: "#1f77b4"
    points: tuple[tuple[int, float], ...]  # (step, value), by step


class RunsChart(CurveChart):
    """Several runs' (step, value) curves on one step axis, each in its run's colour; the
    value axis spans the curves' own range, a little wider, never beyond [low, high] (the
    values the metric can take): rewards between 0.65 and 0.80 fill the chart rather than
    lying in a flat band of a 0-to-1 axis."""

    series: reactive[tuple[RunSeries, ...]] = reactive((), always_update=False)

    def render(self) -> RenderResult:
        shown = [s for s in self.series if s.points]
        text = Text(no_wrap=True, overflow="crop")
        text.append(self.title, style="bold")
        if not shown:
            text.append("\nno records yet", style="dim italic")
            return text
        text.append(f"  {len(shown)} runs\n", style="dim")
        width = max(1, self.size.width - AXIS_WIDTH)
        rows = max(1, self.size.height - 2)  # the title above, the steps below
        first = min(s.points[0][0] for s in shown)
        last = max(s.points[-1][0] for s in shown)
        low, high = padded_range(
            [v for s in shown for _, v in s.points], self.fixed_low, self.fixed_high
        )
        canvas = BrailleCanvas(width, rows)
        for index, run in enumerate(shown):
            canvas.draw_line(step_columns(run.points, canvas.dots_x, first, last), low, high, index)
        _append_axis_rows(text, canvas.styled_rows([run.colour for run in shown]), low, high)
        _append_step_axis(text, first, last, width)
        return text


def padded_range(
    values: Sequence[float], lowest: float | None, highest: float | None
) -> tuple[float, float]:
    """The values' range widened by a tenth of it each side (at least 0.01), so no curve
    runs along the chart's edge, and kept within [lowest, highest] where they are given."""
    low, high = min(values), max(values)
    pad = max((high - low) * AXIS_PAD, MIN_AXIS_PAD)
    low, high = low - pad, high + pad
    if lowest is not None:
        low = max(low, min(lowest, min(values)))
    if highest is not None:
        high = min(high, max(highest, max(values)))
    return low, high


def _axis_label(value: float) -> str:
    return f"{value:.4g}"
