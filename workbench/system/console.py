"""The console the commands and the benchmarks print their tables with.

On a terminal it is rich's console as it is: as wide as the terminal. Piped or logged
(`workbench bench ... | tee log`, `workbench status > status.txt`, a CI log), rich would
lay tables out in 80 columns and cut the headers that do not fit ("set…", "spe…"); this
console is `PIPED_WIDTH` wide there instead, so a table keeps the width its cells need and
a line is never wrapped: nothing reads that output at a width, and a log is searched line
by line. A width asked for (`COLUMNS`, `width=`) is kept.
"""

from __future__ import annotations

from rich.console import Console, ConsoleDimensions

# Wider than any table of ours: tables are laid out at the width they need, not this.
PIPED_WIDTH = 1000


class OutputConsole(Console):
    """rich's `Console`, `PIPED_WIDTH` wide when its file is not a terminal, unless a width
    was given. Its file is looked at as it prints, as rich's is (sys.stdout swapped by a
    test runner counts)."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        if self._width is None and not self.is_terminal:
            return ConsoleDimensions(PIPED_WIDTH, size.height)
        return size

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]


def output_console(*, stderr: bool = False) -> Console:
    """A console on stdout (stderr with `stderr`) that prints tables whole when piped."""
    return OutputConsole(stderr=stderr)
