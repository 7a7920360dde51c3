"""Reading and writing a run's control files: eviction, rejection, finish; and what
they add up to, the run's condition (`run_condition`).

These small files are how every process tells the others what happened to a run
(docs/contracts.md). They are plain text a user can `cat`; each is written atomically.
The module has no heavy imports so the CLI and TUI stay quick to start.

A run's condition is decided here alone, so that `workbench status`, the TUI, the
supervisor and the trainer never disagree about a run: evicted, else rejected, else
finished, else open (nothing in `control/` holds it back). A rejection of an
`orch.toml` that has changed since is still a rejection to everyone but the trainer,
which looks at the run again and clears it if the new file is valid (`reconsidered`).

`evicted.txt` holds the reason first (possibly several lines), then two metadata lines:

    Run exceeded memory limits
    evicted_at: 2026-11-21T20:00:00+00:00
    evicted_by: trainer

An eviction whose reason starts with `diverged:` is a divergence: the trainer evicted the
run because its training stopped producing finite numbers (`workbench.trainer.runs.divergence`).
It is an eviction like any other to the processes (the trainer lets the run go, its
orchestrator stops, `workbench restart` lifts it); readers that show runs call it
`diverged` (`RunCondition.status`, `is_divergence`).

`config_validation_error.txt` holds why the run's config was rejected (by the trainer at
discovery, or by the run's orchestrator when it starts), then which `control/orch.toml`
it rejected, so that an edited config is looked at again:

    control/orch.toml: env: unknown environment 'nope'; ...
    rejected_config: 1837 1763751600000000000 412
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from workbench.files import layout
from workbench.system.clock import now_iso

_META_KEYS = ("evicted_at", "evicted_by")
# How the reason of an eviction for divergence begins: the trainer's
# `diverged: gradient norm nan at updates 3-5 ...`.
DIVERGED = "diverged"
DIVERGED_PREFIX = f"{DIVERGED}:"
_REJECTED_CONFIG = "rejected_config"


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


def is_divergence(reason: str | None) -> bool:
    """Whether an eviction's reason says the run diverged (the trainer's `diverged: ...`)."""
    return reason is not None and reason.startswith(DIVERGED_PREFIX)


def clear_eviction(run: Path) -> bool:
    """Remove `evicted.txt` (restarting a run); True if there was one."""
    try:
        layout.evicted_path(run).unlink()
        return True
    except FileNotFoundError:
        return False


def config_signature(stat: os.stat_result) -> str:
    """Which file a `stat` of `control/orch.toml` saw: inode (a rename writes a new one),
    modification time and size."""
    return f"{stat.st_ino} {stat.st_mtime_ns} {stat.st_size}"


def current_config_signature(run: Path) -> str | None:
    try:
        return config_signature(layout.orch_config_path(run).stat())
    except (FileNotFoundError, NotADirectoryError):
        return None


def write_validation_error(run: Path, message: str, config: str | None = None) -> None:
    """Record why a run's config was rejected, and which one (`config_signature` of the
    orch.toml that was read); rewritten only when that changes."""
    path = layout.validation_error_path(run)
    text = message.rstrip("\n") + "\n"
    if config is not None:
        text += f"{_REJECTED_CONFIG}: {config}\n"
    with contextlib.suppress(FileNotFoundError):
        if path.read_text(encoding="utf-8") == text:
            return
    layout.atomic_write_text(path, text)


def read_validation_error(run: Path) -> str | None:
    rejection = _read_rejection(run)
    return rejection[0] if rejection is not None else None


def _rejection_stands(run: Path, config: str | None) -> bool:
    """Whether a rejection of the orch.toml `config` names (None: it names none) stands."""
    if config is not None:
        return config == current_config_signature(run)
    try:
        config_mtime = layout.orch_config_path(run).stat().st_mtime_ns
        return layout.validation_error_path(run).stat().st_mtime_ns >= config_mtime
    except (FileNotFoundError, NotADirectoryError):
        return True


def _read_rejection(run: Path) -> tuple[str, str | None] | None:
    """(why, signature of the rejected orch.toml or None), or None when not rejected."""
    try:
        text = layout.validation_error_path(run).read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        return None
    lines = text.rstrip("\n").splitlines()
    config = None
    if lines and lines[-1].startswith(f"{_REJECTED_CONFIG}:"):
        config = lines.pop().partition(":")[2].strip()
    return "\n".join(lines).strip(), config


def clear_validation_error(run: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        layout.validation_error_path(run).unlink()


def mark_finished(run: Path, step: int) -> None:
    layout.atomic_write_text(
        layout.finished_path(run), f"finished at step {step}\nfinished_at: {now_iso()}\n"
    )


def is_finished(run: Path) -> bool:
    return layout.finished_path(run).is_file()


# ---------------------------------------------------------------- the run's condition


class Condition(StrEnum):
    """What a run's control files say of it, most telling first. The values are the
    statuses `workbench status` shows for them (`RunCondition.status`: an eviction for
    divergence shows as `diverged`)."""

    EVICTED = "evicted"  # control/evicted.txt
    REJECTED = "rejected"  # control/config_validation_error.txt
    FINISHED = "finished"  # control/finished.txt
    OPEN = "open"  # none of them: it trains once its orch.toml is valid and a slot is free


@dataclass(frozen=True)
class RunCondition:
    """A run's condition (`run_condition`), with what goes with it.

    reason: why it is evicted or rejected (the file's text); None otherwise.
    evicted_by: who evicted it (user, tui, trainer, orchestrator, asha).
    reconsidered: rejected for a `control/orch.toml` that has changed since (or is gone),
        and not finished: the trainer looks at the run again and clears the rejection if
        the new file is valid. Until then it is rejected to every other reader.
    """

    kind: Condition
    reason: str | None = None
    evicted_by: str | None = None
    reconsidered: bool = False

    @property
    def diverged(self) -> bool:
        """Evicted by the trainer because its training diverged (`diverged: ...`)."""
        return self.kind is Condition.EVICTED and is_divergence(self.reason)

    @property
    def status(self) -> str:
        """The word `workbench status` and the TUI show: the kind's value, except
        `diverged` for an eviction for divergence (a run that failed by itself, as Ray
        Tune's ERROR tells a trial that failed from one a scheduler stopped)."""
        return DIVERGED if self.diverged else self.kind.value

    @property
    def open_to_trainer(self) -> bool:
        """Whether the trainer may give the run a slot, its orch.toml permitting: open, or
        rejected for an earlier orch.toml. Only an open run keeps a slot it has."""
        return self.kind is Condition.OPEN or self.reconsidered


def run_condition(run: Path) -> RunCondition:
    """The condition of a run: evicted, else rejected, else finished, else open."""
    eviction = read_eviction(run)
    if eviction is not None:
        return RunCondition(
            Condition.EVICTED, reason=eviction.reason, evicted_by=eviction.evicted_by
        )
    rejection = _read_rejection(run)
    if rejection is not None:
        why, config = rejection
        stands = _rejection_stands(run, config)
        return RunCondition(
            Condition.REJECTED, reason=why, reconsidered=not stands and not is_finished(run)
        )
    if is_finished(run):
        return RunCondition(Condition.FINISHED)
    return RunCondition(Condition.OPEN)
