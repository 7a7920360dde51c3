"""Text plots of a run's curves: braille line charts for the detail screen.

Each terminal cell holds a 2x4 grid of braille dots, so a 60x8 cell chart plots 120 x 32
points: enough to read the shape of a reward curve over SSH without any plotting library.
`braille_plot` is a pure function; `CurveChart` is the widget around it, one point per
record; `StepCurveChart` plots (step, value) points against their steps (eval records
come every few steps, and not always evenly: the last step is scored too).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich.text import Text
from textual.app import RenderResult
from textual.reactive import reactive
from textual.widget import Widget

_BRAILLE_BASE = 0x2800
# Bit of the dot at (column, row) within one braille cell, rows counted from the top.
_DOT_BITS = ((0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80))
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


def braille_plot(
    values: Sequence[float], width: int, height: int, low: float, high: float
) -> list[str]:
    """`height` rows of `width` braille characters drawing `values` as a connected line."""
    if width <= 0 or height <= 0:
        return []
    dots_x, dots_y = width * 2, height * 4
    grid = [[0] * width for _ in range(height)]
    span = high - low if high > low else 1.0

    def dot_row(value: float) -> int:
        scaled = (value - low) / span * (dots_y - 1)
        return dots_y - 1 - min(dots_y - 1, max(0, round(scaled)))

    previous: int | None = None
    for x, value in enumerate(resample([v for v in values if not math.isnan(v)], dots_x)):
        y = dot_row(value)
        # Fill from the previous column's height so a steep change stays a connected line.
        top, bottom = (y, y) if previous is None else (min(y, previous), max(y, previous))
        for row in range(top, bottom + 1):
            grid[row // 4][x // 2] |= _DOT_BITS[x % 2][row % 4]
        previous = y
    return ["".join(chr(_BRAILLE_BASE + bits) for bits in line) for line in grid]


class CurveChart(Widget):
    """A titled line chart of one series, with its range on a left axis."""

    # No wrapping: a title longer than the chart is cut, not pushed onto the plot's rows.
    DEFAULT_CSS = """
    CurveChart { height: 10; text-wrap: nowrap; text-overflow: clip; }
    """

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
        low = min(values) if self.fixed_low is None else min(self.fixed_low, min(values))
        high = max(values) if self.fixed_high is None else max(self.fixed_high, max(values))
        plot = braille_plot(plotted, width, rows, low, high)
        for index, line in enumerate(plot):
            if index == 0:
                label = _axis_label(high)
            elif index == len(plot) - 1:
                label = _axis_label(low)
            else:
                label = ""
            text.append(label[: AXIS_WIDTH - 1].rjust(AXIS_WIDTH - 1) + "│", style="dim")
            text.append(line, style=self.line_style)
            if index < len(plot) - 1:
                text.append("\n")


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
        first_label = f"step {points[0][0]}"
        text.append("\n" + " " * AXIS_WIDTH + first_label, style="dim")
        text.append(str(last_step).rjust(width - len(first_label)), style="dim")
        return text


def _axis_label(value: float) -> str:
    return f"{value:.4g}"
