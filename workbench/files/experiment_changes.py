"""Which of an experiment's runs changed since the last look.

A reader that looks at every run each second (the TUI) would otherwise pay for every run
each time: a few `stat`s per run and more, hundreds of runs in a sweep. With this it pays
for what changed:

- run directories appearing and going come from watchdog's native observer: one schedule
  of the experiment directory itself, not recursive (`workbench.system.tree_events`: three
  threads and one kernel watch whatever the number of runs);
- what changed inside a run comes from one `stat` each of the few paths a run's status
  and curves are read from: `metrics.jsonl` (appended), `control/` (a control file
  written, renamed into place or deleted), `control/orch.toml` (edited in place) and
  `broadcast/` (a step added); `busy/`'s records from `busy/` itself (they are renamed
  into it) and, when it changed, a `stat` of each record.
Logs, rollouts and checkpoints are never looked at. A recursive schedule would tell the
same by events, but on Linux every file a run's step writes (rollouts, checkpoints,
broadcasts, staged and pruned) is an event through watchdog's Python threads: about 4x the
TUI reader's CPU at 300 runs stepping every 10 s, where these `stat`s cost it a few ms a
look (docs/discovery.md).

`take()` says what changed since the last call (`Changes`). It cannot tell everything:

- with no observer (out of inotify instances or watches, or the experiment directory
  not made yet) it says `everything`, and so does the first look;
- a change that keeps a path's signature (two within one tick of the file system's
  clock, a broadcast's STABLE marker one level further down) is not seen by its `stat`:
  every look adds a slice of the other runs in turn, so that each run is looked at again
  at least every `FULL_PASS_LOOKS` looks.

A reader treats the runs it is told about as it treated every run before: their files'
signatures still decide whether they are read again.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from watchdog.events import DirCreatedEvent, DirDeletedEvent, DirMovedEvent, FileSystemEvent
from watchdog.observers.api import BaseObserver

from workbench.files import layout
from workbench.system import tree_events
from workbench.system.file_change import Signature, signature

log = logging.getLogger(__name__)

# Every run is looked at again at least once in this many looks, events or not.
FULL_PASS_LOOKS = 10

# What a run's status and curves are read from, relative to its directory: one `stat` each,
# control/ first. An ended run (finished or evicted) costs the first alone: it changes
# through control/ (a restart lifts its marker), and a record it gets after it ended (an
# update of a batch sent before) is seen by the slice of the other runs.
_SWEPT = tuple(
    os.fspath(path.relative_to("run"))
    for path in (
        layout.control_dir(Path("run")),
        layout.metrics_path(Path("run")),
        layout.orch_config_path(Path("run")),
        layout.broadcasts_dir(Path("run")),
    )
)
# The markers of an ended run, looked for when its control/ changes.
_ENDED = tuple(
    os.fspath(path.relative_to("run"))
    for path in (layout.finished_path(Path("run")), layout.evicted_path(Path("run")))
)
# A run directory made, deleted or renamed (watchdog tells a rename from or to elsewhere
# as deleted or made).
WATCHED_EVENTS: tuple[type[FileSystemEvent], ...] = (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
)


@dataclass(frozen=True)
class Changes:
    """What may have changed since the last look."""

    everything: bool = False  # events may have been lost: look at everything
    runs: frozenset[str] = field(default_factory=frozenset)  # run ids
    busy: frozenset[str] = field(default_factory=frozenset)  # names of files in busy/


EVERYTHING = Changes(everything=True)


class ExperimentChanges:
    """Follows one experiment's runs (see the module docstring)."""

    def __init__(self, experiment: Path, full_pass_looks: int | None = FULL_PASS_LOOKS) -> None:
        """`full_pass_looks`: every run is reported at least once in this many looks,
        changed or not; None: only the runs that changed (for tests of the changes alone)."""
        self.experiment = experiment
        self._root = os.fsdecode(experiment)
        self._full_pass_looks = full_pass_looks
        self._lock = threading.Lock()  # the three below: set by watchdog's thread
        self._pending_runs: set[str] = set()
        self._lost = True  # the first look covers everything
        self._resync = True
        self._closed = False
        self._observer: BaseObserver | None = None
        self._gave_up = False  # out of watches or instances: warned, not tried again
        self._runs: list[str] = []  # every run directory, sorted: the slices' order
        self._run_signatures: dict[str, tuple[Signature, ...]] = {}
        self._ended: set[str] = set()  # runs whose control/ held an end marker last look
        self._busy_signature: Signature = None
        self._busy_records: dict[str, Signature] = {}
        self._next_slice = 0
        self.events_seen = 0  # every event the filter let through (for benchmarks)
        self._follow()

    @property
    def watching(self) -> bool:
        """Whether run directories are followed at all (else every look says
        `everything`)."""
        observer = self._observer
        return observer is not None and observer.is_alive() and not self._closed

    def close(self) -> None:
        """Stop following events; a look from another thread meanwhile says `everything`."""
        self._closed = True
        observer, self._observer = self._observer, None
        tree_events.stop_following(observer)

    def take(self) -> Changes:
        """What changed since the last call, plus this look's slice of the other runs.
        Call it before reading: a change made during the read is in the next answer."""
        if self._closed:
            return EVERYTHING
        if not self.watching:
            self._follow()
            if not self.watching:
                return EVERYTHING
        with self._lock:
            runs, self._pending_runs = self._pending_runs, set()
            everything, self._lost = self._lost, False
            resync, self._resync = self._resync, False
        if resync:
            self._runs = [run.name for run in layout.list_run_dirs(self.experiment)]
        runs.update(self._changed_runs())
        busy = self._changed_busy_records()
        if everything:
            return EVERYTHING
        runs.update(self._slice())
        return Changes(runs=frozenset(runs), busy=frozenset(busy))

    def _follow(self) -> None:
        """Start the observer, unless it gave up (warned) or the experiment is not there
        yet (tried again at the next look)."""
        if self._gave_up or self._closed or not self.experiment.is_dir():
            return
        tree_events.stop_following(self._observer)
        self._observer = tree_events.follow_tree(
            self.experiment,
            self._notice,
            WATCHED_EVENTS,
            "the TUI's change feed",
            recursive=False,
        )
        self._gave_up = self._observer is None
        with self._lock:
            self._lost = self._resync = True

    def _notice(self, event: FileSystemEvent) -> None:
        """From watchdog's thread: a run directory appeared, went or was renamed."""
        self.events_seen += 1
        with self._lock:
            for path in (event.src_path, event.dest_path):
                if not path:
                    continue
                parent, name = os.path.split(os.fsdecode(path))
                if parent == self._root and layout.is_run_dir_name(name):
                    self._pending_runs.add(name)
                    self._resync = True
                elif os.fsdecode(path) == self._root:  # the experiment directory went
                    self._lost = True

    def _changed_runs(self) -> set[str]:
        """The runs whose swept paths' signatures changed since the last look."""
        changed = set()
        signatures = {}
        ended = set()
        for run_id in self._runs:
            run = os.path.join(self._root, run_id)
            before = self._run_signatures.get(run_id)
            control = signature(os.path.join(run, _SWEPT[0]))
            if before is not None and before[0] == control and run_id in self._ended:
                signatures[run_id] = before  # ended, and still: control/ is unchanged
                ended.add(run_id)
                continue
            now = (control, *(signature(os.path.join(run, name)) for name in _SWEPT[1:]))
            signatures[run_id] = now
            if before != now:
                changed.add(run_id)
            # An end marker comes and goes only by a change of control/.
            if (before is None or before[0] != control) and any(
                os.path.exists(os.path.join(run, name)) for name in _ENDED
            ):
                ended.add(run_id)
        self._run_signatures = signatures
        self._ended = ended
        return changed

    def _changed_busy_records(self) -> set[str]:
        """The busy records rewritten or removed since the last look: they are renamed
        into `busy/`, which changes its signature, so an unchanged `busy/` costs one stat."""
        busy = layout.busy_dir(self.experiment)
        directory = signature(busy)
        if directory == self._busy_signature:
            return set()
        self._busy_signature = directory
        records: dict[str, Signature] = {}
        with contextlib.suppress(OSError):
            for entry in os.scandir(busy):
                records[entry.name] = signature(entry.path)
        changed = {name for name, sig in records.items() if self._busy_records.get(name) != sig}
        changed.update(set(self._busy_records) - set(records))
        self._busy_records = records
        return changed

    def _slice(self) -> list[str]:
        """The next runs in turn, so that every run is looked at once per full pass."""
        if not self._runs or self._full_pass_looks is None:
            return []
        size = math.ceil(len(self._runs) / self._full_pass_looks)
        start = self._next_slice % len(self._runs)
        self._next_slice = start + size
        # Indexed around the end, not a rotated copy of every run: this runs every poll.
        return [self._runs[(start + index) % len(self._runs)] for index in range(size)]
