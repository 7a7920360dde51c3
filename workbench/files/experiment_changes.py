"""Which of an experiment's runs changed since the last look, from the file system's events.

A reader that looks at every run each second (the TUI) would otherwise pay for every run
each time: a few `stat`s per run, hundreds of runs in a sweep. With this it pays for what
changed. One recursive watchdog schedule of the experiment directory
(`workbench.system.tree_events`: three threads whatever the number of runs) subscribed to
directories made, deleted or moved and files closed after writing, made, moved or deleted;
never to "modified", so logs written by processes that keep them open send nothing. Its
events land in sets that `take()` hands over; only these paths count:

- the experiment directory: a run directory appears or goes; `busy/` appears;
- a run directory: `metrics.jsonl` appended (its writer closes it after each record),
  `control/` or `broadcast/` made; anything below `control/` or `broadcast/`: evicted,
  finished, rejected, `orch.toml` replaced or edited, a step (or its STABLE marker) added;
- `busy/`: a process's record of where its time goes rewritten.
Logs, rollouts and checkpoints are never read for a run's status: their events are dropped
by that path test in watchdog's thread.

`take()` says what had events since the last call (`Changes`); an event is in the answer
of the first look after it landed (watchdog hands it over within milliseconds). It
cannot tell everything:

- with no observer (out of inotify instances or watches, or the experiment directory
  not made yet) it says `everything`, and so does the first look;
- a run whose directories got no watch (out of inotify watches: warned once, naming
  the limit) is reported changed at every look;
- a file system whose writes come from another machine (NFS) sends no events for them,
  and events the kernel dropped (its queue overflowed; watchdog only logs it) are lost:
  every look adds a slice of the other runs in turn, so that each run is looked at again
  at least every `FULL_PASS_LOOKS` looks.

A reader treats the runs it is told about as it treated every run before: their files'
signatures still decide whether they are read again.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileMovedEvent,
    FileSystemEvent,
)
from watchdog.observers.api import BaseObserver

from workbench.files import layout
from workbench.system import tree_events

log = logging.getLogger(__name__)

# Every run is looked at again at least once in this many looks, events or not.
FULL_PASS_LOOKS = 10

# The files of a run directory itself whose events matter; the rest (logs/, rollouts/,
# checkpoints/) are never read for a run's status or curves.
_RUN_ENTRIES = frozenset(
    path.name
    for path in (
        layout.metrics_path(Path("run")),
        layout.control_dir(Path("run")),
        layout.broadcasts_dir(Path("run")),
    )
)

# The run's directories below which anything counts (a control file, a broadcast step).
_RUN_SUBDIRS = frozenset(
    path.name for path in (layout.control_dir(Path("run")), layout.broadcasts_dir(Path("run")))
)
# What the feed subscribes to (see the module docstring): no "modified", no "opened".
WATCHED_EVENTS: tuple[type[FileSystemEvent], ...] = (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileCreatedEvent,
    FileClosedEvent,
    FileMovedEvent,
    FileDeletedEvent,
)


@dataclass(frozen=True)
class Changes:
    """What may have changed since the last look."""

    everything: bool = False  # events may have been lost: look at everything
    runs: frozenset[str] = field(default_factory=frozenset)  # run ids
    busy: frozenset[str] = field(default_factory=frozenset)  # names of files in busy/


EVERYTHING = Changes(everything=True)


class ExperimentChanges:
    """Follows one experiment's run files through watchdog (see the module docstring)."""

    def __init__(self, experiment: Path, full_pass_looks: int | None = FULL_PASS_LOOKS) -> None:
        """`full_pass_looks`: every run is reported at least once in this many looks, events
        or not; None: only the runs that had events (for tests of the events alone)."""
        self.experiment = experiment
        self._root = os.fsdecode(experiment)
        self._busy_name = layout.busy_dir(experiment).name
        self._full_pass_looks = full_pass_looks
        self._lock = threading.Lock()  # the sets below: filled by watchdog's thread
        self._pending_runs: set[str] = set()
        self._pending_busy: set[str] = set()
        # The first look covers everything: nothing was watched before it.
        self._lost = True
        self._resync = True
        self._closed = False
        self._observer: BaseObserver | None = None
        self._gave_up = False  # out of watches or instances: warned, not tried again
        self._runs: list[str] = []  # every run directory, sorted: the slices' order
        self._unwatched: set[str] = set()  # runs with a directory that got no watch
        self._warned_unwatched = False
        self._looks = 0
        self._next_slice = 0
        self.events_seen = 0  # every event the filter let through (for benchmarks)
        self._follow()

    @property
    def watching(self) -> bool:
        """Whether events are followed at all (else every look says `everything`)."""
        observer = self._observer
        return observer is not None and observer.is_alive() and not self._closed

    def close(self) -> None:
        """Stop following events; a look from another thread meanwhile says `everything`."""
        self._closed = True
        observer, self._observer = self._observer, None
        tree_events.stop_following(observer)

    def take(self) -> Changes:
        """What had events since the last call, plus this look's slice of the other runs.
        Call it before reading: an event that comes during the read is in the next answer."""
        if self._closed:
            return EVERYTHING
        if not self.watching:
            self._follow()
            if not self.watching:
                return EVERYTHING
        with self._lock:
            runs, self._pending_runs = self._pending_runs, set()
            busy, self._pending_busy = self._pending_busy, set()
            everything, self._lost = self._lost, False
            resync, self._resync = self._resync, False
        self._looks += 1
        if resync:
            self._runs = [run.name for run in layout.list_run_dirs(self.experiment)]
        if resync or self._looks % (self._full_pass_looks or FULL_PASS_LOOKS) == 0:
            self._check_watches()
        if everything:
            return EVERYTHING
        runs.update(self._unwatched, self._slice())
        return Changes(runs=frozenset(runs), busy=frozenset(busy))

    def _follow(self) -> None:
        """Start the observer, unless it gave up (warned) or the experiment is not there
        yet (tried again at the next look)."""
        if self._gave_up or self._closed or not self.experiment.is_dir():
            return
        tree_events.stop_following(self._observer)
        self._observer = tree_events.follow_tree(
            self.experiment, self._notice, WATCHED_EVENTS, "the TUI's change feed"
        )
        self._gave_up = self._observer is None
        with self._lock:
            self._lost = self._resync = True

    def _notice(self, event: FileSystemEvent) -> None:
        """From watchdog's thread: note which run or busy record an event is about."""
        self.events_seen += 1
        with self._lock:
            for path in (event.src_path, event.dest_path):
                if path:
                    self._note(os.fsdecode(path))

    def _note(self, path: str) -> None:
        relative = os.path.relpath(path, self._root)
        if relative == ".":  # the experiment directory itself went
            self._lost = True
            return
        parts = relative.split(os.sep)
        head = parts[0]
        if layout.is_run_dir_name(head):
            if len(parts) == 1:
                self._pending_runs.add(head)
                self._resync = True
            elif parts[1] in _RUN_SUBDIRS or (len(parts) == 2 and parts[1] in _RUN_ENTRIES):
                self._pending_runs.add(head)
        elif head == self._busy_name:
            if len(parts) == 1:
                self._lost = True  # records written before it was watched: list them all
            elif len(parts) == 2:
                self._pending_busy.add(parts[1])

    def _check_watches(self) -> None:
        """Which runs have a directory that got no watch (out of inotify watches)."""
        wanted: dict[Path, str] = {}
        for run_id in self._runs:
            run = layout.run_dir(self.experiment, run_id)
            for directory in (run, layout.control_dir(run), layout.broadcasts_dir(run)):
                wanted[directory] = run_id
        self._unwatched = {wanted[path] for path in tree_events.unwatched(wanted)}
        if self._unwatched and not self._warned_unwatched:
            self._warned_unwatched = True
            tree_events.warn_out_of_watches("the TUI's change feed")

    def _slice(self) -> list[str]:
        """The next runs in turn, so that every run is looked at once per full pass."""
        if not self._runs or self._full_pass_looks is None:
            return []
        size = math.ceil(len(self._runs) / self._full_pass_looks)
        start = self._next_slice % len(self._runs)
        self._next_slice = start + size
        # Indexed around the end, not a rotated copy of every run: this runs every poll.
        return [self._runs[(start + index) % len(self._runs)] for index in range(size)]
