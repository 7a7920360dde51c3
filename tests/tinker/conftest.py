"""What the Tinker tests share: the service process alone on an experiment directory
(`start_service`), and a whole experiment served by `workbench serve` (the supervisor,
vLLM's CPU build, the torchrun trainer, the built-in tiny model), stopped by `workbench
down` once the module's tests are done."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
import tinker

from tests.e2e.cli import environment, workbench
from workbench.system.ports import free_port

BUILTIN = "builtin:tiny-reverse"
# An experiment for the service alone: its recipe names the base model and the trainer's rank.
SERVICE_RECIPE = f"""
[experiment]
name = "tinker"
[model]
base = "{BUILTIN}"
[trainer]
max_concurrent_runs = 2
lora = {{ rank = 8, alpha = 16 }}
"""


def start_service(
    experiment: Path, api_key: str, *options: str, port: int | None = None
) -> tuple[subprocess.Popen, str]:
    """`python -m workbench.tinker` on `experiment` (a recipe.toml in it), answering its
    health check (on `port`, else a free one); its log in service.log. Returns the process
    and its base URL."""
    port = port or free_port()
    env = {**os.environ, "WORKBENCH_TINKER_API_KEY": api_key}
    argv = [sys.executable, "-m", "workbench.tinker", str(experiment), "--port", str(port)]
    with open(experiment / "service.log", "a") as log:
        proc = subprocess.Popen([*argv, *options], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/api/v1/healthz").status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    pytest.fail((experiment / "service.log").read_text())


@dataclass(frozen=True)
class Served:
    """An experiment up with its Tinker service: what an SDK client needs to reach it."""

    url: str
    api_key: str
    experiment: Path


def datum(tokens: tuple[int, ...] | list[int] = (1, 2, 3)) -> tinker.types.Datum:
    """A next-token datum for `cross_entropy`: `tokens` in, each one's successor as target."""
    return tinker.types.Datum(
        model_input=tinker.types.ModelInput.from_ints(list(tokens)),
        loss_fn_inputs={"target_tokens": np.array([t + 1 for t in tokens], dtype=np.int64)},
    )


def serve(recipe_text: str, workdir: Path, api_key: str) -> Iterator[Served]:
    """`workbench serve` of `recipe_text` (its output_dir relative to `workdir`), yielded
    while up, then `workbench down` (which must succeed)."""
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[cpu]')")
    import tomllib

    env = environment(WORKBENCH_TINKER_API_KEY=api_key)
    recipe = workdir / "recipe.toml"
    recipe.write_text(recipe_text)
    experiment = workdir / tomllib.loads(recipe_text)["experiment"]["output_dir"]
    port = free_port()
    try:
        started = workbench(
            "serve", str(recipe), "--port", str(port), cwd=workdir, env=env, timeout=600
        )
        assert started.returncode == 0, started.stdout + started.stderr
        yield Served(f"http://127.0.0.1:{port}", api_key, experiment)
    finally:
        stopped = workbench("down", str(experiment), cwd=workdir, env=env, timeout=180)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr


@contextlib.contextmanager
def sdk_client(url: str, api_key: str) -> Iterator[tinker.ServiceClient]:
    """The SDK's client, closed as a user's `with` block closes it while its service is up:
    its session finished and its heartbeat thread stopped. A client left open outlives its
    service and warns every 10 s, for the rest of the test session, that it lost it."""
    client = tinker.ServiceClient(base_url=url, api_key=api_key)
    try:
        yield client
    finally:
        client.close("success").result(timeout=60)
