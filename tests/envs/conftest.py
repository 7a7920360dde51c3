"""The verifiers venv the slow tests share, and the folder of their verifiers tasksets."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from workbench.envs import verifiers_venv
from workbench.envs.verifiers_versions import TESTED
from workbench.system.cache import cache_dir

TASKS = Path(__file__).parent / "verifiers_tasks"
NETWORK_TROUBLE = (
    "No matching distribution",
    "Could not find a version",
    "Failed to establish",
    "Temporary failure in name resolution",
    "NewConnectionError",
    "Network is unreachable",
)


@pytest.fixture(scope="session")
def verifiers_python() -> Iterator[Path]:
    """The tests' verifiers venv, made once (minutes) and kept; its path in
    $WORKBENCH_VERIFIERS_VENV for the session."""
    venv = cache_dir() / "envs" / "verifiers-tests"
    marker = verifiers_venv.installed(venv) or {}
    if any(marker.get(name) != version for name, version in TESTED.items()):
        try:
            verifiers_venv.install(venv=venv, say=lambda line: None)
        except verifiers_venv.InstallError as err:
            if any(sign in str(err) for sign in NETWORK_TROUBLE):
                pytest.skip(f"pip cannot install verifiers here: {str(err)[-300:]}")
            raise
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(verifiers_venv.VENV_ENV, str(venv))
        yield verifiers_venv.venv_python(venv)
