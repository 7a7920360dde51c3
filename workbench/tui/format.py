"""How numbers, ages and series are written in the TUI's cells: pure functions.

Durations are `workbench.system.clock.format_duration`'s, coarse on purpose: a cell whose text
does not change is not redrawn, so an idle screen costs nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from workbench.system.clock import format_duration

SPARK_BLOCKS = "▁▂▃▄▅▆▇█"


def format_age(since: float | None, now: float) -> str:
    """How long ago `since` (unix seconds) was: "12s ago", or "-" when never."""
    if since is None:
        return "-"
    return f"{format_duration(now - since)} ago"


def format_count(value: int) -> str:
    """Token counts: 950 -> "950", 12_300 -> "12.3k", 4_560_000 -> "4.56M"."""
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= limit:
            scaled = value / limit
            digits = 2 if scaled < 10 else 1 if scaled < 100 else 0
            return f"{scaled:.{digits}f}{suffix}"
    return str(value)


def format_steps(step: int, max_steps: int | None) -> str:
    return f"{step}/{max_steps}" if max_steps else str(step)


def format_reward(reward: float | None) -> str:
    return "-" if reward is None else f"{reward:.3f}"


def sparkline(
    values: Sequence[float], width: int, low: float | None = None, high: float | None = None
) -> str:
    """The last `width` values as block characters, scaled between `low` and `high`.

    A table passes the bounds of every row's points (`spark_bounds`) so the same height
    means the same value in every row. Without bounds the series' own range is used.
    """
    points = [v for v in values[-width:] if not math.isnan(v)] if width > 0 else []
    if not points:
        return ""
    low = min(points) if low is None else low
    high = max(points) if high is None else high
    span = high - low
    top = len(SPARK_BLOCKS) - 1
    if span <= 0:
        return SPARK_BLOCKS[top // 2] * len(points)
    return "".join(SPARK_BLOCKS[min(top, max(0, round((v - low) / span * top)))] for v in points)


def spark_bounds(series: Iterable[Sequence[float]], width: int) -> tuple[float, float] | None:
    """The range of every point that sparklines `width` wide show of `series`: one scale
    for a table's rows, so that rewards between 0.80 and 0.87 fill the blocks rather than
    all standing at the top of a fixed 0-to-1 scale. None when no series has a point."""
    shown = [v for values in series for v in values[-width:] if not math.isnan(v)]
    return (min(shown), max(shown)) if shown else None
