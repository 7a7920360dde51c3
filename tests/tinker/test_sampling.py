"""Sampling and checkpoints through the real tinker SDK (0.38.0), the real service process
and a real vLLM (the CPU build) serving the built-in model.

No trainer runs here: the test answers the service's work items as the trainer does
(`answer`), writing a peft adapter where save_weights_for_sampler asks for one
(`tests.helpers.random_adapter`, through the trainer's own `write_adapter`)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import tinker

from tests.helpers import random_adapter
from tests.tinker.conftest import BUILTIN as BASE
from tests.tinker.conftest import SERVICE_RECIPE, sdk_client, start_service
from workbench.files import tinker_work as tw

API_KEY = "tml-workbench-sampling-test-0123456789"


@pytest.fixture(scope="module")
def experiment(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("exp")
    (path / "recipe.toml").write_text(SERVICE_RECIPE)
    return path


@pytest.fixture(scope="module")
def service(experiment):
    """The service process, started before any vLLM: it finds vLLM when a sample needs it."""
    proc, url = start_service(experiment, API_KEY)
    yield url
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="module")
def vllm(experiment):
    """vLLM for the experiment, as the supervisor starts it (supervisor/endpoint.json)."""
    pytest.importorskip("vllm")
    from workbench.testing.local_server import start_local_server, stop_local_server

    local = start_local_server(experiment, BASE, max_loras=4, max_lora_rank=8, timeout_s=400)
    yield local.endpoint
    stop_local_server(local.process)


@pytest.fixture(scope="module")
def client(service):
    with sdk_client(service, API_KEY) as client:
        yield client


@pytest.fixture(scope="module")
def rest(service):
    return tinker.RestClient(base_url=service, api_key=API_KEY)


@pytest.fixture(scope="module")
def model_dir() -> Path:
    from workbench.models.resolve import resolve_model

    return resolve_model(BASE)


def answer(experiment: Path, op: str, write=None, timeout: float = 60.0) -> tw.WorkItem:
    """Do what the trainer does with the next pending `op` item of any Tinker run: `write`
    its output (given the item), then its result."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for run in experiment.glob("run_tinker_*"):
            pending = tw.pending_requests(run)
            if pending and pending[0].request.op == op:
                item = pending[0]
                if write is not None:
                    write(item)
                tw.write_result(item, ok=True, path=item.request.path)
                return item
        time.sleep(0.1)
    raise AssertionError(f"no pending {op} work item in {timeout} s")


def publish_adapter(experiment: Path, model_dir: Path, seed: int):
    """Answer the next save_weights_for_sampler with a random adapter of `seed`."""
    return answer(
        experiment,
        "save_weights_for_sampler",
        lambda item: random_adapter(model_dir, Path(item.request.path), seed),
    )


def tokens(n: int = 6) -> list[int]:
    return list(range(5, 5 + n))


def prompt() -> tinker.types.ModelInput:
    return tinker.types.ModelInput.from_ints(tokens())


def greedy(sampler) -> list[int]:
    params = tinker.types.SamplingParams(max_tokens=10, temperature=0.0)
    return sampler.sample(prompt(), 1, params).result(timeout=300).sequences[0].tokens


@pytest.mark.slow
def test_the_base_model_samples_reproducibly_with_a_seed_num_samples_and_stop(client, vllm):
    sampler = client.create_sampling_client(base_model=BASE).result(timeout=60)
    params = tinker.types.SamplingParams(max_tokens=12, temperature=1.0, seed=11)
    first = sampler.sample(prompt(), 3, params).result(timeout=300)
    again = sampler.sample(prompt(), 3, params).result(timeout=300)
    assert len(first.sequences) == 3
    assert [s.tokens for s in first.sequences] == [s.tokens for s in again.sequences]
    for sequence in first.sequences:
        assert 1 <= len(sequence.tokens) <= 12
        assert len(sequence.logprobs) == len(sequence.tokens)
        assert all(lp <= 0 for lp in sequence.logprobs)
        assert sequence.sequence_id
    # A stop token: the same seeded draw, ended at (and with) that token's first place.
    drawn = first.sequences[0].tokens
    stop = drawn[min(2, len(drawn) - 1)]
    cut = drawn[: drawn.index(stop) + 1]
    stopped = sampler.sample(
        prompt(), 1, tinker.types.SamplingParams(max_tokens=12, seed=11, stop=[stop])
    ).result(timeout=300)
    assert stopped.sequences[0].tokens == cut
    assert stopped.sequences[0].stop_reason == "stop"
    short = sampler.sample(
        prompt(), 1, tinker.types.SamplingParams(max_tokens=2, seed=11, stop=[])
    ).result(timeout=300)
    assert len(short.sequences[0].tokens) == 2 and short.sequences[0].stop_reason == "length"


@pytest.mark.slow
def test_prompt_logprobs_come_with_a_sample_and_from_compute_logprobs(client, vllm):
    sampler = client.create_sampling_client(base_model=BASE).result(timeout=60)
    params = tinker.types.SamplingParams(max_tokens=1, temperature=1.0, seed=1)
    result = sampler.sample(prompt(), 1, params, include_prompt_logprobs=True).result(timeout=300)
    logprobs = result.prompt_logprobs
    assert len(logprobs) == len(tokens()) and logprobs[0] is None
    assert all(value is not None and value <= 0 for value in logprobs[1:])
    computed = sampler.compute_logprobs(prompt()).result(timeout=300)
    assert computed[0] is None
    assert np.allclose(computed[1:], logprobs[1:], atol=1e-5)


@pytest.mark.slow
def test_a_sampler_keeps_the_weights_it_was_made_from_after_a_later_publish(
    client, vllm, experiment, model_dir
):
    training = client.create_lora_training_client(base_model=BASE, rank=8).result(timeout=60)
    future = training.save_weights_and_get_sampling_client()
    publish_adapter(experiment, model_dir, seed=1)
    first = future.result(timeout=120)
    first_tokens = greedy(first)
    future = training.save_weights_and_get_sampling_client()
    publish_adapter(experiment, model_dir, seed=2)
    second = future.result(timeout=120)
    base = greedy(client.create_sampling_client(base_model=BASE).result(timeout=60))
    # Three different models (the adapters are strong enough to change greedy output) ...
    assert len({tuple(first_tokens), tuple(greedy(second)), tuple(base)}) == 3
    # ... and the first sampler still samples the first version.
    assert greedy(first) == first_tokens


@pytest.mark.slow
def test_checkpoints_listed_described_and_deleted_then_sampling_them_is_a_4xx(
    client, rest, vllm, experiment, model_dir
):
    training = client.create_lora_training_client(base_model=BASE, rank=4).result(timeout=60)
    save = training.save_weights_for_sampler("keep")
    publish_adapter(experiment, model_dir, seed=3)
    path = save.result(timeout=60).path
    assert path == f"tinker://{training.model_id}/sampler_weights/keep"
    sampler = client.create_sampling_client(model_path=path).result(timeout=60)
    assert greedy(sampler)
    listed = rest.list_checkpoints(training.model_id).result(timeout=60).checkpoints
    assert [(c.tinker_path, c.checkpoint_type) for c in listed] == [(path, "sampler")]
    info = rest.get_weights_info_by_tinker_path(path).result(timeout=60)
    assert (info.base_model, info.is_lora, info.lora_rank) == (BASE, True, 4)

    rest.delete_checkpoint_from_tinker_path(path).result(timeout=60)
    assert rest.list_checkpoints(training.model_id).result(timeout=60).checkpoints == []
    with pytest.raises(tinker.APIStatusError, match="was deleted") as refused:
        sampler.sample(prompt(), 1, tinker.types.SamplingParams(max_tokens=4)).result(timeout=60)
    assert refused.value.status_code == 410
    with pytest.raises(tinker.APIStatusError, match="was deleted"):
        client.create_sampling_client(model_path=path).result(timeout=60)
    # The path stays taken: a save under its name would give it a second content.
    with pytest.raises(tinker.APIStatusError, match="never change") as taken:
        training.save_weights_for_sampler("keep").result(timeout=30)
    assert taken.value.status_code == 400


def test_a_training_client_from_state_loads_it_as_its_first_work_item(client, rest, experiment):
    source = client.create_lora_training_client(base_model=BASE, rank=2).result(timeout=60)
    saved = source.save_state("s1")
    save = answer(
        experiment, "save_state", lambda item: Path(item.request.path).mkdir(parents=True)
    )
    path = saved.result(timeout=60).path
    assert path == f"tinker://{source.model_id}/weights/s1"
    future = client.create_training_client_from_state(path)
    load = answer(experiment, "load_state")
    # A new run, whose item 0 (before the client's seq_id 1) loads the source's state.
    assert load.path.parents[2] != save.path.parents[2]
    assert (load.seq, load.request.path, load.request.with_optimizer) == (
        0,
        save.request.path,
        False,
    )
    restored = future.result(timeout=60)
    assert restored.model_id != source.model_id
    assert restored.get_info().lora_rank == 2
    info = rest.get_weights_info_by_tinker_path(path).result(timeout=60)
    assert info.lora_rank == 2


def test_token_ids_outside_the_vocabulary_or_unserved_options_are_a_400(client):
    sampler = client.create_sampling_client(base_model=BASE).result(timeout=60)
    params = tinker.types.SamplingParams(max_tokens=2)
    outside = tinker.types.ModelInput.from_ints([5, 100_000])
    with pytest.raises(tinker.APIStatusError, match="outside the vocabulary") as refused:
        sampler.sample(outside, 1, params).result(timeout=60)
    assert refused.value.status_code == 400
    with pytest.raises(tinker.APIStatusError, match="topk_prompt_logprobs"):
        sampler.sample(prompt(), 1, params, topk_prompt_logprobs=3).result(timeout=60)
    with pytest.raises(tinker.APIStatusError, match="not served here"):
        client.create_sampling_client(base_model="Qwen/Qwen3-8B").result(timeout=60)
