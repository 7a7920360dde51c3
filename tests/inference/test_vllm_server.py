"""Against the real vLLM server (CPU build) and the built-in tiny model: adapters, log-probs,
and multi-turn episodes whose tokens and log-probs are the model's own."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.helpers import random_adapter, served_models
from workbench.config import SamplingParams
from workbench.envs import get_environment
from workbench.inference.client import AdapterVersions, InferenceClient
from workbench.inference.token_id_logprobs import with_logprobs_as_ids
from workbench.orchestrator.episodes import run_episodes

pytestmark = pytest.mark.slow
PROMPT = [{"role": "user", "content": "reverse: abcdefghij"}]


def greedy(client: InferenceClient, model: str) -> str:
    result = client.chat(
        PROMPT, model=model, n=1, sampling=SamplingParams(max_tokens=24, temperature=0.0), seed=0
    )
    return result.completions[0].text


def test_two_adapters_loaded_at_once_give_different_completions(server, tiny_reverse, tmp_path):
    first = random_adapter(tiny_reverse, tmp_path / "a", seed=1)
    second = random_adapter(tiny_reverse, tmp_path / "b", seed=2)
    with InferenceClient(server) as client:
        client.load_adapter("run_a@step1", first)
        client.load_adapter("run_b@step1", second)
        assert {"run_a@step1", "run_b@step1"} <= set(served_models(client.endpoint))
        outputs = {
            name: greedy(client, name) for name in ("run_a@step1", "run_b@step1", server.model)
        }
        assert len(set(outputs.values())) == 3, outputs
        client.unload_adapter("run_a@step1")
        client.unload_adapter("run_b@step1")


def test_after_a_reload_generation_uses_the_new_adapter(server, tiny_reverse, tmp_path):
    old = random_adapter(tiny_reverse, tmp_path / "old", seed=3)
    new = random_adapter(tiny_reverse, tmp_path / "new", seed=4)
    with InferenceClient(server) as client:
        client.load_adapter("reference-new", new)
        expected_new = greedy(client, "reference-new")
        client.unload_adapter("reference-new")

        versions = AdapterVersions(client, "run_x")
        versions.load(1, old)
        with_old = greedy(client, versions.model_for_requests())
        versions.load(2, new)
        with_new = greedy(client, versions.model_for_requests())
        assert with_new == expected_new and with_new != with_old
        served = served_models(client.endpoint)
        assert "run_x@step2" in served and "run_x@step1" not in served
        versions.unload_all()


def test_completions_carry_token_ids_and_logprobs_the_trainer_reproduces(
    server, tiny_reverse, tmp_path
):
    adapter = random_adapter(tiny_reverse, tmp_path / "lp", seed=5)
    with InferenceClient(server) as client:
        client.load_adapter("logprob-check", adapter)
        result = client.chat(
            PROMPT, model="logprob-check", n=2, sampling=SamplingParams(max_tokens=16), seed=7
        )
        client.unload_adapter("logprob-check")
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_reverse))
    rendered = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False)
    expected_prompt = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert result.prompt_token_ids == list(expected_prompt)
    base = AutoModelForCausalLM.from_pretrained(str(tiny_reverse), dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(adapter)).eval()
    for completion in result.completions:
        assert len(completion.token_ids) == len(completion.logprobs) >= 1
        ids = torch.tensor([result.prompt_token_ids + completion.token_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].float()
        logprobs = torch.log_softmax(logits, -1)
        n = len(result.prompt_token_ids)
        ours = [float(logprobs[n - 1 + i, tok]) for i, tok in enumerate(completion.token_ids)]
        assert ours == pytest.approx(completion.logprobs, abs=2e-3)


def test_logprobs_asked_as_ids_decode_no_token_and_are_the_same_numbers(server):
    import httpx

    chat = {
        "model": server.model,
        "messages": PROMPT,
        "n": 2,
        "max_tokens": 12,
        "seed": 3,
        "logprobs": True,
        "return_token_ids": True,
    }
    completion = {
        "model": server.model,
        "prompt": [1, 2, 3, 4],
        "max_tokens": 12,
        "seed": 3,
        "logprobs": 0,
        "return_token_ids": True,
    }
    headers = {"Authorization": f"Bearer {server.api_key}"}
    with httpx.Client(base_url=server.server_url, headers=headers, timeout=120) as http:

        def answer(path: str, body: dict) -> dict:
            response = http.post(path, json=body)
            assert response.status_code == 200, response.text
            return response.json()

        plain = answer("/v1/chat/completions", chat)
        as_ids = answer("/v1/chat/completions", with_logprobs_as_ids(chat))
        plain_completion = answer("/v1/completions", completion)
        completion_as_ids = answer("/v1/completions", with_logprobs_as_ids(completion))

    for ours, vllms in zip(as_ids["choices"], plain["choices"], strict=True):
        assert ours["message"]["content"] == vllms["message"]["content"] != ""
        assert ours["token_ids"] == vllms["token_ids"]
        tokens, plain_tokens = ours["logprobs"]["content"], vllms["logprobs"]["content"]
        assert [t["logprob"] for t in tokens] == [t["logprob"] for t in plain_tokens]
        assert [t["token"] for t in tokens] == [f"token_id:{i}" for i in ours["token_ids"]]
        assert all(t["bytes"] is None for t in tokens)
        assert all(t["bytes"] is not None for t in plain_tokens)  # vLLM decodes them itself
    ours, vllms = completion_as_ids["choices"][0], plain_completion["choices"][0]
    assert ours["text"] == vllms["text"] and ours["token_ids"] == vllms["token_ids"]
    assert ours["logprobs"]["token_logprobs"] == vllms["logprobs"]["token_logprobs"]
    assert ours["logprobs"]["tokens"] == [f"token_id:{i}" for i in ours["token_ids"]]


def test_requests_for_two_adapters_and_the_base_batched_together_each_get_their_own_model(
    server, tiny_reverse, tmp_path
):
    """Sent at once, vLLM decodes them in the same batches: every token must still go
    through its own adapter's weights (or none), as peft computes them alone."""
    adapters = {
        "mix-a": random_adapter(tiny_reverse, tmp_path / "mix-a", seed=21),
        "mix-b": random_adapter(tiny_reverse, tmp_path / "mix-b", seed=22),
    }
    names = [*adapters, server.model]
    with InferenceClient(server) as client:
        for name, path in adapters.items():
            client.load_adapter(name, path)
        with ThreadPoolExecutor(len(names)) as pool:
            results = dict(
                zip(
                    names,
                    pool.map(
                        lambda name: client.chat(
                            PROMPT, model=name, n=4, sampling=SamplingParams(max_tokens=12), seed=3
                        ),
                        names,
                    ),
                    strict=True,
                )
            )
        for name in adapters:
            client.unload_adapter(name)
    base = AutoModelForCausalLM.from_pretrained(str(tiny_reverse), dtype=torch.float32).eval()
    for name, result in results.items():
        model = PeftModel.from_pretrained(base, str(adapters[name])) if name in adapters else base
        for completion in result.completions:
            ids = torch.tensor([result.prompt_token_ids + completion.token_ids])
            with torch.no_grad():
                logprobs = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
            n = len(result.prompt_token_ids)
            ours = [float(logprobs[n - 1 + i, t]) for i, t in enumerate(completion.token_ids)]
            assert ours == pytest.approx(completion.logprobs, abs=2e-3), name
        if name in adapters:
            base = model.unload()


def test_every_model_turn_is_trained_on_its_sampled_tokens_with_vllms_logprobs(
    server, tiny_reverse
):
    env = get_environment("reverse_chain", turns=3, min_length=3, max_length=4)
    prompts = env.sample_prompts(2, seed=4)
    with InferenceClient(server) as client:
        groups = run_episodes(
            client,
            env,
            prompts,
            [11, 12],
            model=server.model,
            n=2,
            sampling=SamplingParams(max_tokens=8, temperature=1.0, top_p=1.0),
        )
    assert any(not episode.truncated for group in groups for episode in group)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_reverse))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_reverse), dtype=torch.float32).eval()
    for prompt, group in zip(prompts, groups, strict=True):
        assert len(group) == 2
        for episode in group:
            assert len(episode.token_ids) == len(episode.logprobs) == len(episode.mask)
            if episode.truncated:
                continue
            assert len(episode.replies) == 3 and episode.env_messages == prompt.info["texts"][1:]
            # The environment's messages sit between the turns, masked, with no log-prob.
            turns = _runs(episode.mask)
            assert [trained for trained, _ in turns] == [True, False, True, False, True]
            assert all(
                lp == 0.0 for lp, m in zip(episode.logprobs, episode.mask, strict=True) if not m
            )
            # The whole sequence is the conversation as the chat template writes it: no
            # token was re-tokenised into something else.
            rendered = tokenizer.apply_chat_template(
                episode.chat(prompt), add_generation_prompt=False, tokenize=False
            )
            expected = tokenizer(rendered, add_special_tokens=False)["input_ids"]
            assert episode.prompt_ids + episode.token_ids == list(expected)
            # Each model token's log-prob is the model's, given everything before it.
            ids = torch.tensor([episode.prompt_ids + episode.token_ids])
            with torch.no_grad():
                logprobs = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
            start = len(episode.prompt_ids)
            for i, (token, trained) in enumerate(zip(episode.token_ids, episode.mask, strict=True)):
                if trained:
                    ours = float(logprobs[start + i - 1, token])
                    assert abs(ours - episode.logprobs[i]) < 2e-3, (i, ours, episode.logprobs[i])
            assert 0.0 <= episode.reward <= 1.0
            assert episode.reward == env.episode_reward(prompt, episode.replies)


def _runs(mask: list[bool]) -> list[tuple[bool, int]]:
    runs: list[tuple[bool, int]] = []
    for value in mask:
        if runs and runs[-1][0] == value:
            runs[-1] = (value, runs[-1][1] + 1)
        else:
            runs.append((value, 1))
    return runs
