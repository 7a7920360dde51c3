"""wandb adapter: offline by default (`wandb sync <dir>/wandb/offline-run-*` uploads later).

Each run is its own `wandb.init(reinit="create_new")`, so every run of the experiment stays
open at once in the supervisor. The run's id is kept in its progress file: a restarted
supervisor continues the same wandb run (offline, wandb writes a new `offline-run-*`
folder for each session of the run; `wandb sync` uploads them in order, as one run).
"""

from __future__ import annotations

import logging
import secrets
from pathlib import Path
from typing import Any

from workbench.tracking.backend import TrackedRun

log = logging.getLogger("workbench.tracking")


class WandbBackend:
    library = "wandb"

    def __init__(self, directory: Path, *, mode: str, entity: str | None):
        import wandb

        self._wandb = wandb
        self._directory = directory
        self._mode = mode
        self._entity = entity
        # The supervisor's own output is its log: no console capture, no banner, and none
        # of the code, git or system probes wandb adds to a training script's run.
        self._settings = wandb.Settings(
            console="off",
            quiet=True,
            silent=True,
            save_code=False,
            disable_git=True,
            disable_job_creation=True,
            x_disable_stats=True,
            x_disable_meta=True,
        )
        if mode == "offline":
            log.info(
                "tracking: wandb runs offline in %s; upload them with "
                "`wandb sync %s/offline-run-*`",
                directory / "wandb",
                directory / "wandb",
            )

    def open_run(self, run: TrackedRun, resume_id: str | None) -> WandbRun:
        self._directory.mkdir(parents=True, exist_ok=True)
        handle = self._wandb.init(
            project=run.project,
            entity=self._entity,
            name=run.name,
            group=run.group,
            id=resume_id or secrets.token_hex(6),  # wandb's own form: lowercase, short
            resume="allow",
            config=run.config,
            dir=self._directory,
            mode=self._mode,
            reinit="create_new",
            settings=self._settings,
        )
        return WandbRun(handle)

    def close(self) -> None:
        self._wandb.teardown()  # stops wandb's service process


class WandbRun:
    def __init__(self, handle: Any):
        self._handle = handle
        self.id = str(handle.id)
        self._sources: set[str] = set()

    def log(self, source: str, step: int, values: dict[str, float]) -> None:
        if source not in self._sources:
            # Sources interleave out of step order (the orchestrator runs ahead of the
            # trainer) and wandb drops a step below its last one: each source gets its own
            # step axis instead, `<source>/step`.
            self._handle.define_metric(f"{source}/step", hidden=True)
            self._handle.define_metric(f"{source}/*", step_metric=f"{source}/step")
            self._sources.add(source)
        self._handle.log({**values, f"{source}/step": step})

    def alert(self, title: str, text: str, level: str, step: int | None) -> None:
        # wandb has no step for an alert: the text says it. Its title is at most 64
        # characters, and a repeat of a title within wait_duration is dropped by wandb.
        said = text if step is None else f"{text} (step {step})"
        self._handle.alert(title=title[:64], text=said, level=level.upper(), wait_duration=1)

    def finish(self) -> None:
        self._handle.finish()
