"""The log pane: follows one log file, fast however large or fast-growing it is.

- A thread worker tails the file by byte offset (`workbench.tui.tail.LogTail`) and hands
  lines to the UI in batches, at most every `BATCH_INTERVAL` seconds: a process printing
  thousands of lines a second costs a few screen updates a second, not thousands.
- Textual's `Log` widget renders only the visible lines, and keeps at most `max_lines`.
- Scrolling up pauses following: new lines wait in a bounded buffer (the view does not
  move under the reader) and `end` / `G` resumes.
- `/` searches the retained lines, `n` / `N` jump to the next / previous match, and `y`
  copies the visible lines to the clipboard (OSC 52, which works over SSH).
"""

from __future__ import annotations

import re
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from rich.highlighter import Highlighter
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.widgets import Input, Log, Static
from textual.worker import get_current_worker

from workbench.tui.tail import LogTail

LOG_MAX_LINES = 10_000
BATCH_INTERVAL = 0.1
IDLE_INTERVAL = 0.25


@dataclass(frozen=True)
class LogTarget:
    """What the pane follows: a title for the user and the file."""

    title: str
    path: Path


class SearchHighlighter(Highlighter):
    """Marks every occurrence of the search term (case-insensitive)."""

    def __init__(self, term: str) -> None:
        self.pattern = re.compile(re.escape(term), re.IGNORECASE) if term else None

    def highlight(self, text: Text) -> None:
        if self.pattern is not None:
            text.highlight_regex(self.pattern, style="black on yellow")


class LogPane(Vertical):
    """A title line, the `Log`, and a search input shown on `/`."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "start_search", "search"),
        Binding("n", "next_match", "next", show=False),
        Binding("N", "previous_match", "prev", show=False),
        Binding("end,G", "resume_follow", "follow end", show=False),
        Binding("y", "copy_visible", "copy", show=False),
        Binding("escape", "cancel_search", "cancel search", show=False),
    ]

    def __init__(
        self,
        max_lines: int = LOG_MAX_LINES,
        *,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(id=id, classes=classes)
        self.max_lines = max_lines
        self.target: LogTarget | None = None
        self.tail: LogTail | None = None
        self._generation = 0  # bumped on every new target: late batches of the old one drop
        self._pending: deque[str] = deque(maxlen=max_lines)
        self._term = ""
        self._matches: list[int] = []
        self._match_index = -1
        self._wakeup = threading.Event()

    def compose(self) -> ComposeResult:
        yield Static("no log followed: select a run or process and press f", id="log-title")
        yield Log(max_lines=self.max_lines, id="log", auto_scroll=True)
        yield Input(placeholder="search the log (enter: find, esc: close)", id="log-search")

    def on_mount(self) -> None:
        # Anchored, the Log stays at its end through every resize and layout pass until
        # the reader scrolls up. Its own auto-scroll alone runs when lines are written,
        # which can be before the screen's layout has sized it: the view then stayed at
        # the top (seen on a first load while the layout was still settling).
        self.log.anchor()

    @property
    def log(self) -> Log:
        return self.query_one("#log", Log)

    @property
    def paused(self) -> bool:
        """True while the reader has scrolled up and new lines wait."""
        return not self._at_end()

    def _at_end(self) -> bool:
        log = self.log
        return log.line_count == 0 or log.is_vertical_scroll_end

    # ------------------------------------------------------------ following

    def follow(self, target: LogTarget) -> None:
        """Show `target`'s last lines and keep following it (a no-op if already followed)."""
        if target == self.target:
            self.action_resume_follow()
            return
        self.target = target
        self._generation += 1
        self._pending.clear()
        self._matches, self._match_index = [], -1
        self.log.clear()
        self._update_title()
        self._tail_file(target, self._generation)

    @work(thread=True, exclusive=True, group="log-tail")
    def _tail_file(self, target: LogTarget, generation: int) -> None:
        worker = get_current_worker()
        # Roughly the bytes that `max_lines` lines of a log take, so the first read of a
        # huge file fills the pane without reading the whole file.
        tail = LogTail(target.path, initial_bytes=self.max_lines * 160)
        self.tail = tail
        while not worker.is_cancelled:
            lines = tail.read_lines()
            if lines:
                try:
                    self.app.call_from_thread(self._receive, generation, lines)
                except RuntimeError:
                    return  # the app is shutting down
                wait = BATCH_INTERVAL
            else:
                wait = IDLE_INTERVAL
            self._wakeup.wait(wait)

    def _receive(self, generation: int, lines: list[str]) -> None:
        if generation != self._generation:
            return
        if self._at_end():
            # Following (or the reader scrolled back down): catch up on what waited.
            if self._pending:
                lines = [*self._pending, *lines]
                self._pending.clear()
            self.log.write_lines(lines)
        else:
            self._pending.extend(lines)
        self._update_title()

    def action_resume_follow(self) -> None:
        """Jump to the end, write what arrived while paused, follow again."""
        if self._pending:
            self.log.write_lines(list(self._pending), scroll_end=False)
            self._pending.clear()
        self.log.scroll_end(animate=False, immediate=True)
        self._update_title()

    def _update_title(self) -> None:
        if self.target is None:
            return
        title = Text(no_wrap=True, overflow="ellipsis")
        title.append(f"log: {self.target.title}", style="bold")
        title.append(f"  {self.target.path.name}", style="dim")
        if self._pending:
            title.append(f"  paused, {len(self._pending)} new lines (end: follow)", style="yellow")
        elif not self.target.path.exists():
            title.append("  (no file yet)", style="dim")
        if self._term:
            found = len(self._matches)
            where = f"{self._match_index + 1}/{found}" if found else "no match"
            title.append(f"  /{self._term} {where}", style="cyan")
        self.query_one("#log-title", Static).update(title)

    # ------------------------------------------------------------ search

    @property
    def current_match(self) -> int | None:
        """The line (index into the retained lines) of the current search match."""
        if 0 <= self._match_index < len(self._matches):
            return self._matches[self._match_index]
        return None

    def action_start_search(self) -> None:
        self.start_search()

    def start_search(self) -> None:
        search = self.query_one("#log-search", Input)
        search.value = self._term
        search.add_class("-visible")
        search.focus()

    @on(Input.Submitted, "#log-search")
    def _search_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.query_one("#log-search", Input).remove_class("-visible")
        self.log.focus()
        self.search(event.value)

    def action_cancel_search(self) -> None:
        search = self.query_one("#log-search", Input)
        if search.has_class("-visible"):
            search.remove_class("-visible")
            self.log.focus()

    def search(self, term: str) -> None:
        """Highlight `term` and jump to its first match at or below the top of the view."""
        self._term = term
        log = self.log
        log.highlighter = SearchHighlighter(term)
        log.highlight = bool(term)
        self._find_matches()
        if self._matches:
            top = int(log.scroll_offset.y)
            self._match_index = next((i for i, line in enumerate(self._matches) if line >= top), 0)
            self._show_match()
        log.refresh()
        self._update_title()

    def _find_matches(self) -> None:
        if not self._term:
            self._matches, self._match_index = [], -1
            return
        needle = self._term.lower()
        self._matches = [i for i, line in enumerate(self.log.lines) if needle in line.lower()]
        self._match_index = -1

    def action_next_match(self) -> None:
        self._step_match(+1)

    def action_previous_match(self) -> None:
        self._step_match(-1)

    def _step_match(self, direction: int) -> None:
        if not self._term:
            return
        # Lines arrive and old ones are dropped while searching: look again each time.
        current = self._matches[self._match_index] if self._matches else None
        self._find_matches()
        if not self._matches:
            self._update_title()
            return
        if current is None:
            self._match_index = 0
        elif direction > 0:
            later = [i for i, line in enumerate(self._matches) if line > current]
            self._match_index = later[0] if later else 0
        else:
            earlier = [i for i, line in enumerate(self._matches) if line < current]
            self._match_index = earlier[-1] if earlier else len(self._matches) - 1
        self._show_match()
        self._update_title()

    def _show_match(self) -> None:
        log = self.log
        line = self._matches[self._match_index]
        log.scroll_to(y=max(0, line - log.size.height // 2), animate=False, immediate=True)

    # ------------------------------------------------------------ copy

    def action_copy_visible(self) -> None:
        log = self.log
        top = int(log.scroll_offset.y)
        visible = log.lines[top : top + log.size.height]
        self.app.copy_to_clipboard("\n".join(visible))
        self.notify(f"copied {len(visible)} lines", timeout=2)

    def on_unmount(self) -> None:
        self._wakeup.set()
