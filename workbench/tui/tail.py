"""Following growing files by byte offset, the way `tail -f` does.

`AppendedLines` hands out the complete lines appended to a file since the last call; both
the metrics reader (`metrics.jsonl`) and the log pane (`*.log`) are built on it. Never is
a whole file read again: each call reads from the offset reached last time.

- A first read may start near the end (`initial_bytes`): a 2 GB trainer log must not be
  loaded to show its last screen. The partial first line is then dropped.
- A last line with no newline yet is held back until it is complete.
- A file that is truncated, replaced (new inode) or rewritten in place (the bytes just
  before the offset changed) is followed again from its start; `restarts` counts that.
- `read_limit` bounds one call, so a burst of output is handed over in slices.

`LogTail` adds what a log needs for display: text, and no terminal escape sequences (a
stray escape code must not move the cursor of the terminal the TUI draws on).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import BinaryIO

# Colour and cursor codes (CSI ... letter), OSC strings, and other single escapes.
_ANSI_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")

INITIAL_BYTES = 1024 * 1024
READ_LIMIT = 1024 * 1024
# Bytes just before the offset remembered to notice a file rewritten in place.
_ANCHOR_BYTES = 64


class AppendedLines:
    """The complete lines (bytes, without newline) appended to `path` since the last call."""

    def __init__(
        self, path: Path, initial_bytes: int | None = None, read_limit: int = READ_LIMIT
    ) -> None:
        self.path = path
        self.initial_bytes = initial_bytes  # None: read the whole file the first time
        self.read_limit = read_limit
        self.offset: int | None = None  # None until the file has been seen
        self.bytes_read = 0
        self.restarts = 0
        self._inode: int | None = None
        self._anchor = b""
        self._partial = b""

    def read(self) -> list[bytes]:
        try:
            with open(self.path, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                skip_first_line = False
                if self.offset is None:
                    start = 0 if self.initial_bytes is None else size - self.initial_bytes
                    self.offset = max(0, start)
                    skip_first_line = self.offset > 0  # starting mid-file lands mid-line
                    self._inode = os.fstat(handle.fileno()).st_ino
                elif self._replaced(handle, size):
                    self.offset, self._partial, self._anchor = 0, b"", b""
                    self._inode = os.fstat(handle.fileno()).st_ino
                    self.restarts += 1
                if size <= self.offset:
                    return []
                handle.seek(self.offset)
                chunk = handle.read(min(size - self.offset, self.read_limit))
        except (FileNotFoundError, NotADirectoryError, PermissionError, IsADirectoryError):
            return []
        self.offset += len(chunk)
        self.bytes_read += len(chunk)
        self._anchor = (self._anchor + chunk)[-_ANCHOR_BYTES:]
        *complete, self._partial = (self._partial + chunk).split(b"\n")
        if skip_first_line and complete:
            complete = complete[1:]
        return complete

    def _replaced(self, handle: BinaryIO, size: int) -> bool:
        assert self.offset is not None
        if os.fstat(handle.fileno()).st_ino != self._inode or size < self.offset:
            return True
        if not self._anchor:
            return False
        handle.seek(self.offset - len(self._anchor))
        return handle.read(len(self._anchor)) != self._anchor


def strip_escapes(line: str) -> str:
    return _ANSI_ESCAPE.sub("", line)


def clean_log_line(raw: bytes) -> str:
    """A log line as a terminal would leave it, minus colours and cursor codes."""
    line = raw.decode("utf-8", errors="replace").rstrip("\r")
    # A progress bar redraws itself with carriage returns: the text after the last one
    # is what a terminal would show.
    if "\r" in line:
        line = line.rsplit("\r", 1)[-1]
    return strip_escapes(line)


class LogTail(AppendedLines):
    """`AppendedLines` of a log, as display text; starts near the end of the file."""

    def __init__(
        self, path: Path, initial_bytes: int = INITIAL_BYTES, read_limit: int = READ_LIMIT
    ) -> None:
        super().__init__(path, initial_bytes=initial_bytes, read_limit=read_limit)

    def read_lines(self) -> list[str]:
        return [clean_log_line(raw) for raw in self.read()]
