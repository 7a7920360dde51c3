"""How far a built-in model's build has come, told through the experiment directory.

A child of the supervisor writes a built-in model into the cache on first use (copies its
shipped weights, or builds it from a seed: inference, or the trainer when it takes the
cache's build lock first); the supervisor only
sees that child "starting". So the child hands `resolve_model` a `BuildProgressFile` as its
`on_step` callback, which writes `{experiment}/model_build.json` at every step:

    {"model": "builtin:tiny-reverse", "step": 2, "steps": 3,
     "what": "warm-up: update 40 of 150, loss 0.52", "started_at": "ISO time", "pid": 4321}

`step` 0 of 0 means the child waits for another process's build of the same model (written
only where no other child of the experiment reports the build it waits for). The
file is removed when the build is over (built, failed, or found in the cache); a writer
killed mid-build leaves it behind with a pid that no longer runs, which readers ignore
(`workbench.supervisor.startup` turns it into the "building model" phase).
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from workbench.files import layout
from workbench.system.clock import now_iso


@dataclass(frozen=True)
class BuildProgress:
    """One step of a build, as `model_build.json` holds it."""

    model: str
    step: int
    steps: int
    what: str
    started_at: str
    pid: int

    @property
    def waiting(self) -> bool:
        """The writer waits for another process's build of the model."""
        return self.steps == 0

    @classmethod
    def from_json(cls, record: Any) -> BuildProgress | None:
        """The progress a parsed `model_build.json` holds; None for anything malformed."""
        if not isinstance(record, dict):
            return None
        try:
            progress = cls(
                model=str(record["model"]),
                step=int(record["step"]),
                steps=int(record["steps"]),
                what=str(record["what"]),
                started_at=str(record["started_at"]),
                pid=int(record["pid"]),
            )
        except (KeyError, TypeError, ValueError):
            return None
        return progress


class BuildProgressFile:
    """Writes a build's steps to `model_build.json`; use it as `resolve_model`'s `on_step`.

        with BuildProgressFile(experiment, "builtin:tiny-reverse") as on_step:
            model = resolve_model("builtin:tiny-reverse", on_step=on_step)

    Writing never fails the build: a full disk costs the display, not the model.
    """

    def __init__(self, experiment: Path, model: str):
        self.path = layout.model_build_path(experiment)
        self.model = model
        self._started_at: str | None = None
        self._building = False  # past waiting for another process's build
        self._wrote = False

    def __enter__(self) -> BuildProgressFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __call__(self, step: int, steps: int, what: str) -> None:
        building = steps > 0
        if not building and self.path.exists():
            return  # the build it waits for is another child's, which says more
        if self._started_at is None or (building and not self._building):
            # A build's clock starts at its first step, not while it waited for another's.
            self._started_at = now_iso()
        self._building = building
        progress = BuildProgress(self.model, step, steps, what, self._started_at, os.getpid())
        with contextlib.suppress(OSError):
            layout.atomic_write_text(self.path, json.dumps(asdict(progress)) + "\n")
            self._wrote = True

    def close(self) -> None:
        """The build is over: remove the file (only if this writer wrote it)."""
        if self._wrote:
            with contextlib.suppress(OSError):
                self.path.unlink()
            self._wrote = False


def read_build_progress(experiment: Path) -> BuildProgress | None:
    """The last step written to `model_build.json`, or None when there is no (valid) file."""
    try:
        record = json.loads(layout.model_build_path(experiment).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return BuildProgress.from_json(record)
