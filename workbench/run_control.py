"""Reading and writing a run's control files: eviction, rejection, finish.

These small files are how every process tells the others what happened to a run
(docs/contracts.md). They are plain text a user can `cat`; each is written atomically.
The module has no heavy imports so the CLI and TUI stay quick to start.

`evicted.txt` holds the reason first (possibly several lines), then two metadata lines:

    Run exceeded memory limits
    evicted_at: 2026-11-21T20:00:00+00:00
    evicted_by: trainer
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from workbench import layout
from workbench.clock import now_iso

_META_KEYS = ("evicted_at", "evicted_by")


@dataclass(frozen=True)
class Eviction:
    reason: str
    evicted_at: str | None
    evicted_by: str | None


def evict(run: Path, reason: str, by: str) -> tuple[Eviction, bool]:
    """Evict a run unless it is evicted already: how the CLI, the TUI and the supervisor
    evict. Returns the eviction in force (an earlier one keeps its reason) and whether it
    was there before. Raises FileNotFoundError when the run directory is gone: writing
    would bring a deleted run back."""
    existing = read_eviction(run)
    if existing is not None:
        return existing, True
    if not run.is_dir():
        raise FileNotFoundError(f"{run} is gone")
    return write_eviction(run, reason, by), False


def write_eviction(run: Path, reason: str, by: str) -> Eviction:
    """Write `control/evicted.txt` (a run that evicts itself: the trainer, an orchestrator).
    The reason must say what to do next."""
    eviction = Eviction(
        reason=reason.strip() or "no reason given", evicted_at=now_iso(), evicted_by=by
    )
    text = (
        f"{eviction.reason}\nevicted_at: {eviction.evicted_at}\nevicted_by: {eviction.evicted_by}\n"
    )
    layout.atomic_write_text(layout.evicted_path(run), text)
    return eviction


def read_eviction(run: Path) -> Eviction | None:
    try:
        text = layout.evicted_path(run).read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        return None
    lines = text.rstrip("\n").splitlines()
    meta: dict[str, str] = {}
    while lines and lines[-1].split(":", 1)[0] in _META_KEYS:
        key, _, value = lines.pop().partition(":")
        meta[key] = value.strip()
    reason = "\n".join(lines).strip() or "no reason given"
    return Eviction(
        reason=reason, evicted_at=meta.get("evicted_at"), evicted_by=meta.get("evicted_by")
    )


def clear_eviction(run: Path) -> bool:
    """Remove `evicted.txt` (restarting a run); True if there was one."""
    try:
        layout.evicted_path(run).unlink()
        return True
    except FileNotFoundError:
        return False


def write_validation_error(run: Path, message: str) -> None:
    """Record why a run's config was rejected; rewritten only when the message changes."""
    path = layout.validation_error_path(run)
    text = message.rstrip("\n") + "\n"
    with contextlib.suppress(FileNotFoundError):
        if path.read_text(encoding="utf-8") == text:
            return
    layout.atomic_write_text(path, text)


def read_validation_error(run: Path) -> str | None:
    try:
        return (
            layout.validation_error_path(run).read_text(encoding="utf-8", errors="replace").strip()
        )
    except (FileNotFoundError, NotADirectoryError):
        return None


def clear_validation_error(run: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        layout.validation_error_path(run).unlink()


def mark_finished(run: Path, step: int) -> None:
    layout.atomic_write_text(
        layout.finished_path(run), f"finished at step {step}\nfinished_at: {now_iso()}\n"
    )


def is_finished(run: Path) -> bool:
    return layout.finished_path(run).is_file()
