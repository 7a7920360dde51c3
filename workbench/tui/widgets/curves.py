"""Text plots of a run's curves: a braille line chart for the detail screen.

Each terminal cell holds a 2x4 grid of braille dots, so a 60x8 cell chart plots 120 x 32
points: enough to read the shape of a reward curve over SSH without any plotting library.
`braille_plot` is a pure function; `CurveChart` is the widget around it.
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

    DEFAULT_CSS = """
    CurveChart { height: 10; }
    """

    values: reactive[tuple[float, ...]] = reactive((), always_update=False)

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
        low = min(values) if self.fixed_low is None else min(self.fixed_low, min(values))
        high = max(values) if self.fixed_high is None else max(self.fixed_high, max(values))
        plot = braille_plot(values, width, rows, low, high)
        for index, line in enumerate(plot):
            if index == 0:
                label = _axis_label(high)
            elif index == len(plot) - 1:
                label = _axis_label(low)
            else:
                label = ""
            text.append(label[: AXIS_WIDTH - 1].rjust(AXIS_WIDTH - 1) + "│", style="dim")
            text.append(line, style="cyan")
            if index < len(plot) - 1:
                text.append("\n")
        return text


def _axis_label(value: float) -> str:
    return f"{value:.4g}"
