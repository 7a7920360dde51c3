"""Appending to and reading a run's `metrics.jsonl` (format in docs/contracts.md).

The trainer and the orchestrator both append to the same file. Each record is one line
written with a single `write` on a file opened with O_APPEND, so lines from two writers
never interleave. A line left without its end (a full disk) is skipped by readers and does
not take the next record with it.

`read_metrics` reads the whole file. A follower that reads it as it grows (early stopping,
experiment tracking, the TUI) takes its appended lines with `workbench.system.file_tail` and each
line's record with `parse_record`, so every reader skips the same lines.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from workbench.files import layout


def append_metrics(run: Path, source: str, step: int, **values: Any) -> dict[str, Any]:
    record = {"source": source, "step": step, "time": round(time.time(), 3), **values}
    line = (json.dumps(record, separators=(",", ":")) + "\n").encode("utf-8")
    path = layout.metrics_path(run)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        # A write cut short (a full disk, a writer killed) leaves a line without its end;
        # the next record starts a line of its own rather than being lost glued to it.
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line
        os.write(fd, line)
    finally:
        os.close(fd)
    return record


def parse_record(line: bytes | str) -> dict[str, Any] | None:
    """One line of metrics.jsonl as its record; None for a torn or foreign line."""
    try:
        record = json.loads(line)
    except ValueError:  # not JSON, or bytes that are not UTF-8
        return None
    return record if isinstance(record, dict) else None


def read_metrics(run: Path, source: str | None = None) -> list[dict[str, Any]]:
    """Every record (optionally of one source); a torn or foreign line is skipped."""
    records = []
    try:
        with open(layout.metrics_path(run), "rb") as handle:
            for line in handle:
                record = parse_record(line)
                if record is not None and (source is None or record.get("source") == source):
                    records.append(record)
    except FileNotFoundError:
        pass
    return records
