"""Log lines as the TUI shows them: `LogTail` follows a log (`workbench.system.file_tail`) and
hands out display text without terminal escape sequences (a stray escape code must not
move the cursor of the terminal the TUI draws on).
"""

from __future__ import annotations

import re
from pathlib import Path

from workbench.system.file_tail import READ_LIMIT, AppendedLines

# Colour and cursor codes (CSI ... letter), OSC strings, and other single escapes.
_ANSI_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")

INITIAL_BYTES = 1024 * 1024


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
