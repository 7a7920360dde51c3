"""A multi-turn verifiers taskset end to end with every real part: `vf_reverse_twice`'s
two-turn episodes (tests/envs/verifiers_tasks, its environment playing the user) run by
verifiers in the environment's process, each turn sampled by vLLM on
builtin:tiny-reverse-chat, trained by the torchrun trainer on the model's own tokens only:
the environment's turn is masked, as the built-in multi-turn episodes' are."""

from __future__ import annotations

import itertools
import json

import pytest

from tests.e2e.test_reverse_text_e2e import stop_leftovers, workbench
from tests.envs.conftest import TASKS, verifiers_python  # noqa: F401 - the shared venv
from workbench.files import layout
from workbench.files.metrics import read_metrics
from workbench.files.rollouts import read_rollouts

pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[cpu]')")
pytestmark = pytest.mark.slow

RECIPE = f"""
[experiment]
name = "vf_twice"
output_dir = "outputs/vf_twice"

[model]
base = "builtin:tiny-reverse-chat"

[inference]
max_loras = 2

[trainer]
max_concurrent_runs = 1
lora = {{ rank = 8, alpha = 16 }}

[defaults]
env = "verifiers:vf_reverse_twice"
env_args = {{ path = "{TASKS}", taskset = {{ num_tasks = 40 }}, eval_fraction = 0.2 }}
max_steps = 3
batch_size = 16
rollouts_per_prompt = 4
sampling = {{ max_tokens = 12 }}
eval = {{ interval = 0 }}
lr = 2e-3

[[runs]]
id = "twice"
"""


def test_a_multi_turn_verifiers_taskset_trains_on_masked_two_turn_episodes(
    tmp_path,
    verifiers_python,  # noqa: F811
):
    steps = 3
    recipe = tmp_path / "vf_twice.toml"
    recipe.write_text(RECIPE)
    experiment = tmp_path / "outputs" / "vf_twice"
    try:
        result = workbench(
            "up", str(recipe), "--headless", "--max-steps", str(steps),
            cwd=tmp_path, timeout=10 * 60,
        )  # fmt: skip
    finally:
        stop_leftovers(experiment, tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    run = experiment / "run_twice"
    trained = sorted(m["step"] for m in read_metrics(run, "trainer"))
    assert trained == list(range(1, steps + 1)), f"trained steps {trained}"
    steps_metrics = read_metrics(run, "orchestrator")
    assert all(m["dropped_episodes"] == 0 for m in steps_metrics)
    assert all(0.0 <= m["reward_mean"] <= 1.0 for m in steps_metrics)
    batch = read_rollouts(layout.rollout_dir(run, 0))
    starts = batch.sample_lengths.cumsum(0) - batch.sample_lengths
    two_turns = 0
    for start, length, prompt in zip(
        starts.tolist(), batch.sample_lengths.tolist(), batch.prompt_lengths.tolist(),
        strict=True,
    ):  # fmt: skip
        mask = batch.loss_mask[start + prompt : start + length].tolist()
        # model tokens, then the environment's turn (masked), then model tokens
        changes = sum(a != b for a, b in itertools.pairwise(mask))
        assert mask[0] and changes in (0, 2), mask
        two_turns += changes == 2
        masked = ~batch.loss_mask[start : start + length]
        assert (batch.inference_logprobs[start : start + length][masked] == 0).all()
    assert two_turns >= batch.num_samples // 2, "most episodes ran both turns as one sequence"
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    transcript = samples[0]["groups"][0]["completions"][0]["text"]
    assert "[environment]" in transcript, transcript
