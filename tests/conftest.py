"""Shared fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def experiment(tmp_path: Path) -> Path:
    """An empty experiment directory."""
    path = tmp_path / "exp"
    path.mkdir()
    return path
