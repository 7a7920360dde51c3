"""Reading processes from /proc: one process's stat fields and command line, every process,
a parent's children, whether a pid still runs, when it started; the machine's available
memory and its processor's name.

The one reader of /proc for the supervisor (process families, pid checks), the trainer's
launcher (forwarding a stop to torchrun's workers), vLLM's memory check, the busy records
(a process's start) and the benchmarks (CPU time, memory, orphans). It imports nothing of
workbench, so any layer can use it. Where /proc cannot be read, the readers answer None or
nothing rather than raise.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/PID/stat that workbench reads (man 5 proc)."""

    pid: int
    state: str  # R running, S sleeping, D disk sleep, Z zombie, X dead, ...
    ppid: int
    pgrp: int
    session: int
    utime_ticks: int
    stime_ticks: int
    start_ticks: int = 0  # since boot
    rss_pages: int = 0

    @property
    def exited(self) -> bool:
        """A zombie (exited, not yet reaped) or dead: no longer running."""
        return self.state in ("Z", "X")

    @property
    def cpu_seconds(self) -> float:
        """User + system CPU time, its threads included, its children not."""
        return (self.utime_ticks + self.stime_ticks) / os.sysconf("SC_CLK_TCK")

    @property
    def rss_bytes(self) -> int:
        return self.rss_pages * os.sysconf("SC_PAGE_SIZE")


def read_stat(pid: int) -> ProcStat | None:
    """Fields of /proc/PID/stat, or None if there is no such process."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may itself contain spaces or ')'.
    fields = text[text.rfind(")") + 2 :].split()
    try:
        # After the name: state is field 3, ppid 4, pgrp 5, session 6, utime 14, stime 15,
        # starttime 22, rss 24.
        return ProcStat(
            pid,
            fields[0],
            int(fields[1]),
            int(fields[2]),
            int(fields[3]),
            int(fields[11]),
            int(fields[12]),
            start_ticks=int(fields[19]),
            rss_pages=int(fields[21]),
        )
    except (IndexError, ValueError):
        return None


def all_stats() -> list[ProcStat] | None:
    """Every process's stat fields (zombies included), or None when /proc cannot be listed."""
    try:
        entries = os.listdir(PROC)
    except OSError:
        return None
    stats = (read_stat(int(entry)) for entry in entries if entry.isdigit())
    return [stat for stat in stats if stat is not None]


def child_pids(parent: int) -> list[int]:
    """Processes whose parent is `parent` (zombies included); none when /proc cannot be read."""
    return [stat.pid for stat in all_stats() or [] if stat.ppid == parent]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process, its threads included, its children not."""
    stat = read_stat(pid)
    if stat is None:
        raise ProcessLookupError(f"no process {pid}")
    return stat.cpu_seconds


def process_is_alive(pid: int) -> bool:
    """True if `pid` runs; a zombie (exited, not yet reaped) is not alive."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # OverflowError: no pid can be that large
        return False
    except PermissionError:
        return True
    stat = read_stat(pid)
    return stat is None or not stat.exited


def process_cmdline(pid: int) -> list[str]:
    """The process's argv, or [] when it is gone (or a kernel thread)."""
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def process_started_at(pid: int) -> float | None:
    """When the process started, in unix seconds; None if it is gone or /proc is unreadable."""
    stat = read_stat(pid)
    boot = _boot_time()
    if stat is None or boot is None:
        return None
    return boot + stat.start_ticks / os.sysconf("SC_CLK_TCK")


def _boot_time() -> float | None:
    try:
        for line in (PROC / "stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def memory_available_bytes() -> int | None:
    """The kernel's estimate of memory available to new work (MemAvailable), or None."""
    return _meminfo_bytes("MemAvailable")


def memory_total_bytes() -> int | None:
    """The machine's memory (MemTotal), or None."""
    return _meminfo_bytes("MemTotal")


def _meminfo_bytes(field: str) -> int | None:
    try:
        for line in (PROC / "meminfo").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def processor_name() -> str | None:
    """The processor's model name (/proc/cpuinfo's first `model name`), or None."""
    try:
        text = (PROC / "cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            return value.strip()
    return None
