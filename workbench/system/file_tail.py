"""The end of a text file that grows (a log, metrics.jsonl), read the way `tail` reads it.

- `last_lines(path, count)`: its last lines (`tail -n`). It reads backwards from the end,
  block by block, so the tail of a huge log costs what it shows.
- `AppendedLines(path)`: the complete lines appended since the last call (`tail -f`), by
  byte offset: a whole file is never read again. It starts at the file's start, near its
  end (`initial_bytes`: a 2 GB log must not be loaded to show its last screen; the cut
  first line is dropped), or at its last lines (`AppendedLines.from_last_lines`).
  A last line with no newline yet is held back until it is complete. A file that is
  truncated, replaced (a new inode: deleted and created again, renamed over) or rewritten
  in place (the bytes just before the offset changed) is followed again from its start,
  so a process that recreates its log is followed into the new one; `restarts` counts
  that. `read_limit` bounds one call, so a burst of output is handed over in slices.
  `read_with_ends` gives each line's end offset, and `AppendedLines.resuming` starts again
  just past one, so a follower that keeps that offset on disk picks up where it stopped.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

READ_LIMIT = 1024 * 1024
# How far back `last_lines` looks at most: a log whose last line has no end in sight
# (a progress bar that never prints a newline) must not be read whole.
MAX_TAIL_BYTES = 1024 * 1024
_BLOCK = 65536
# Bytes just before the offset remembered to notice a file rewritten in place.
_ANCHOR_BYTES = 64


def last_lines(path: Path, count: int, max_bytes: int = MAX_TAIL_BYTES) -> list[str]:
    """The last `count` lines of a text file, from at most its last `max_bytes`; [] when it
    cannot be read. A line cut by `max_bytes` is left out."""
    if count <= 0:
        return []
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            start = _start_of_last_lines(handle, size, count, max_bytes)
            handle.seek(start)
            data = handle.read(size - start)
    except OSError:
        return []
    return data.decode("utf-8", errors="replace").splitlines()[-count:]


def _start_of_last_lines(handle: BinaryIO, size: int, count: int, max_bytes: int) -> int:
    """The offset at which the last `count` lines begin (a last line without its newline
    counts), looking back at most `max_bytes`."""
    if count <= 0:
        return size
    position, data = size, b""
    while position > 0 and len(data) < max_bytes:
        step = min(_BLOCK, position, max_bytes - len(data))
        position -= step
        handle.seek(position)
        data = handle.read(step) + data
        body = data[:-1] if data.endswith(b"\n") else data
        if body.count(b"\n") >= count:
            break
    body = data[:-1] if data.endswith(b"\n") else data
    end = len(body)
    for _ in range(count):
        end = body.rfind(b"\n", 0, end)
        if end < 0:
            break
    if end >= 0:
        return position + end + 1
    if position == 0:
        return 0
    # Fewer lines than asked within `max_bytes`: the first one read is cut, leave it out.
    first = data.find(b"\n")
    return size if first < 0 else position + first + 1


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
        self._initial_lines: int | None = None
        self._inode: int | None = None
        self._anchor = b""
        self._partial = b""

    @classmethod
    def from_last_lines(cls, path: Path, count: int) -> AppendedLines:
        """Starting with the last `count` lines of the file (all of it if it is created
        later), then what is appended: `tail -n COUNT -f`."""
        follower = cls(path)
        if path.exists():
            follower._initial_lines = count
        return follower

    @classmethod
    def resuming(cls, path: Path, inode: int, offset: int) -> AppendedLines:
        """Continuing just past a line that ends at `offset` of the file whose inode is
        `inode` (as `read_with_ends` gave it); another or a shorter file is followed from its
        start, as a replaced one is."""
        follower = cls(path)
        follower.offset, follower._inode = offset, inode
        return follower

    @property
    def inode(self) -> int | None:
        """The inode of the file followed; None until it has been seen."""
        return self._inode

    def read(self) -> list[bytes]:
        return [line for line, _ in self.read_with_ends()]

    def read_with_ends(self) -> list[tuple[bytes, int]]:
        """As `read`, each line with the offset just past its newline."""
        try:
            with open(self.path, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                skip_first_line = False
                if self.offset is None:
                    self.offset, skip_first_line = self._first_offset(handle, size)
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
        start = self.offset - len(self._partial)  # where the held-back line began
        self.offset += len(chunk)
        self.bytes_read += len(chunk)
        self._anchor = (self._anchor + chunk)[-_ANCHOR_BYTES:]
        *complete, self._partial = (self._partial + chunk).split(b"\n")
        ends = []
        for line in complete:
            start += len(line) + 1
            ends.append((line, start))
        if skip_first_line and ends:
            ends = ends[1:]
        return ends

    def _first_offset(self, handle: BinaryIO, size: int) -> tuple[int, bool]:
        """Where the first read starts, and whether it lands mid-line."""
        if self._initial_lines is not None:
            return _start_of_last_lines(handle, size, self._initial_lines, MAX_TAIL_BYTES), False
        if self.initial_bytes is None:
            return 0, False
        start = max(0, size - self.initial_bytes)
        return start, start > 0

    def _replaced(self, handle: BinaryIO, size: int) -> bool:
        assert self.offset is not None
        if os.fstat(handle.fileno()).st_ino != self._inode or size < self.offset:
            return True
        if not self._anchor:
            return False
        handle.seek(self.offset - len(self._anchor))
        return handle.read(len(self._anchor)) != self._anchor
