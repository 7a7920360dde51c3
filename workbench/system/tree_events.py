"""A directory's file events through watchdog's native observer, in a fixed number of
threads, and what to do when the operating system has no watch left to give.

`follow_tree(root, on_event, event_types, who, recursive=...)` schedules ONE watch of
`root` (with everything below it, or `root` alone) on watchdog's native observer
(inotify on Linux, FSEvents on macOS, ReadDirectoryChangesW on Windows). One schedule is
what keeps the threads few: watchdog runs a thread per schedule, plus its dispatcher
(and, for inotify, the descriptor's reader), so a follower costs three threads whatever
the number of directories below `root`. A schedule per directory cost two threads per
run (204 at 100 runs).

`event_types` is watchdog's `event_filter`: only those events reach `on_event`, and on
Linux the filter is also the kernel's mask, so events of other kinds are never even
queued. Leaving out `FileModifiedEvent` is what keeps logs quiet: a log written by a
process that keeps it open only ever sends "modified".

On Linux every directory watched takes one inotify watch (`fs.inotify.max_user_watches`
per user; a recursive schedule takes one per directory below the root) and the observer
one inotify instance (`fs.inotify.max_user_instances`). When either runs out, the
follower says so at WARNING, naming the limit and how to raise it, and its owner relies
on its periodic looks (`follow_tree` returns None; `unwatched` names the directories
below the root that got no watch).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sys
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver

log = logging.getLogger(__name__)

# watchdog (7.x) warns when a directory made just before its parent's watch was walked gets
# its watch twice (it keeps one): harmless, but every warning is unique (it prints every
# watched path), so each new run would add a page to the supervisor's log.
warnings.filterwarnings(
    "ignore", message="Callback with id .* already exists for watch", category=RuntimeWarning
)

# errno -> the sysctl that ran out; watchdog raises these from inotify_init/add_watch.
_LIMITS = {
    errno.ENOSPC: "fs.inotify.max_user_watches",
    errno.EMFILE: "fs.inotify.max_user_instances",
}
# What each limit is raised to in the advice: generous, and what most distributions'
# file-sync and IDE guides suggest.
_ADVISED = {"fs.inotify.max_user_watches": 524288, "fs.inotify.max_user_instances": 1024}


class _Forward(FileSystemEventHandler):
    def __init__(self, on_event: Callable[[FileSystemEvent], None]) -> None:
        self._on_event = on_event

    def on_any_event(self, event: FileSystemEvent) -> None:
        self._on_event(event)


def follow_tree(
    root: Path,
    on_event: Callable[[FileSystemEvent], None],
    event_types: Iterable[type[FileSystemEvent]] | None,
    who: str,
    *,
    recursive: bool = True,
) -> BaseObserver | None:
    """A started observer calling `on_event` (from its thread) for events of `event_types`
    (None: every kind) anywhere below `root` (in `root` itself only, if not `recursive`); None when there is no observer to have (`root` missing, or out
    of inotify instances or watches: then warned, naming `who` relies on rescans)."""
    try:
        observer = Observer()
    except OSError as err:
        warn_out_of_watches(who, err)
        return None
    try:
        observer.schedule(
            _Forward(on_event),
            os.fspath(root),
            recursive=recursive,
            event_filter=None if event_types is None else list(event_types),
        )
        observer.start()
    except OSError as err:
        with contextlib.suppress(Exception):
            observer.stop()
        if err.errno in (errno.ENOENT, errno.ENOTDIR):
            log.debug("%s: %s is not there yet: nothing to watch", who, root)
        else:
            warn_out_of_watches(who, err)
        return None
    return observer


def stop_following(observer: BaseObserver | None) -> None:
    if observer is None:
        return
    with contextlib.suppress(Exception):
        observer.stop()
        observer.join(timeout=2)


def warn_out_of_watches(who: str, err: OSError | None = None) -> None:
    """The warning a follower gives when it has no watch for something it should watch:
    `err` from watchdog, or None for a directory `unwatched` found without a watch."""
    if err is None:
        err = OSError(errno.ENOSPC, "inotify watch limit reached")
    limit = _LIMITS.get(err.errno or 0)
    if limit is None:
        log.warning("%s cannot watch for file events (%s); it looks every few seconds", who, err)
        return
    log.warning(
        "%s: out of inotify %s (%s = %s): changes are found by the rescans every few "
        "seconds instead of at once. Raise it with `sudo sysctl %s=%d` (and a line in "
        "/etc/sysctl.d/ to keep it after a reboot).",
        who,
        "watches" if err.errno == errno.ENOSPC else "instances",
        limit,
        _read_limit(limit),
        limit,
        _ADVISED[limit],
    )


def unwatched(directories: Iterable[Path]) -> list[Path]:
    """Those of `directories` that no inotify watch of this process covers: the kernel
    refused them a watch (watchdog skips a directory below the root it cannot watch
    without a word). Linux only (elsewhere the native observers watch a tree as one, and
    there is nothing per directory to run out of): [] there."""
    if not sys.platform.startswith("linux"):
        return []
    watched = _watched_inodes()
    missing = []
    for directory in directories:
        try:
            inode = directory.stat().st_ino
        except OSError:  # gone meanwhile: nothing to watch
            continue
        if inode not in watched:
            missing.append(directory)
    return missing


def _watched_inodes() -> set[int]:
    """The inodes this process's inotify descriptors watch, from /proc/self/fdinfo (one
    `inotify wd:.. ino:..` line per watch)."""
    inodes: set[int] = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") != "anon_inode:inotify":
                continue
            with open(f"/proc/self/fdinfo/{fd}") as info:
                for line in info:
                    if line.startswith("inotify "):
                        inodes.add(int(line.split(" ino:", 1)[1].split(None, 1)[0], 16))
        except OSError:  # closed meanwhile
            continue
    return inodes


def _read_limit(name: str) -> str:
    try:
        return Path("/proc/sys", *name.split(".")).read_text().strip()
    except OSError:
        return "unknown"
