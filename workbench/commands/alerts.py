"""`workbench alerts`: what the supervisor's alert rules raised (`alerts.jsonl`), as a table or
(--json) for scripts and agents."""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from workbench.commands.common import (
    EXIT_BAD_INPUT,
    ExperimentArg,
    JsonOption,
    console,
    experiment_or_fail,
    fail,
    say,
)
from workbench.files.alerts import Alert, read_alerts

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")


def parse_since(text: str, now: float) -> float:
    """Unix time from `10m`, `2h`, `1d`, `30s` (that long before `now`) or an ISO 8601 time
    (`2026-12-07T10:00`, local time unless it names its zone); ValueError otherwise."""
    match = _DURATION.match(text.strip())
    if match:
        return now - float(match.group(1)) * _UNITS[match.group(2)]
    try:
        return dt.datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise ValueError(
            f"--since {text!r}: expected a duration (30s, 10m, 2h, 1d) or a time "
            "(2026-12-07T10:00, 2026-12-07 10:00+00:00)"
        ) from None


def alerts(
    experiment: ExperimentArg = None,
    since: Annotated[
        str | None,
        typer.Option(
            help="Only alerts raised since then: a duration back from now (30s, 10m, 2h, "
            "1d) or a time (2026-12-07T10:00).",
            show_default=False,
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Show the alerts the supervisor raised for an experiment, oldest first.

    The supervisor checks rules as every run's records arrive and raises one alert per
    episode of a condition: reward_collapse (the mean reward of the last 3 steps fell
    `reward_drop` below its highest of the last `reward_window` steps), eval_regression (a
    held-out eval `eval_drop` below the run's best), non_finite (a NaN or infinite loss or
    gradient norm), kl_spike (`base_kl` `kl_factor` times its median), ratio_spike (the mean
    importance ratio beyond `ratio_limit`), stall (an open run without a record for
    `stall_s`), restarts (a process failing `restarts` times within
    `restarts_window_s`). The recipe's `\\[alerts]` table tunes or switches them off.

    --json prints {"experiment", "alerts": [{"time" (unix seconds), "at" (ISO time), "run"
    (null for the inference server or trainer), "process" (a restarts alert's), "rule",
    "message", "step", "key" (what names the episode), "values": {...}}, ...]}.
    """
    try:
        cutoff = parse_since(since, time.time()) if since is not None else None
    except ValueError as err:
        raise fail(str(err), EXIT_BAD_INPUT) from None
    path = experiment_or_fail(experiment)
    found = read_alerts(path, since=cutoff)
    if as_json:
        payload = {"experiment": str(path), "alerts": [_json(alert) for alert in found]}
        print(json.dumps(payload, indent=2))
        return
    if not found:
        say("no alerts" + (f" since {since}" if since else ""))
        return
    console.print(_table(found))


def _json(alert: Alert) -> dict:
    return {**alert.to_json(), "at": _iso(alert.time)}


def _iso(unix: float) -> str:
    return dt.datetime.fromtimestamp(unix, dt.UTC).isoformat(timespec="seconds")


def _table(found: list[Alert]) -> Table:
    table = Table(box=None, pad_edge=False)
    for column in ("time", "run", "rule", "message"):
        table.add_column(column, overflow="fold" if column == "message" else "ellipsis")
    for alert in found:
        when = dt.datetime.fromtimestamp(alert.time).strftime("%m-%d %H:%M:%S")
        table.add_row(
            when, escape(alert.run or alert.process or "-"), alert.rule, escape(alert.message)
        )
    return table
