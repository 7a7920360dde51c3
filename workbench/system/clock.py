"""Time as the project writes it: UTC timestamps in files, short durations for people.

`now_iso()` stamps every file that says when something happened (state.json, evicted.txt,
finished.txt, runs.json, rollouts, the sweep's files) in one format, ISO 8601 in UTC to
the millisecond: a supervisor event and the file it reacts to can be told apart.
`format_duration` writes uptimes and ages for `workbench status` and the TUI; it is
coarse on purpose ("42s", "7m", "3h05m"): a TUI cell whose text does not change is not
redrawn, so an idle screen costs nothing. `format_elapsed` counts seconds for longer
("86s"), for a wait someone watches (the startup phase) where a minute is a long time.
"""

from __future__ import annotations

import datetime as dt
import math


def now_iso() -> str:
    """Now, e.g. `2026-11-21T20:00:00.123+00:00`."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def unix_time(value: object) -> float | None:
    """Unix seconds from a timestamp as the project's files hold it (an ISO-8601 string, or a
    number already); None for anything else. A naive ISO time is local time, as
    `datetime.now().isoformat()` writes it."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return dt.datetime.fromisoformat(value).timestamp()
        except ValueError:
            return None
    return None


def format_duration(seconds: float | None) -> str:
    """`None` -> "-"; 42 -> "42s"; 420 -> "7m"; 11100 -> "3h05m"; 200000 -> "2d07h";
    from ten days on, days only ("12d"): never more than 6 characters."""
    if seconds is None or math.isnan(seconds):
        return "-"
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    days = seconds // 86400
    return f"{days}d" if days >= 10 else f"{days}d{seconds % 86400 // 3600:02d}h"


# Up to here a wait is counted in seconds.
ELAPSED_SECONDS_UP_TO = 600


def format_elapsed(seconds: float | None) -> str:
    """Seconds while a wait is being watched: 86 -> "86s"; from ten minutes on, as
    `format_duration` ("12m")."""
    if seconds is None or math.isnan(seconds) or seconds >= ELAPSED_SECONDS_UP_TO:
        return format_duration(seconds)
    return f"{max(0, int(seconds))}s"
