"""Where the time went, whole: every activity a process ended, kept as a span.

`busy` keeps a process's last minute; this keeps all of it, for `workbench trace`. Each
activity the process's busy recorder ends (generation, scoring and writing, loading
adapter, update, publishing adapters, waiting for ...) becomes a span of the process's
main line: they do not overlap and, with the one under way (in `busy/<process>.json`),
cover its life. Work a process does on threads of its own (the trainer's adapter writes)
is marked with `span(label)` and kept on a line per thread.

`spans/<process>.jsonl` holds one JSON array a line: `[label, kind, start, end]` (unix
seconds) for the main line, `[label, kind, start, end, thread]` for a thread's. Spans are
buffered and appended when the busy record is written (at most once a second, and at
`flush`), so a mark costs a list append. A file past `MAX_BYTES` becomes
`<process>.1.jsonl`, replacing the one before: a long run keeps its last ~100,000 spans
(two files), never more than 2 x MAX_BYTES a process.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from workbench.files import layout

MAX_BYTES = 4 * 1024 * 1024
MAIN = ""  # the thread name of the main line


@dataclass(frozen=True)
class Span:
    label: str
    kind: str  # busy, waiting or starting (busy.KINDS)
    start: float  # unix seconds
    end: float
    thread: str = MAIN

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def to_line(self) -> str:
        fields: list[object] = [self.label, self.kind, round(self.start, 6), round(self.end, 6)]
        if self.thread != MAIN:
            fields.append(self.thread)
        return json.dumps(fields, separators=(",", ":")) + "\n"


class SpanLog:
    """One process's spans on their way to its file: added from any thread, appended by
    `write`."""

    def __init__(self, path: Path, max_bytes: int = MAX_BYTES) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._pending: list[Span] = []

    def add(self, span: Span) -> None:
        if span.end > span.start:
            with self._lock:
                self._pending.append(span)

    def write(self) -> None:
        """Append the spans added since the last write; a full disk loses them, quietly
        (training goes on)."""
        with self._lock:
            pending, self._pending = self._pending, []
        if not pending:
            return
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as file:
                file.write("".join(span.to_line() for span in pending))
                size = file.tell()
            if size > self.max_bytes:
                os.replace(self.path, rotated_path(self.path))


def rotated_path(path: Path) -> Path:
    return path.with_name(f"{path.stem}.1{path.suffix}")


_log: SpanLog | None = None


def record_to(experiment: Path, process: str) -> SpanLog:
    """Keep this process's spans in the experiment's `spans/<process>.jsonl` (the busy
    recorder calls this and writes the log with its record)."""
    global _log
    _log = SpanLog(layout.spans_path(experiment, process))
    return _log


@contextlib.contextmanager
def span(label: str, kind: str = "busy", thread: str | None = None) -> Iterator[None]:
    """Mark the block as work of the current thread (not the process's activity: several
    threads may be at it at once), on the line named `thread` (default: the thread's
    name). Costs nothing in a process that keeps no spans."""
    if _log is None:
        yield
        return
    start = time.time()
    try:
        yield
    finally:
        line = thread or threading.current_thread().name
        _log.add(Span(label, kind, start, time.time(), line))


# ---------------------------------------------------------------- reading


def parse_line(line: str) -> Span | None:
    """The span of one line, or None for a line cut short (a process killed mid-write)."""
    try:
        fields = json.loads(line)
        label, kind, start, end = fields[:4]
        thread = str(fields[4]) if len(fields) > 4 else MAIN
        return Span(str(label), str(kind), float(start), float(end), thread)
    except (ValueError, TypeError, IndexError):
        return None


def read_spans(path: Path, since: float | None = None) -> list[Span]:
    """The spans of one process's file (and the file before it), oldest first; those that
    ended before `since` left out."""
    spans = []
    for part in (rotated_path(path), path):
        try:
            text = part.read_text(encoding="utf-8")
        except OSError:
            continue
        for line in text.splitlines():
            found = parse_line(line)
            if found is not None and (since is None or found.end > since):
                spans.append(found)
    return spans


def read_experiment_spans(experiment: Path, since: float | None = None) -> dict[str, list[Span]]:
    """Every process's spans, by process name."""
    directory = layout.spans_dir(experiment)
    try:
        names = sorted({path.stem.removesuffix(".1") for path in directory.glob("*.jsonl")})
    except OSError:
        return {}
    return {name: read_spans(directory / f"{name}.jsonl", since) for name in names}
