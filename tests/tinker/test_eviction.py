"""An evicted Tinker run answers its client with a clear error: the real SDK against the
real service process, no trainer (so its forward_backward stays pending until the run is
evicted as `workbench evict` evicts it)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest
import tinker

from workbench.files import run_control
from workbench.system.ports import free_port

API_KEY = "tml-workbench-eviction-0123456789"
BASE = "builtin:tiny-reverse"
RECIPE = f"""
[experiment]
name = "tinker"
[model]
base = "{BASE}"
[trainer]
max_concurrent_runs = 2
lora = {{ rank = 8, alpha = 16 }}
"""


@pytest.fixture
def service(tmp_path):
    (tmp_path / "recipe.toml").write_text(RECIPE)
    port = free_port()
    env = {**os.environ, "WORKBENCH_TINKER_API_KEY": API_KEY}
    with open(tmp_path / "service.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "workbench.tinker", str(tmp_path), "--port", str(port)],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/api/v1/healthz").status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail((tmp_path / "service.log").read_text())
    yield url, tmp_path
    proc.terminate()
    proc.wait(10)


def _datum():
    return tinker.types.Datum(
        model_input=tinker.types.ModelInput.from_ints([1, 2, 3]),
        loss_fn_inputs={"target_tokens": np.array([2, 3, 4], dtype=np.int64)},
    )


def test_an_evicted_run_fails_its_pending_and_later_requests_naming_the_eviction(service):
    url, experiment = service
    client = tinker.ServiceClient(base_url=url, api_key=API_KEY)
    training = client.create_lora_training_client(base_model=BASE, rank=4).result(timeout=60)
    pending = training.forward_backward([_datum()], "cross_entropy")
    (run,) = experiment.glob("run_tinker_*")
    run_control.evict(run, "too slow for this experiment", by="cli")
    with pytest.raises(Exception, match="was evicted by cli: too slow for this experiment"):
        pending.result(timeout=30)
    with pytest.raises(tinker.APIStatusError, match="was evicted") as later:
        training.forward_backward([_datum()], "cross_entropy").result(timeout=30)
    assert later.value.status_code == 410
