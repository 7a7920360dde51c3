"""Where workbench keeps what it makes once and reuses: built models, the verifiers venv,
lookups of a model's layers."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

CACHE_DIR_ENV = "WORKBENCH_CACHE_DIR"


def cache_dir() -> Path:
    """The workbench cache root: `$WORKBENCH_CACHE_DIR`, else the user cache directory."""
    override = os.environ.get(CACHE_DIR_ENV)
    return (
        Path(override).expanduser() if override else Path(platformdirs.user_cache_dir("workbench"))
    )
