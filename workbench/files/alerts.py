"""`alerts.jsonl`: every alert the supervisor raised for an experiment (format in
docs/contracts.md).

One JSON object a line, appended with a single `write` on a file opened with O_APPEND, as
metrics.jsonl is: a line is whole or, cut short by a full disk, skipped by readers. Written
by the supervisor's alert watcher (`workbench.alerts.watcher`), read by `workbench alerts`
and the TUI.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from workbench.files import layout


@dataclass(frozen=True)
class Alert:
    """One episode of a condition: raised once when it begins, not again until it ended.

    run: the run it is about (None for the inference server or the trainer); process: the
    process of a `restarts` alert; key: what names the episode within its run and rule (the
    step it began at, say), so that records read again raise nothing twice."""

    time: float  # unix seconds
    run: str | None
    rule: str
    message: str
    key: str
    step: int | None = None
    process: str | None = None
    values: dict[str, Any] = field(default_factory=dict)

    @property
    def identity(self) -> tuple[str | None, str | None, str, str]:
        return (self.run, self.process, self.rule, self.key)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "values": json_values(self.values)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Alert | None:
        try:
            return cls(
                time=float(data["time"]),
                run=data.get("run"),
                rule=str(data["rule"]),
                message=str(data["message"]),
                key=str(data["key"]),
                step=data.get("step"),
                process=data.get("process"),
                values=dict(data.get("values") or {}),
            )
        except (KeyError, TypeError, ValueError):
            return None


def json_values(values: dict[str, Any]) -> dict[str, Any]:
    """`values` with each non-finite number as a string ("nan", "inf"): the file stays
    strict JSON, for jq and for JavaScript."""
    return {
        key: str(value) if isinstance(value, float) and not math.isfinite(value) else value
        for key, value in values.items()
    }


def append_alert(experiment: Path, alert: Alert) -> None:
    line = (json.dumps(alert.to_json(), separators=(",", ":")) + "\n").encode("utf-8")
    fd = os.open(layout.alerts_path(experiment), os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        # After a line cut short, the next one starts a line of its own (as metrics.jsonl).
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line
        os.write(fd, line)
    finally:
        os.close(fd)


def parse_alert(line: bytes | str) -> Alert | None:
    """One line of alerts.jsonl; None for a torn or foreign line."""
    try:
        data = json.loads(line)
    except ValueError:
        return None
    return Alert.from_json(data) if isinstance(data, dict) else None


def read_alerts(experiment: Path, since: float | None = None) -> list[Alert]:
    """Every alert of the experiment in the order raised; with `since` (unix seconds), those
    raised at or after it."""
    alerts = []
    try:
        with open(layout.alerts_path(experiment), "rb") as handle:
            for line in handle:
                alert = parse_alert(line)
                if alert is not None and (since is None or alert.time >= since):
                    alerts.append(alert)
    except FileNotFoundError:
        pass
    return alerts
