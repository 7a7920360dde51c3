"""`workbench serve` end to end, with every real part (the supervisor, vLLM's CPU build, the
torchrun trainer, the built-in tiny model): the service is a process of the experiment that
`workbench status` lists, the unmodified SDK samples the base model through it, and
`workbench down` stops it with the rest."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import tinker

from tests.e2e.cli import environment, workbench
from tests.tinker.conftest import sdk_client
from workbench.system.ports import free_port

pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[cpu]')")

pytestmark = pytest.mark.slow

KEY = "tml-serve-e2e-0123456789abcdef"
ENV = environment(WORKBENCH_TINKER_API_KEY=KEY)
RECIPE = """\
[experiment]
name = "served"
output_dir = "outputs/served"
[model]
base = "builtin:tiny-reverse"
[inference]
max_loras = 2
[trainer]
max_concurrent_runs = 2
[defaults]
env_args = { min_length = 3, max_length = 3 }
max_steps = 1
batch_size = 8
rollouts_per_prompt = 4
eval = { interval = 0 }
[[runs]]
id = "a"
"""


def test_serve_runs_the_service_beside_the_experiment_until_down(tmp_path: Path):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(RECIPE)
    experiment = tmp_path / "outputs" / "served"
    port = free_port()
    try:
        started = workbench(
            "serve", str(recipe), "--port", str(port), cwd=tmp_path, env=ENV, timeout=600
        )
        assert started.returncode == 0, started.stdout + started.stderr
        url = f"http://127.0.0.1:{port}"
        assert f"base_url={url}" in started.stdout and f"api_key={KEY}" in started.stdout
        status = workbench("status", str(experiment), cwd=tmp_path, env=ENV)
        assert "tinker" in status.stdout, status.stdout
        with sdk_client(url, KEY) as client:
            sampler = client.create_sampling_client(base_model="builtin:tiny-reverse").result(
                timeout=600
            )
            params = tinker.types.SamplingParams(max_tokens=4, temperature=1.0, seed=0)
            result = sampler.sample(tinker.types.ModelInput.from_ints([5, 6, 7]), 2, params)
            assert len(result.result(timeout=600).sequences) == 2
    finally:
        stopped = workbench("down", str(experiment), cwd=tmp_path, env=ENV, timeout=180)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/api/v1/healthz", timeout=2.0)
