"""Where a slow key's or poll's time went, in the TUI's own process.

A latency is split, for the thread that lived it (the event loop's for a key, the poll
worker's for a poll), into:

- `cpu_ms`: the thread running (`time.thread_time`);
- `cpu_wait_ms`: the thread ready to run while the kernel ran something else: its
  run-queue delay (`/proc/thread-self/schedstat`, Linux; absent elsewhere);
- `other_ms`: the rest: the thread blocked (on the interpreter another thread holds, on
  the disk) or, for a key, the event loop idle until the frame came;
- `gc_ms`, which overlaps the others: Python's cyclic collector running, in any thread of
  the process (it holds the interpreter, so every thread waits for it): within `cpu_ms`
  (and `cpu_wait_ms`, if the kernel ran something else meanwhile) when this thread
  collected, within `other_ms` when another did;
- `others_cpu_ms`, which overlaps `other_ms`: the process's other threads running
  meanwhile (their schedstat, Linux). Python code runs one thread at a time, so a thread
  blocked while the others ran about as long waited for the interpreter; blocked while
  they did not, it waited for something else (the disk, a lock). A thread that ended
  meanwhile takes its time with it: a floor, not a sum.

So a slow key says whether the machine was out of CPU for the TUI, the collector stalled
it, or the app's own work (or another of its threads) did.
"""

from __future__ import annotations

import gc
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEDSTAT = Path("/proc/thread-self/schedstat")
TASKS = Path("/proc/self/task")
# Collections remembered for the breakdowns: a few seconds' worth at the TUI's rate.
RECENT_COLLECTIONS = 256


def run_queue_delay_s() -> float | None:
    """Seconds the calling thread has spent ready to run but not running; None where the
    kernel does not say (no schedstat)."""
    try:
        fields = SCHEDSTAT.read_text().split()
        return int(fields[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def other_threads_cpu_s() -> float | None:
    """CPU seconds the process's threads other than the caller have run so far; None where
    the kernel does not say."""
    me = str(threading.get_native_id())
    total_ns = 0
    try:
        tasks = list(TASKS.iterdir())
    except OSError:
        return None
    for task in tasks:
        if task.name == me:
            continue
        try:
            total_ns += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue  # ended since it was listed
    return total_ns / 1e9


@dataclass(frozen=True)
class Mark:
    wall_s: float
    cpu_s: float
    cpu_wait_s: float | None
    gc_s: float
    others_cpu_s: float | None = None


@dataclass(frozen=True)
class Collection:
    """One run of the collector: which generation, how long, how many objects it freed."""

    generation: int
    started_s: float  # perf_counter
    seconds: float
    collected: int


@dataclass(frozen=True)
class Breakdown:
    wall_s: float
    cpu_s: float
    cpu_wait_s: float | None
    gc_s: float
    collections: tuple[Collection, ...] = ()
    others_cpu_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        wait = self.cpu_wait_s
        other = self.wall_s - self.cpu_s - (wait or 0.0)
        others = self.others_cpu_s
        return {
            "ms": round(1000 * self.wall_s, 1),
            "cpu_ms": round(1000 * self.cpu_s, 1),
            "cpu_wait_ms": None if wait is None else round(1000 * wait, 1),
            "gc_ms": round(1000 * self.gc_s, 1),
            "other_ms": round(1000 * max(other, 0.0), 1),
            "others_cpu_ms": None if others is None else round(1000 * max(others, 0.0), 1),
            # [generation, ms, objects freed] of each collection that ran meanwhile
            "collections": [
                [c.generation, round(1000 * c.seconds, 1), c.collected] for c in self.collections
            ],
        }


class StallMeter:
    """Marks and breakdowns for one process; `close()` removes its collector callback."""

    def __init__(self) -> None:
        self._gc_s = 0.0
        self._gc_started: float | None = None
        # The collections of the last few seconds, for the breakdowns that span them.
        self._collections: deque[Collection] = deque(maxlen=RECENT_COLLECTIONS)
        gc.callbacks.append(self._on_gc)

    def close(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started is not None:
            seconds = time.perf_counter() - self._gc_started
            self._gc_s += seconds
            self._collections.append(
                Collection(info["generation"], self._gc_started, seconds, info["collected"])
            )
            self._gc_started = None

    def mark(self) -> Mark:
        """Now, in the calling thread."""
        return Mark(
            time.perf_counter(),
            time.thread_time(),
            run_queue_delay_s(),
            self._gc_s,
            other_threads_cpu_s(),
        )

    def since(self, mark: Mark, until_s: float | None = None) -> Breakdown:
        """From `mark` to now (or to `until_s` on the wall clock), in the thread that made
        `mark`."""
        wait = run_queue_delay_s()
        others = other_threads_cpu_s()
        return Breakdown(
            wall_s=(until_s if until_s is not None else time.perf_counter()) - mark.wall_s,
            cpu_s=time.thread_time() - mark.cpu_s,
            cpu_wait_s=None if wait is None or mark.cpu_wait_s is None else wait - mark.cpu_wait_s,
            gc_s=self._gc_s - mark.gc_s,
            collections=tuple(c for c in list(self._collections) if c.started_s >= mark.wall_s),
            others_cpu_s=None
            if others is None or mark.others_cpu_s is None
            else others - mark.others_cpu_s,
        )


def slowest(breakdowns: list[tuple[str, Breakdown]], count: int = 5) -> list[dict[str, Any]]:
    """The `count` slowest, each with what it was ("enter", "poll") and its parts."""
    ranked = sorted(breakdowns, key=lambda item: item[1].wall_s, reverse=True)[:count]
    return [{"what": what, **breakdown.to_json()} for what, breakdown in ranked]


def mean_of_tail(breakdowns: list[Breakdown], share: float = 0.05) -> dict[str, Any] | None:
    """The mean parts of the slowest `share` (at least one): what the p95 is made of."""
    if not breakdowns:
        return None
    tail = sorted(breakdowns, key=lambda b: b.wall_s, reverse=True)
    tail = tail[: max(1, round(len(tail) * share))]
    waits = [b.cpu_wait_s for b in tail]
    others = [b.others_cpu_s for b in tail]
    mean = Breakdown(
        wall_s=sum(b.wall_s for b in tail) / len(tail),
        cpu_s=sum(b.cpu_s for b in tail) / len(tail),
        cpu_wait_s=None if None in waits else sum(waits) / len(tail),  # type: ignore[arg-type]
        gc_s=sum(b.gc_s for b in tail) / len(tail),
        others_cpu_s=None if None in others else sum(others) / len(tail),  # type: ignore[arg-type]
    )
    parts = mean.to_json()
    del parts["collections"]  # each one's own, not a mean's
    return {"n": len(tail), **parts}
