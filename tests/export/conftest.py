"""Fixtures of the export tests: one run trained by the real trainer, shared."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.export.harness import TrainedRun, train_run


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory) -> TrainedRun:
    experiment = tmp_path_factory.mktemp("export") / "exp"
    experiment.mkdir()
    return train_run(experiment)


@pytest.fixture
def experiment_copy(trained: TrainedRun, tmp_path: Path) -> Path:
    """The trained run's experiment, copied so that a test may change it."""
    return shutil.copytree(trained.experiment, tmp_path / "exp")
