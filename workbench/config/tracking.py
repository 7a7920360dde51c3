"""The recipe's `[tracking]` section: where every run's metrics are forwarded."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from workbench.config.base import StrictModel


class TrackingSection(StrictModel):
    """Experiment tracking: the supervisor forwards every record of each run's metrics.jsonl
    to a tracker (`workbench.tracking`); trainer and orchestrators know nothing of it."""

    backend: Literal["none", "trackio", "wandb"] = Field(
        "none",
        description="none, trackio (local SQLite and a local dashboard: `trackio show`) or "
        "wandb (offline unless mode = online); one tracker run per workbench run",
    )
    project: str | None = Field(None, description="default: the experiment's name")
    dir: Path | None = Field(
        None,
        description="where the tracker keeps its files (relative: to where `workbench up` "
        "runs); default: trackio's own ($TRACKIO_DIR or ~/.cache/huggingface/trackio), "
        "the experiment directory for wandb (its wandb/ folder)",
    )
    mode: Literal["offline", "online"] = Field(
        "offline", description="wandb only: online also uploads, with your wandb login"
    )
    entity: str | None = Field(None, description="wandb only: the team or user to log under")

    @field_validator("backend")
    @classmethod
    def _library_installed(cls, backend: str) -> str:
        # A recipe error before launch, not a warning once the runs are going. A spec without
        # an origin is a bare folder of that name (wandb's own ./wandb output), no library.
        spec = importlib.util.find_spec(backend) if backend != "none" else None
        if backend != "none" and (spec is None or spec.origin is None):
            raise ValueError(
                f"{backend} is not installed in this environment ({sys.executable}); install "
                f"it with `pip install {backend}` or `pip install -e '.[tracking]'`, or set "
                'backend = "none"'
            )
        return backend

    @field_validator("mode", "entity")
    @classmethod
    def _wandb_options_need_wandb(cls, value: Any, info: ValidationInfo) -> Any:
        # Runs only for keys the recipe sets: a wandb option under trackio is a mistake (and
        # harmless with tracking off, so switching backend = "none" on and off is one line).
        backend = info.data.get("backend")
        if backend == "trackio":
            raise ValueError(
                f'applies to backend = "wandb" only (backend is {backend!r}): remove it or '
                "switch the backend"
            )
        return value
