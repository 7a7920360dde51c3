"""A scripted stand-in for the inference server, and orchestrators built on it.

The stand-in answers chat requests with scripted completions and, like vLLM, refuses a
request for an adapter that is not loaded; it records every request, load and unload. The
real vLLM server is exercised in tests/inference and tests/orchestrator/test_eval_with_vllm.py.
"""

from __future__ import annotations

import threading
from pathlib import Path

from workbench import layout
from workbench.config import OrchestratorConfig
from workbench.inference.client import AdapterVersions, ChatResult, Completion, InferenceError
from workbench.orchestrator.loop import Orchestrator

BASE_MODEL = "base"


class ScriptedChat:
    """Stand-in for the inference server: answers with scripted completions, records calls.

    `hold_greedy`, when set, is an Event that greedy (temperature 0: eval) requests wait for,
    so a test can keep an eval running while training goes on.
    """

    def __init__(self, answer=lambda prompt_text, i: prompt_text[::-1][: i + 1]):
        self.answer = answer
        self.requests: list[dict] = []
        self.loaded: list[str] = []
        self.unloaded: list[str] = []
        self.endpoint = type("E", (), {"model": BASE_MODEL})()
        self.hold_greedy: threading.Event | None = None
        self.fail_greedy = False

    def chat(self, messages, *, model, n, max_tokens, temperature, top_p, seed):
        question = messages[-1]["content"]
        self.requests.append(
            {"model": model, "n": n, "seed": seed, "temperature": temperature, "question": question}
        )
        if temperature == 0 and self.hold_greedy is not None:
            self.hold_greedy.wait(timeout=10)
        if temperature == 0 and self.fail_greedy:
            raise InferenceError("POST /v1/chat/completions answered 500: scripted failure")
        if model != BASE_MODEL and model not in self.served:
            raise InferenceError(f"POST /v1/chat/completions answered 404: no model {model}")
        completions = []
        for i in range(n):
            text = self.answer(question, i)
            ids = [ord(c) % 50 + 3 for c in text] or [2]
            completions.append(Completion(text, ids, [-0.5] * len(ids), "stop"))
        return ChatResult(prompt_token_ids=[1, 5, 6, 7], completions=completions)

    @property
    def served(self) -> set[str]:
        return set(self.loaded) - set(self.unloaded)

    def load_adapter(self, name, path):
        assert layout.is_stable(path)
        self.loaded.append(name)

    def unload_adapter(self, name):
        self.unloaded.append(name)


def make_orchestrator(run: Path, client: ScriptedChat, **overrides) -> Orchestrator:
    values = {
        "batch_size": 8,
        "rollouts_per_prompt": 4,
        "max_steps": 3,
        "async_level": 1,
        # Evals send their own requests from a thread; tests of evals turn them on.
        "eval": {"interval": 0},
        **overrides,
    }
    config = OrchestratorConfig(**values)
    adapters = AdapterVersions(client, run.name)
    return Orchestrator(run, config, client, adapters, poll_s=0.0, sleep=lambda s: None)


def publish_adapter(run: Path, step: int) -> None:
    """What the trainer does after update `step`: a STABLE `broadcast/step_N`."""
    directory = layout.broadcast_dir(run, step)
    with layout.staged_directory(directory) as staging:
        (staging / "adapter_model.safetensors").write_bytes(b"")
