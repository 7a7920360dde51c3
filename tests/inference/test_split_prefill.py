"""A seeded request whose prefill vLLM splits across engine steps gives the tokens it gives
unsplit (`workbench.inference.seeded_sampling`), on the real vLLM server (CPU build).

The split is made certain, not left to the step budget: vLLM splits a prefill longer than
its budget (`max_num_batched_tokens`) over several steps (chunked prefill), so the prompts
are first sampled alone on a server whose budget holds each one whole, then together on a
server whose budget, read back from its own log, is a third of the shortest of them."""

from __future__ import annotations

import random
import re
import string
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

from workbench.config import SamplingParams
from workbench.files.endpoint import Endpoint
from workbench.inference.client import InferenceClient
from workbench.testing.local_server import start_local_server, stop_local_server

pytestmark = pytest.mark.slow
BASE = "builtin:tiny-reverse"
PROMPTS = 32
# What vLLM logs at startup when it splits prefills, with the budget it took.
CHUNKED_PREFILL = re.compile(r"Chunked prefill is enabled with max_num_batched_tokens=(\d+)")


@contextmanager
def served(experiment: Path, extra_args: tuple[str, ...] = ()) -> Iterator[tuple[Endpoint, int]]:
    """A vLLM server on the tiny model and the step budget it logged it runs with."""
    local = start_local_server(
        experiment, BASE, max_loras=1, max_lora_rank=8, timeout_s=400, extra_args=extra_args
    )
    try:
        found = CHUNKED_PREFILL.search(local.log_path.read_text(errors="replace"))
        assert found, f"vLLM did not log that it splits prefills; see {local.log_path}"
        yield local.endpoint, int(found.group(1))
    finally:
        stop_local_server(local.process)


def sample(client: InferenceClient, model: str, prompt: list[dict], seed: int) -> tuple:
    """The prompt's tokens as the server read it, and one seeded completion's tokens."""
    result = client.chat(
        prompt, model=model, n=1, sampling=SamplingParams(max_tokens=16), seed=seed
    )
    return result.prompt_token_ids, result.completions[0].token_ids


def test_a_seeded_request_whose_prefill_is_split_gives_the_tokens_it_gives_alone(tmp_path):
    """Each token sampled for an unfinished prefill is thrown away; on the CPU vLLM's own
    rewind of the request's generator crashed the engine (it rewinds a CUDA offset), and
    the rewind workbench's plugin does instead must leave each request's tokens as they
    are unsplit."""
    rng = random.Random(0)
    letters = string.ascii_lowercase
    prompts = [
        [{"role": "user", "content": "reverse: " + "".join(rng.choices(letters, k=190))}]
        for _ in range(PROMPTS)
    ]
    with served(tmp_path / "whole") as (endpoint, budget), InferenceClient(endpoint) as client:
        alone = [
            sample(client, endpoint.model, prompt, seed) for seed, prompt in enumerate(prompts)
        ]
    lengths = [len(prompt_ids) for prompt_ids, _ in alone]
    # One request at a time, each prompt within one step's budget: none was split.
    assert max(lengths) <= budget, (lengths, budget)

    split_budget = min(lengths) // 3
    extra = ("--max-num-seqs", str(split_budget), "--max-num-batched-tokens", str(split_budget))
    with (
        served(tmp_path / "split", extra) as (endpoint, budget),
        InferenceClient(endpoint) as client,
    ):
        # Every prompt is longer than a step takes: each prefill is split, into 3 or more.
        assert budget == split_budget and min(lengths) > 2 * budget, (lengths, budget)
        with ThreadPoolExecutor(PROMPTS) as pool:
            together = list(
                pool.map(
                    lambda seed: sample(client, endpoint.model, prompts[seed], seed),
                    range(PROMPTS),
                )
            )
    assert [ids for ids, _ in together] == [ids for ids, _ in alone]
    assert [tokens for _, tokens in together] == [tokens for _, tokens in alone]
