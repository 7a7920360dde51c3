"""Watching process trees from /proc while a benchmark's experiments run: memory and CPU.

Every `interval_s` a thread reads every process's stat fields once (`procfs.all_stats`)
and, for each watched root (a `workbench up`), the tree below it: the RSS of its members
summed (peak per tree, and the peak of all trees together at one moment) and each member's
own CPU time so far, by role. A member's role is that of its nearest ancestor, itself
included, whose command line names one: `inference` (vLLM), `trainer` (torchrun and its
ranks), `orchestrator`, `supervisor`, else `up`. A process's CPU time is the last value
seen before it exited: up to one interval of it is missed, and processes that lived less
than an interval not at all; the kernel's exact sum of a whole tree is what
`headless.run_accounted` reports.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from workbench.system.procfs import ProcStat, all_stats, process_cmdline

ROLE_MARKERS = (
    ("inference", ("workbench.inference", "vllm")),
    ("trainer", ("torch.distributed.run", "torchrun", "workbench.trainer")),
    ("orchestrator", ("workbench.orchestrator",)),
    ("supervisor", ("workbench.supervisor",)),
)
ROLES = ("inference", "trainer", "orchestrator", "supervisor", "up")


def role_of(cmdline: list[str]) -> str | None:
    """The role a command line names, if any."""
    text = " ".join(cmdline)
    for role, markers in ROLE_MARKERS:
        if any(marker in text for marker in markers):
            return role
    return None


def tree_members(root: int, stats: list[ProcStat]) -> list[ProcStat]:
    """`root` and every descendant of it, parents before children."""
    children: dict[int, list[ProcStat]] = defaultdict(list)
    by_pid = {}
    for stat in stats:
        children[stat.ppid].append(stat)
        by_pid[stat.pid] = stat
    if root not in by_pid:
        return []
    members, queue = [], [by_pid[root]]
    while queue:
        stat = queue.pop(0)
        members.append(stat)
        queue.extend(children.get(stat.pid, []))
    return members


@dataclass
class TreeWatch:
    """What was seen of one tree: its peak RSS and its members' CPU time by role."""

    name: str
    root: int
    peak_rss_bytes: int = 0
    # (pid, start) -> (role, own CPU seconds when last seen)
    cpu: dict[tuple[int, int], tuple[str, float]] = field(default_factory=dict)

    def cpu_by_role(self) -> dict[str, float]:
        totals = dict.fromkeys(ROLES, 0.0)
        for role, seconds in self.cpu.values():
            totals[role] += seconds
        return {role: round(seconds, 1) for role, seconds in totals.items()}

    def to_json(self) -> dict[str, Any]:
        return {
            "peak_rss_mb": round(self.peak_rss_bytes / 2**20),
            "cpu_s_by_role": self.cpu_by_role(),
            "cpu_s_seen": round(sum(seconds for _, seconds in self.cpu.values()), 1),
        }


class TreeSampler:
    """Samples the watched trees every `interval_s` until stopped (a context manager)."""

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self.trees: list[TreeWatch] = []
        self.peak_total_rss_bytes = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tree-sampler", daemon=True)

    def watch(self, name: str, root: int) -> TreeWatch:
        tree = TreeWatch(name, root)
        with self._lock:
            self.trees.append(tree)
        return tree

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sample()
            except Exception:  # a process gone mid-read: the next sample reads again
                continue

    def sample(self) -> None:
        stats = all_stats()
        if stats is None:
            return
        with self._lock:
            trees = list(self.trees)
        total = 0
        for tree in trees:
            members = tree_members(tree.root, stats)
            rss = sum(member.rss_bytes for member in members if not member.exited)
            tree.peak_rss_bytes = max(tree.peak_rss_bytes, rss)
            total += rss
            roles: dict[int, str] = {}
            for member in members:  # parents first: a child inherits its parent's role
                key = (member.pid, member.start_ticks)
                if member.exited and key in tree.cpu:
                    # An exited process not yet reaped has no command line: it would pass
                    # for its parent's (an orchestrator's whole CPU counted as the
                    # supervisor's). It keeps the role it ran as.
                    roles[member.pid] = tree.cpu[key][0]
                else:
                    # Read every time: a forked child shows its parent's command line until
                    # it executes its own program.
                    own = role_of(process_cmdline(member.pid))
                    roles[member.pid] = own or roles.get(member.ppid, "up")
                tree.cpu[key] = (roles[member.pid], member.cpu_seconds)
        self.peak_total_rss_bytes = max(self.peak_total_rss_bytes, total)
