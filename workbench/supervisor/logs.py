"""Finding and reading the log of a supervised process: `workbench logs NAME [-f]`.

Names are the process names of docs/contracts.md: `inference`, `trainer`, `supervisor`,
or a run id (its orchestrator's log). The logs are plain files written by the children
through the supervisor, so they survive the UI, the supervisor and restarts.
"""

from __future__ import annotations

import codecs
import os
import time
from collections.abc import Callable
from pathlib import Path

from workbench import layout

EXPERIMENT_LOGS = ("inference", "trainer", "supervisor")
_BLOCK = 65536


def experiment_log_path(experiment: Path, name: str) -> Path:
    """Log of `inference`, `trainer` or `supervisor`."""
    if name not in EXPERIMENT_LOGS:
        raise ValueError(f"{name!r} is not one of {', '.join(EXPERIMENT_LOGS)}")
    return layout.process_log_path(experiment, name)


def run_log_path(run: Path) -> Path:
    """Log of a run's orchestrator."""
    return layout.orchestrator_log_path(run)


def last_lines(path: Path, count: int) -> tuple[list[str], int]:
    """The last `count` lines of `path` and the file's size (where following starts).

    Reads backwards block by block, so the tail of a huge log costs what it shows.
    """
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        if count <= 0:
            return [], size
        position = size
        data = b""
        while position > 0 and data.count(b"\n") <= count:
            step = min(_BLOCK, position)
            position -= step
            handle.seek(position)
            data = handle.read(step) + data
    lines = data.decode("utf-8", errors="replace").splitlines()
    return lines[-count:], size


def follow(
    path: Path,
    offset: int,
    write: Callable[[str], None],
    *,
    poll_s: float = 0.2,
    keep_going: Callable[[], bool] = lambda: True,
) -> None:
    """Write what is appended to `path` from `offset` on, until `keep_going()` is false.

    Waits for a file that does not exist yet, and starts over from the beginning when the
    file is truncated or replaced (a process that rotates or recreates its log).
    """
    handle = None
    inode = None
    # A multi-byte character may straddle two reads.
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    try:
        while keep_going():
            if handle is None:
                try:
                    handle = open(path, "rb")  # noqa: SIM115 - kept open across iterations
                except FileNotFoundError:
                    time.sleep(poll_s)
                    continue
                inode = os.fstat(handle.fileno()).st_ino
                handle.seek(offset)
            chunk = handle.read(_BLOCK)
            if chunk:
                write(decoder.decode(chunk))
                continue
            try:
                current = os.stat(path)
            except FileNotFoundError:
                current = None
            replaced = current is None or current.st_ino != inode
            if replaced or current.st_size < handle.tell():
                handle.close()
                handle, offset = None, 0
                continue
            time.sleep(poll_s)
    finally:
        if handle is not None:
            handle.close()
