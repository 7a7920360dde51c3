from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import make_tiny_llama


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama")
