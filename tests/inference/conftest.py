"""A real vLLM server (the CPU build here) on the built-in tiny model, shared by a module."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import free_port
from workbench.config import InferenceConfig, InferenceSection, ModelSection, model_to_toml
from workbench.inference.endpoint import Endpoint, new_api_key, write_endpoint
from workbench.inference.readiness import wait_until_ready

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[cpu]')")

BASE = "builtin:tiny-reverse"


@pytest.fixture(scope="session")
def tiny_reverse() -> Path:
    from workbench.models.resolve import resolve_model

    return resolve_model(BASE)


def start_server(experiment: Path, max_loras: int = 4) -> tuple[subprocess.Popen, Endpoint, Path]:
    port = free_port()
    config = InferenceConfig(
        output_dir=experiment,
        model=ModelSection(base=BASE),
        inference=InferenceSection(
            port=port, max_loras=max_loras, max_model_len=256, dtype="float32"
        ),
        max_lora_rank=8,
    )
    config_path = experiment / "supervisor" / "inference.toml"
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(model_to_toml(config))
    endpoint = Endpoint(base_url=f"http://127.0.0.1:{port}/v1", api_key=new_api_key(), model=BASE)
    write_endpoint(experiment, endpoint)
    log_path = experiment / "logs" / "inference.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "workbench.inference", "--config", str(config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return process, endpoint, log_path


def stop_server(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_reverse):
    experiment = tmp_path_factory.mktemp("inference")
    process, endpoint, log_path = start_server(experiment)
    try:
        wait_until_ready(endpoint.server_url, process=process, log_path=log_path, timeout_s=400)
        yield endpoint
    finally:
        stop_server(process)
