"""Start one vLLM server for an experiment directory outside the supervisor, and stop it.

For the inference tests and the inference and eval benchmarks: the same `python -m workbench.inference` entry and
files (`supervisor/inference.toml`, `supervisor/endpoint.json`) the supervisor uses, so what
they measure is what runs serve.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from workbench.config import InferenceConfig, InferenceSection, ModelSection, model_to_toml
from workbench.files import layout
from workbench.files.endpoint import Endpoint, new_api_key, write_endpoint
from workbench.inference.readiness import wait_until_ready
from workbench.system.ports import free_port


@dataclass
class LocalServer:
    process: subprocess.Popen
    endpoint: Endpoint
    log_path: Path
    startup_s: float


def start_local_server(
    experiment: Path,
    base: str,
    *,
    max_loras: int,
    max_lora_rank: int,
    max_model_len: int = 256,
    dtype: str = "float32",
    timeout_s: float = 600.0,
    extra_args: tuple[str, ...] = (),
) -> LocalServer:
    """Start vLLM on a free loopback port and wait for its health endpoint.

    float32 by default: the trainer trains in float32, and vLLM's "auto" would downcast to
    bfloat16 on CPU. `extra_args` go to vLLM's command line as `[inference] extra_args`
    do. The server gets its own process group, so `stop_local_server` also
    stops vLLM's engine subprocess.
    """
    port = free_port()
    config = InferenceConfig(
        output_dir=experiment,
        model=ModelSection(base=base),
        inference=InferenceSection(
            port=port,
            max_loras=max_loras,
            max_model_len=max_model_len,
            dtype=dtype,
            extra_args=list(extra_args),
        ),
        max_lora_rank=max_lora_rank,
    )
    config_path = layout.supervisor_dir(experiment) / "inference.toml"
    layout.atomic_write_text(config_path, model_to_toml(config))
    endpoint = Endpoint(base_url=f"http://127.0.0.1:{port}/v1", api_key=new_api_key(), model=base)
    write_endpoint(experiment, endpoint)
    log_path = layout.process_log_path(experiment, "inference")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "workbench.inference", "--config", str(config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until_ready(
            endpoint.server_url, process=process, log_path=log_path, timeout_s=timeout_s
        )
    except BaseException:
        stop_local_server(process)
        raise
    return LocalServer(process, endpoint, log_path, time.monotonic() - started)


def stop_local_server(process: subprocess.Popen) -> None:
    """SIGTERM to the server's group, SIGKILL after 30 s."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass
