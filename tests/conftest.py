"""Shared fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def experiment(tmp_path: Path) -> Path:
    """An empty experiment directory."""
    path = tmp_path / "exp"
    path.mkdir()
    return path


@pytest.fixture(scope="session")
def trackio_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """trackio's directory for the whole session, also in $TRACKIO_DIR: trackio reads that
    variable once, when first imported, so every test that uses trackio shares it (each
    with a project of its own)."""
    path = tmp_path_factory.mktemp("trackio")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRACKIO_DIR", str(path))
        yield path
