"""What killed vLLM's engine, read from the server's log.

When vLLM's engine core dies (an exception in a step), its API server answers 500s and then
exits with status 0, so the exit alone says nothing. The engine logs the cause first: a
line `EngineCore encountered a fatal error.` followed by the traceback, each line tagged by
the engine's process and logging location. The supervisor asks `engine_fatal_error` at
every exit of the inference process, so `status`, the TUI and `up --headless` can say, in
one line, what the log says in fifty.
"""

from __future__ import annotations

import re
from pathlib import Path

# The lines vLLM logs when its engine core dies in a step, or while it starts.
FATAL_MARKERS = ("EngineCore encountered a fatal error", "EngineCore failed to start")
# `(EngineCore pid=6040) ERROR 11-27 03:52:32 [core.py:1512] message`; the process tag is
# absent when the engine runs in the API server's process.
LOG_LINE = re.compile(
    r"^(?P<tag>(?:\(\w+ pid=\d+\) )?(?:ERROR|CRITICAL) )[\d-]+ [\d:.]+ (?P<where>\[[^\]]+\]) ?"
    r"(?P<message>.*)$"
)
# At most this much of the log's end is read: vLLM dumps its scheduler's state (lines of
# hundreds of KB) just before the traceback.
MAX_READ_BYTES = 4 << 20
MAX_CAUSE_CHARS = 300
TRACEBACK_NOISE = ("Traceback (most recent call last):", "The above exception", "During handling")


def engine_fatal_error(log_path: Path, start_offset: int = 0) -> str | None:
    """`vLLM's engine died: RuntimeError: ...` when the log, from `start_offset` (where this
    start of the server began writing), holds an engine's fatal error; else None."""
    text = _read_end(log_path, start_offset)
    if text is None:
        return None
    lines = text.splitlines()
    for index in range(len(lines) - 1, -1, -1):
        if any(marker in lines[index] for marker in FATAL_MARKERS):
            exception = _final_exception(lines, index)
            if exception is None:
                return "vLLM's engine died (see the log for its traceback)"
            return f"vLLM's engine died: {exception}"[:MAX_CAUSE_CHARS]
    return None


def _read_end(log_path: Path, start_offset: int) -> str | None:
    try:
        with open(log_path, "rb") as log:
            size = log.seek(0, 2)
            log.seek(max(start_offset, size - MAX_READ_BYTES))
            return log.read().decode("utf-8", errors="replace")
    except OSError:
        return None


def _final_exception(lines: list[str], marker_index: int) -> str | None:
    """The last exception line of the traceback logged after the marker: the lines with the
    marker's process tag and location, unindented, that are not a traceback's headers."""
    marker = LOG_LINE.match(lines[marker_index])
    if marker is None:
        return None
    exception = None
    for line in lines[marker_index + 1 :]:
        match = LOG_LINE.match(line)
        if match is None or (match["tag"], match["where"]) != (marker["tag"], marker["where"]):
            break
        message = match["message"]
        if message and not message[0].isspace() and not message.startswith(TRACEBACK_NOISE):
            exception = message.strip()
    return exception
