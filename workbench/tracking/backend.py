"""What the forwarder needs of a tracker library (the adapters implement it; the forwarder's
`open_backend` picks one).

An adapter is small: open or resume one tracker run, log one record's values at its step,
finish a run, close the library. Errors may be raised from any of these; the forwarder
turns them into warnings. A library is imported only when its backend is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class TrackedRun:
    """One workbench run as a tracker run."""

    project: str
    name: str
    group: str  # the experiment
    config: dict[str, Any]  # the run's orch.toml values, by dotted key


class TrackerRun(Protocol):
    id: str  # the library's id of the run, kept in the progress file to resume it

    def log(self, source: str, step: int, values: dict[str, float]) -> None:
        """One record: `values` keyed `<source>/<key>`, at the record's `step`."""

    def alert(self, title: str, text: str, level: str, step: int | None) -> None:
        """One of workbench's alerts (`workbench.alerts`); `level` is "warn" or "error"."""

    def finish(self) -> None: ...


class Backend(Protocol):
    library: str  # the package; its Python warnings count as tracking problems

    def open_run(self, run: TrackedRun, resume_id: str | None) -> TrackerRun:
        """A new tracker run, or the one `resume_id` names (continued, not replaced)."""

    def close(self) -> None:
        """Release the library (after every run was finished)."""
