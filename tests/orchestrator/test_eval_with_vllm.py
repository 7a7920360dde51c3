"""An orchestrator against the real vLLM server (CPU build) and the built-in tiny model
scores each policy version greedily under the adapter name the run serves it by.

The trainer's part, publishing `broadcast/step_N`, is played by the test with random
adapters strong enough to change greedy completions.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import make_run, random_adapter, served_models
from tests.inference.conftest import server, tiny_reverse  # noqa: F401 - the shared server
from workbench.config import OrchestratorConfig
from workbench.files import layout, run_control
from workbench.files.metrics import read_metrics
from workbench.inference.client import AdapterVersions, InferenceClient
from workbench.orchestrator.loop import Orchestrator

pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[cpu]')")
pytestmark = pytest.mark.slow


def test_an_orchestrator_records_greedy_evals_of_each_version_it_serves(
    server,  # noqa: F811
    tiny_reverse,  # noqa: F811
    tmp_path: Path,
):
    run = make_run(tmp_path / "exp", "run_x")
    config = OrchestratorConfig(
        env_args={"min_length": 9, "max_length": 9},
        batch_size=16,
        rollouts_per_prompt=4,
        max_steps=2,
        sampling={"max_tokens": 16},
        eval={"interval": 1, "num_prompts": 8},
    )
    with InferenceClient(server) as client:
        adapters = AdapterVersions(client, run.name)
        orchestrator = Orchestrator(run, config, client, adapters, poll_s=0.05)
        try:
            orchestrator.step_once()  # the base model: version 0
            random_adapter(tiny_reverse, layout.broadcast_dir(run, 1), seed=1)
            orchestrator.step_once()  # loads version 1
            random_adapter(tiny_reverse, layout.broadcast_dir(run, 2), seed=2)
            orchestrator.run_until_done()  # loads and scores the last version, 2
        finally:
            adapters.unload_all()
        served_after = served_models(client.endpoint)

    records = read_metrics(run, "eval")
    assert [(r["policy_version"], r["adapter"]) for r in records] == [
        (0, server.model),
        (1, "run_x@step1"),
        (2, "run_x@step2"),
    ]
    assert all(r["eval_samples"] == 8 and r["eval_s"] > 0 for r in records)
    base, first, second = (r["eval_reward_mean"] for r in records)
    assert base > 0.3, "the tiny model reverses 9-letter texts in part (about 0.6 greedy)"
    assert first != base and second != base, "the adapters, not the base, were scored"
    assert run_control.is_finished(run)
    assert not [name for name in served_after if name.startswith("run_x@")]
