"""A real vLLM server (the CPU build here) on the built-in tiny model, shared by a module."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.testing.local_server import start_local_server, stop_local_server

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[cpu]')")

BASE = "builtin:tiny-reverse"


@pytest.fixture(scope="session")
def tiny_reverse() -> Path:
    from workbench.models.resolve import resolve_model

    return resolve_model(BASE)


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_reverse):
    experiment = tmp_path_factory.mktemp("inference")
    local = start_local_server(experiment, BASE, max_loras=4, max_lora_rank=8, timeout_s=400)
    try:
        yield local.endpoint
    finally:
        stop_local_server(local.process)
