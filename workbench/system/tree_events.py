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
on its periodic looks (`follow_tree` returns None). watchdog skips a directory below the
root that it cannot watch without a word: the followers here schedule the experiment
directory alone, so that does not arise.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver

log = logging.getLogger(__name__)

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


def warn_out_of_watches(who: str, err: OSError) -> None:
    """The warning a follower gives when watchdog could not watch (`err`)."""
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


def _read_limit(name: str) -> str:
    try:
        return Path("/proc/sys", *name.split(".")).read_text().strip()
    except OSError:
        return "unknown"
