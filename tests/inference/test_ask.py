"""`workbench ask` against the real vLLM server (CPU build) on the built-in tiny model, with
real adapters loaded under run version names as orchestrators load them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers import make_run, random_adapter
from workbench.cli import app
from workbench.config import OrchestratorConfig, SamplingParams
from workbench.envs import get_environment
from workbench.files.endpoint import write_endpoint
from workbench.inference.client import InferenceClient

pytestmark = pytest.mark.slow
GREEDY = SamplingParams(max_tokens=16, temperature=0.0)


@pytest.fixture(scope="module")
def experiment(server, tiny_reverse, tmp_path_factory) -> Path:
    """run_a with versions 1 and 3 loaded (3 is newest), run_b with 2, run_c with none."""
    path = tmp_path_factory.mktemp("ask") / "exp"
    path.mkdir()
    write_endpoint(path, server)
    for run_id in ("run_a", "run_b", "run_c"):
        make_run(path, run_id, "[sampling]\nmax_tokens = 16\n")
    adapters = tmp_path_factory.mktemp("adapters")
    with InferenceClient(server) as client:
        for name, seed in (("run_a@step1", 1), ("run_a@step3", 3), ("run_b@step2", 2)):
            client.load_adapter(name, random_adapter(tiny_reverse, adapters / name, seed=seed))
    yield path
    with InferenceClient(server) as client:
        for name in ("run_a@step1", "run_a@step3", "run_b@step2"):
            client.unload_adapter(name)


def ask(*args: object) -> list[dict]:
    result = CliRunner().invoke(app, ["ask", *map(str, args)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def greedy(server, model: str, text: str) -> str:
    env = get_environment(OrchestratorConfig().env)
    prompt = env.dataset(seed=0, split="eval")[0]
    messages = [*prompt.messages[:-1], {"role": "user", "content": text}]
    with InferenceClient(server) as client:
        return client.chat(messages, model=model, n=1, sampling=GREEDY, seed=0).completions[0].text


def test_each_runs_newest_adapter_and_the_base_answer_as_they_would_alone(server, experiment):
    answers = ask("reverse: abcdef", "--temperature", "0", "--json", "-e", experiment)
    by_label = {a["label"]: a for a in answers}
    assert list(by_label) == ["run_a", "run_b", "run_c", "base"]
    assert by_label["run_a"]["model"] == "run_a@step3"  # the newest of its versions
    assert by_label["run_b"]["model"] == "run_b@step2"
    for label in ("run_a", "run_b", "base"):
        answer = by_label[label]
        assert answer["error"] is None
        assert answer["text"] == greedy(server, answer["model"], "reverse: abcdef")
    assert by_label["run_a"]["text"] != by_label["base"]["text"]
    assert "no adapter of run_c is loaded" in by_label["run_c"]["error"]


def test_a_dataset_row_is_asked_and_each_answer_scored_with_the_environments_reward(
    server, experiment
):
    answers = ask("--row", "2", "--runs", "run_a", "--no-base", "--json", "-e", experiment)
    (answer,) = answers
    env = get_environment(OrchestratorConfig().env)
    prompt = env.dataset(seed=0, split="eval")[2]
    assert answer["reward"] == env.reward(prompt, answer["text"])
    assert len(answer["text"]) > 0


def test_the_table_shows_each_answer_in_a_column_and_a_missing_server_is_an_error(
    experiment, tmp_path
):
    result = CliRunner().invoke(app, ["ask", "hi", "--runs", "run_a,run_b", "-e", experiment])
    assert result.exit_code == 0, result.output
    header = next(line for line in result.stdout.splitlines() if "run_a" in line)
    assert header.index("run_a") < header.index("run_b") < header.index("base")
    lonely = tmp_path / "lonely"
    make_run(lonely, "run_a")
    result = CliRunner().invoke(app, ["ask", "hi", "-e", lonely])
    assert result.exit_code == 1 and "has no inference server" in result.stderr
