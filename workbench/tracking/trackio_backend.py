"""trackio adapter: runs in a local SQLite database, shown by `trackio show`.

trackio keeps its files in $TRACKIO_DIR (default ~/.cache/huggingface/trackio) and reads
that variable once, when it is imported; a recipe's `dir` is set there before the import.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import logging
import os
import sys
from pathlib import Path
from typing import Any

from workbench.tracking.backend import TrackedRun

log = logging.getLogger("workbench.tracking")


class TrackioBackend:
    library = "trackio"

    def __init__(self, directory: Path | None, project: str):
        if directory is not None:
            _use_directory(directory)
        import trackio

        self._trackio = trackio
        where = trackio.utils.TRACKIO_DIR
        prefix = f"TRACKIO_DIR={where} " if directory is not None else ""
        log.info(
            "tracking: trackio writes to %s; its dashboard: %strackio show --project %s",
            where,
            prefix,
            project,
        )

    def open_run(self, run: TrackedRun, resume_id: str | None) -> TrackioRun:
        # trackio.init finishes the run it opened before (kept in a context variable):
        # each run opens in a context of its own, so several stay open at once.
        # trackio resumes by name; a run never opened before gets a new one even if an
        # older run of the project has that name (a deleted experiment's).
        with _quiet():
            handle = contextvars.Context().run(
                self._trackio.init,
                project=run.project,
                name=run.name,
                group=run.group,
                config=run.config,
                resume="allow" if resume_id else "never",
                embed=False,
                auto_log_cpu=False,
                auto_log_gpu=False,
            )
        return TrackioRun(handle)

    def close(self) -> None:
        pass


class TrackioRun:
    def __init__(self, handle: Any):
        self._handle = handle
        self.id = str(handle.id)

    def log(self, source: str, step: int, values: dict[str, float]) -> None:
        self._handle.log(values, step=step)

    def alert(self, title: str, text: str, level: str, step: int | None) -> None:
        from trackio import AlertLevel

        with _quiet():  # trackio prints each alert too; the supervisor's log has it
            self._handle.alert(title=title, text=text, level=AlertLevel(level), step=step)

    def finish(self) -> None:
        with _quiet():
            self._handle.finish()  # writes what its sender thread still holds


@contextlib.contextmanager
def _quiet():
    """Without trackio's banners (dashboard hints in colour, "Created new run") for every
    run: the supervisor's log says it once. Its problems come as warnings, not prints."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


def _use_directory(directory: Path) -> None:
    wanted = directory.resolve()
    module = sys.modules.get("trackio")
    if module is not None and Path(module.utils.TRACKIO_DIR).resolve() != wanted:
        raise RuntimeError(
            f"trackio was imported writing to {module.utils.TRACKIO_DIR}, not {wanted}: "
            "it reads TRACKIO_DIR only once"
        )
    wanted.mkdir(parents=True, exist_ok=True)
    os.environ["TRACKIO_DIR"] = str(wanted)
