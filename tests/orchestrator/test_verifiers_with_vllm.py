"""An orchestrator on a `verifiers:` environment against the real vLLM server (CPU build)
and the built-in tiny model: verifiers runs each episode in its own process and venv, its
turns go to vLLM under the run's adapter name with the experiment's key, and what the
trainer gets are vLLM's own tokens and log-probs with the rubric's rewards.

The trainer's part, publishing `broadcast/step_1`, is played by a random adapter.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import httpx
import pytest

from tests.envs.conftest import TASKS, verifiers_python  # noqa: F401 - the shared venv
from tests.helpers import make_run, random_adapter
from tests.inference.conftest import server, tiny_reverse  # noqa: F401 - the shared server
from workbench.config import OrchestratorConfig
from workbench.files import layout
from workbench.files.metrics import read_metrics
from workbench.inference.client import AdapterVersions, InferenceClient
from workbench.orchestrator.loop import Orchestrator

pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[cpu]')")
pytestmark = pytest.mark.slow


def rubric(reply: str, answer: str) -> float:
    """vf_reverse's rewards: similarity (weight 1) and exactness (weight 0.5)."""
    return difflib.SequenceMatcher(None, reply, answer).ratio() + 0.5 * (reply == answer)


def prompt_logprobs(endpoint, ids: list[int]) -> list[float]:
    """The base model's log-prob of each token of `ids` after the ones before it (vLLM's
    `prompt_logprobs`); the first token has none."""
    answer = httpx.post(
        f"{endpoint.base_url}/completions",
        headers={"Authorization": f"Bearer {endpoint.api_key}"},
        json={
            "model": endpoint.model,
            "prompt": ids,
            "max_tokens": 1,
            "prompt_logprobs": 0,
        },
        timeout=60,
    )
    answer.raise_for_status()
    rows = answer.json()["choices"][0]["prompt_logprobs"]
    return [
        float("nan") if row is None else row[str(token)]["logprob"]
        for token, row in zip(ids, rows, strict=True)
    ]


def test_an_orchestrator_trains_on_verifiers_episodes_sampled_by_vllm(
    server,  # noqa: F811
    tiny_reverse,  # noqa: F811
    verifiers_python,  # noqa: F811
    tmp_path: Path,
):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_reverse)
    run = make_run(tmp_path / "exp", "run_v")
    config = OrchestratorConfig(
        env="verifiers:vf_reverse",
        env_args={
            "path": str(TASKS),
            "taskset": {"num_tasks": 40},
            "eval_taskset": {"split": "test", "num_tasks": 8},
        },
        batch_size=8,
        rollouts_per_prompt=4,
        max_steps=2,
        sampling={"max_tokens": 12},
        eval={"interval": 1, "num_prompts": 4},
    )
    generated = []
    with InferenceClient(server) as client:
        adapters = AdapterVersions(client, run.name)
        orchestrator = Orchestrator(run, config, client, adapters, poll_s=0.05)
        generate = orchestrator._generate

        def recording(prompts, model):
            groups = generate(prompts, model)
            generated.append((model, prompts, groups))
            return groups

        orchestrator._generate = recording
        try:
            orchestrator.step_once()  # the base model, and an eval of it
            random_adapter(tiny_reverse, layout.broadcast_dir(run, 1), seed=1)
            orchestrator.step_once()  # loads version 1: its episodes are the adapter's
            orchestrator.evaluator.wait()
            tokenized = {
                prompt.question: client.tokenize_chat(prompt.messages, add_generation_prompt=True)
                for _, prompts, _ in generated
                for prompt in prompts
            }
            # What the base model gives each token of its episodes, scored afresh.
            base_groups = generated[0][2]
            scored = [
                prompt_logprobs(server, episode.prompt_ids + episode.token_ids)
                for group in base_groups
                for episode in group
            ]
        finally:
            adapters.unload_all()
            orchestrator.env.close()

    assert [model for model, _, _ in generated][:2] == [server.model, "run_v@step1"]
    rewards = []
    for _, prompts, groups in generated:
        assert [len(group) for group in groups] == [4] * len(prompts)
        for prompt, group in zip(prompts, groups, strict=True):
            assert 3 <= len(prompt.question) <= 6, "a train task of the taskset"
            for episode in group:
                (reply,) = episode.replies
                # The prompt as vLLM renders it, the reply's tokens as it sampled them
                # (special ones too, which the text leaves out), a log-prob each, all trained.
                assert episode.prompt_ids == tokenized[prompt.question]
                assert tokenizer.decode(episode.token_ids, skip_special_tokens=True) == reply
                assert len(episode.logprobs) == len(episode.token_ids) == len(episode.mask)
                assert all(episode.mask) and all(lp <= 0 for lp in episode.logprobs)
                assert episode.reward == pytest.approx(rubric(reply, prompt.answer))
                rewards.append(episode.reward)
    assert sum(rewards) / len(rewards) > 0.5, "the tiny model reverses 3 to 6 letters well"
    # Sampled at temperature 1 from the base model: each log-prob is the model's own.
    episodes = [episode for group in base_groups for episode in group]
    for episode, fresh in zip(episodes, scored, strict=True):
        assert episode.logprobs == pytest.approx(fresh[len(episode.prompt_ids) :], abs=1e-3)

    (base_eval, *_) = read_metrics(run, "eval")
    assert base_eval["policy_version"] == 0 and base_eval["eval_samples"] == 4
    assert base_eval["eval_reward_mean"] > 0.2, "scored on the test split's 7 and 8 letters"
    steps = read_metrics(run, "orchestrator")
    assert [r["policy_version"] for r in steps] == [0, 1]
