"""The built-in environments whose prompts are long enough for vLLM to split their prefill
across engine steps, end to end with every real part: `letter_count` with its defaults
(a 105-token prompt, 64 completions a step) and `dataset` on a file of 300-letter texts,
in one experiment. Their seeded requests hit split prefills, which used to kill vLLM's CPU
engine at the first step; here inference never restarts. (`reverse_text` and
`reverse_chain` have end-to-end tests of their own.)

The built-in tiny model was taught to reverse text and never writes a digit, so every
letter_count answer scores 0: that run records its rewards and then stops, as any run
whose completions all score alike does, with the reason `no learning signal`. A model that
can count is needed for letter_count to learn; none can be downloaded here."""

from __future__ import annotations

import json
import random
import string
from pathlib import Path

import pytest

from tests.e2e.test_reverse_text_e2e import rewards, stop_leftovers, workbench
from workbench.files.metrics import read_metrics
from workbench.supervisor.client import read_state

pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[cpu]')")
pytestmark = pytest.mark.slow

TEXT_LETTERS = 300

RECIPE = """
[experiment]
name = "long_prompts"
output_dir = "outputs/long_prompts"

[model]
base = "builtin:tiny-reverse"

[inference]
max_model_len = 512

[trainer]
max_concurrent_runs = 2
lora = { rank = 8, alpha = 16 }

[defaults]
max_steps = 3
batch_size = 64
rollouts_per_prompt = 8
lr = 3e-3

[[runs]]
id = "letters"
env = "letter_count"

[[runs]]
id = "texts"
env = "dataset"
env_args = { path = "texts.jsonl", prompt_column = "text", answer_column = "reversed", reward = "similarity" }
sampling = { max_tokens = 32 }
"""


def write_texts(path: Path, rows: int) -> None:
    rng = random.Random(0)
    with open(path, "w") as out:
        for _ in range(rows):
            text = "".join(rng.choices(string.ascii_lowercase, k=TEXT_LETTERS))
            out.write(json.dumps({"text": text, "reversed": text[::-1]}) + "\n")


def test_letter_count_and_a_dataset_of_long_prompts_train_every_step(tmp_path: Path):
    recipe = tmp_path / "long_prompts.toml"
    recipe.write_text(RECIPE)
    write_texts(tmp_path / "texts.jsonl", rows=400)
    experiment = tmp_path / "outputs" / "long_prompts"
    try:
        result = workbench("up", str(recipe), "--headless", cwd=tmp_path, timeout=12 * 60)
    finally:
        stop_leftovers(experiment, tmp_path)
    output = result.stdout[-3000:] + result.stderr[-3000:]
    said = result.stdout + result.stderr
    assert "run_letters did not finish (evicted: no learning signal" in said, output

    state = read_state(experiment)
    assert state is not None
    inference = state["processes"]["inference"]
    assert inference["restarts"] == 0 and inference["state"] == "stopped", inference["exits"]
    texts = experiment / "run_texts"
    trained = sorted(m["step"] for m in read_metrics(texts, "trainer"))
    assert trained == [1, 2, 3], f"run_texts trained steps {trained}"
    assert len(rewards(texts)) == 3 and all(0.0 <= r <= 1.0 for r in rewards(texts))
    letters = read_metrics(experiment / "run_letters", "orchestrator")
    assert letters and all(m["reward_mean"] == 0.0 for m in letters), letters
    samples = (experiment / "run_texts" / "samples.jsonl").read_text().splitlines()
    prompt = json.loads(samples[0])["groups"][0]["prompt"]
    assert len(prompt) >= TEXT_LETTERS  # a character tokenizer: at least 300 prompt tokens
