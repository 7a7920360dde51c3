"""The data-file recipe end to end with every real part: recipes/reverse_words_dataset.toml
started from another directory, so its data path is found from the recipe's folder; every
run trains on rows of the shipped file and is evaluated on the rows held out of it."""

from __future__ import annotations

import json

import pytest

from tests.e2e.test_reverse_text_e2e import REPO, stop_leftovers, workbench
from workbench.envs import get_environment
from workbench.files.metrics import read_metrics

pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[cpu]')")
pytestmark = pytest.mark.slow


def test_the_dataset_recipe_trains_on_the_files_rows_and_evaluates_on_its_held_out_rows(
    tmp_path,
):
    steps = 3
    experiment = tmp_path / "outputs" / "reverse_words_dataset"
    try:
        result = workbench(
            "up", str(REPO / "recipes" / "reverse_words_dataset.toml"), "--headless",
            "--max-steps", str(steps), cwd=tmp_path, timeout=10 * 60,
        )  # fmt: skip
    finally:
        stop_leftovers(experiment, tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    shipped = REPO / "recipes" / "data" / "reverse_words.jsonl"
    rows = {json.loads(line)["text"] for line in shipped.read_text().splitlines()}
    env = get_environment(
        "dataset", path=str(shipped), prompt_column="text", answer_column="reversed"
    )
    held_out = {p.question for p in env.sample_prompts(env.split_sizes["eval"], split="eval")}
    for run_id in ("run_lr3e-3", "run_lr5e-3"):
        run = experiment / run_id
        config = (run / "control" / "orch.toml").read_text()
        assert f'path = "{shipped.resolve()}"' in config  # anchored, written absolute
        trained = sorted(m["step"] for m in read_metrics(run, "trainer"))
        assert trained == list(range(1, steps + 1)), f"{run_id} trained steps {trained}"
        samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
        prompts = {group["prompt"] for step in samples for group in step["groups"]}
        assert prompts and prompts <= rows - held_out, "training prompts are the file's rows"
        evals = read_metrics(run, "eval")
        assert evals and all(0.0 <= e["eval_reward_mean"] <= 1.0 for e in evals)
