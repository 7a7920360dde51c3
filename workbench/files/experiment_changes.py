"""Which of an experiment's runs changed since the last look, from the kernel's file events.

A reader that looks at every run each second (the TUI) would otherwise pay for every run
each time: a few `stat`s per run, hundreds of runs in a sweep. With this it pays for what
changed. One inotify descriptor, read without blocking at each look, so there is no thread
and nothing to lock; its watches are non-recursive (logs, rollouts and checkpoints change
all the time and none of them is read for a run's status):

- the experiment directory: a run directory appears or goes; `busy/` appears;
- each run directory: `metrics.jsonl` appended, `control/` or `broadcast/` made;
- each run's `control/`: evicted, finished, rejected, `orch.toml` replaced or edited;
- each run's `broadcast/`: a step added (its STABLE marker lands one level further down,
  which readers handle as they always did: a pending broadcast is looked at again);
- `busy/`: a process's record of where its time goes rewritten.

`take()` says what had events since the last call (`Changes`). It cannot tell everything:

- without inotify (not Linux, or out of inotify instances) or when the kernel's queue
  overflowed and events were lost, it says `everything`;
- a run whose directories it could not watch (out of watches) is reported changed at
  every look;
- a file system whose writes come from another machine (NFS) sends no events for them:
  every look adds a slice of the other runs in turn, so that each run is looked at again
  at least every `FULL_PASS_LOOKS` looks.

A reader treats the runs it is told about as it treated every run before: their files'
signatures still decide whether they are read again.
"""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.files import layout

try:  # Linux only: elsewhere every look covers everything, as before file events.
    from inotify_simple import INotify, flags
except ImportError:  # pragma: no cover - not on the Linux machines this is tested on
    INotify = None  # type: ignore[assignment,misc]

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

_EXPERIMENT, _RUN, _RUN_SUBDIR, _BUSY = "experiment", "run", "run subdirectory", "busy"


@dataclass(frozen=True)
class Changes:
    """What may have changed since the last look."""

    everything: bool = False  # events may have been lost: look at everything
    runs: frozenset[str] = field(default_factory=frozenset)  # run ids
    busy: frozenset[str] = field(default_factory=frozenset)  # names of files in busy/


EVERYTHING = Changes(everything=True)


class ExperimentChanges:
    """Follows one experiment's run files through inotify (see the module docstring)."""

    def __init__(self, experiment: Path, full_pass_looks: int | None = FULL_PASS_LOOKS) -> None:
        """`full_pass_looks`: every run is reported at least once in this many looks, events
        or not; None: only the runs that had events (for tests of the events alone)."""
        self.experiment = experiment
        self._full_pass_looks = full_pass_looks
        self._inotify = open_inotify()
        # Each watch notes (kind, run id) of its directory.
        self._watches = DirectoryWatches(self._inotify, _MASK)
        self._runs: list[str] = []  # every run directory, sorted: the slices' order
        self._unwatched: set[str] = set()  # runs with a directory that could not be watched
        self._next_slice = 0
        # The first look covers everything: nothing was watched before it.
        self._lost = True
        self._resync = True

    @property
    def watching(self) -> bool:
        """Whether events are followed at all (else every look says `everything`)."""
        return self._inotify is not None and not self._inotify.closed

    def close(self) -> None:
        """Stop following events; a look from another thread meanwhile says `everything`."""
        if self._inotify is not None:
            with contextlib.suppress(OSError):
                self._inotify.close()

    def take(self) -> Changes:
        """What had events since the last call, plus this look's slice of the other runs.
        Call it before reading: an event that comes during the read is in the next answer."""
        if not self.watching:
            return EVERYTHING
        runs: set[str] = set()
        busy: set[str] = set()
        try:
            for event in self._inotify.read(timeout=0):
                self._note(event, runs, busy)
            if self._resync or self.experiment.as_posix() not in self._watches:
                self._resync = False
                runs.update(self._sync())
        except (OSError, ValueError) as err:  # ValueError: closed by another thread
            log.debug("inotify failed (%s): looking at everything from now on", err)
            self.close()
            return EVERYTHING
        everything, self._lost = self._lost, False
        if everything or self.experiment.as_posix() not in self._watches:
            return EVERYTHING
        runs.update(self._unwatched, self._slice())
        return Changes(runs=frozenset(runs), busy=frozenset(busy))

    def _note(self, event, runs: set[str], busy: set[str]) -> None:
        if event.mask & flags.Q_OVERFLOW:
            self._lost = True
            return
        kind, run_id = self._watches.note(event.wd) or (None, None)
        if event.mask & (flags.IGNORED | flags.MOVE_SELF):  # the directory went
            if event.mask & flags.MOVE_SELF:  # its watch would follow it elsewhere
                with contextlib.suppress(OSError):
                    self._inotify.rm_watch(event.wd)
            self._watches.forget(event.wd)
            self._resync = True
            if run_id is not None:
                runs.add(run_id)
            return
        if kind == _EXPERIMENT:
            if layout.is_run_dir_name(event.name):
                runs.add(event.name)
                self._resync = True
            elif event.name == layout.busy_dir(self.experiment).name:
                self._resync = True
                self._lost = True  # records written before its watch: list them all
        elif kind == _RUN:
            if event.name in _RUN_ENTRIES:
                runs.add(run_id)
                if event.mask & flags.ISDIR:
                    self._resync = True
        elif kind == _RUN_SUBDIR:
            runs.add(run_id)
        elif kind == _BUSY:
            busy.add(event.name)

    def _sync(self) -> set[str]:
        """Watch what exists and is not watched yet; returns the runs newly watched, whose
        files may have changed before their watches were in place."""
        added: set[str] = set()
        self._watch(self.experiment, _EXPERIMENT, None)
        self._watch(layout.busy_dir(self.experiment), _BUSY, None)
        runs = [run.name for run in layout.list_run_dirs(self.experiment)]
        self._unwatched.intersection_update(runs)
        for run_id in runs:
            run = layout.run_dir(self.experiment, run_id)
            watched = [
                self._watch(run, _RUN, run_id),
                self._watch(layout.control_dir(run), _RUN_SUBDIR, run_id),
                self._watch(layout.broadcasts_dir(run), _RUN_SUBDIR, run_id),
            ]
            if any(outcome == "added" for outcome in watched):
                added.add(run_id)
            if "failed" in watched:
                self._unwatched.add(run_id)
            else:
                self._unwatched.discard(run_id)
        self._runs = runs
        return added

    def _watch(self, path: Path, kind: str, run_id: str | None) -> str:
        """What came of watching `path` (`DirectoryWatches.add`)."""
        return self._watches.add(path.as_posix(), (kind, run_id))

    def _slice(self) -> list[str]:
        """The next runs in turn, so that every run is looked at once per full pass."""
        if not self._runs or self._full_pass_looks is None:
            return []
        size = math.ceil(len(self._runs) / self._full_pass_looks)
        start = self._next_slice % len(self._runs)
        self._next_slice = start + size
        # Indexed around the end, not a rotated copy of every run: this runs every poll.
        return [self._runs[(start + index) % len(self._runs)] for index in range(size)]


_MASK = 0
if INotify is not None:
    _MASK = (
        flags.CREATE
        | flags.DELETE
        | flags.MODIFY
        | flags.CLOSE_WRITE
        | flags.MOVED_FROM
        | flags.MOVED_TO
        | flags.ATTRIB
        | flags.DELETE_SELF
        | flags.MOVE_SELF
        | flags.ONLYDIR
    )


class DirectoryWatches:
    """One inotify descriptor's watches, by directory and by watch descriptor, each with
    what its owner notes about it (`ExperimentChanges`, the supervisor's run directory
    watcher)."""

    def __init__(self, inotify: Any, mask: int) -> None:
        self.inotify = inotify
        self._mask = mask
        self._by_path: dict[str, int] = {}
        self._by_wd: dict[int, tuple[str, Any]] = {}  # wd -> (path, note)

    def __contains__(self, path: str) -> bool:
        return path in self._by_path

    def paths(self) -> list[str]:
        return list(self._by_path)

    def path(self, wd: int) -> str | None:
        """The directory a watch descriptor watches, if it is one of these watches."""
        watched = self._by_wd.get(wd)
        return None if watched is None else watched[0]

    def note(self, wd: int) -> Any:
        watched = self._by_wd.get(wd)
        return None if watched is None else watched[1]

    def note_of(self, path: str) -> Any:
        return self._by_wd[self._by_path[path]][1]

    def add(self, path: str, note: Any) -> str:
        """What came of watching `path`: "watched" (already), "added", "absent" (not there:
        its parent's events tell when it is) or "failed" (there, but no watch: out of
        inotify watches)."""
        if path in self._by_path:
            return "watched"
        try:
            wd = self.inotify.add_watch(path, self._mask)
        except (FileNotFoundError, NotADirectoryError):
            return "absent"
        except OSError as err:
            log.debug("cannot watch %s: %s", path, err)
            return "failed"
        # A descriptor the kernel hands out again is the same inode watched twice (a
        # directory renamed into place): the newest path names it.
        self.forget(wd)
        self._by_path[path] = wd
        self._by_wd[wd] = (path, note)
        return "added"

    def remove(self, path: str) -> None:
        """Stop watching `path` (its watch may be gone already, with its directory)."""
        wd = self._by_path[path]
        with contextlib.suppress(OSError):
            self.inotify.rm_watch(wd)
        self.forget(wd)

    def forget(self, wd: int) -> None:
        """Drop a watch the kernel ended (its directory went) or that was removed."""
        watched = self._by_wd.pop(wd, None)
        if watched is not None and self._by_path.get(watched[0]) == wd:
            del self._by_path[watched[0]]


def open_inotify():
    """An inotify descriptor, or None where there is none to have (not Linux, or out of
    instances): the caller then finds changes by looking."""
    if INotify is None:
        return None
    try:
        return INotify()
    except OSError as err:  # out of inotify instances (fs.inotify.max_user_instances)
        log.debug("no inotify (%s): every look covers everything", err)
        return None
