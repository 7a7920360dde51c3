"""Asking the inference server for completions of many prompts at once."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from workbench.config import SamplingParams
from workbench.envs.base import Prompt
from workbench.inference.client import ChatResult

MAX_REQUESTS_IN_FLIGHT = 32


class ChatClient(Protocol):
    """What the orchestrator needs from the inference server (`InferenceClient` is the real
    one)."""

    def chat(self, messages, *, model, n, sampling, seed) -> ChatResult: ...

    def load_adapter(self, name, path) -> None: ...

    def unload_adapter(self, name: str) -> None: ...


def complete_prompts(
    client: ChatClient,
    prompts: list[Prompt],
    seeds: list[int],
    *,
    model: str,
    n: int,
    sampling: SamplingParams,
) -> list[ChatResult]:
    """`n` completions of each prompt (with its own sampling seed), in the prompts' order."""

    def one(args: tuple[Prompt, int]) -> ChatResult:
        prompt, seed = args
        return client.chat(
            prompt.messages,
            model=model,
            n=n,
            sampling=sampling,
            seed=seed,
        )

    # One request per prompt, all in flight at once so vLLM batches them.
    pool = ThreadPoolExecutor(max_workers=min(MAX_REQUESTS_IN_FLIGHT, len(prompts)))
    try:
        return list(pool.map(one, zip(prompts, seeds, strict=True)))
    finally:
        # Interrupted (SIGTERM), do not wait for requests in flight: a server stopping at
        # the same time (its supervisor died) may never answer them. Closing the client
        # then ends them.
        pool.shutdown(wait=False, cancel_futures=True)
