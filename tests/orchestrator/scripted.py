"""A scripted stand-in for the inference server, and orchestrators built on it.

The stand-in answers chat requests with scripted completions and, like vLLM, refuses a
request for an adapter that is not loaded; it records every request, load and unload.
`scripted_server` puts it behind the HTTP endpoints of vLLM's server that the orchestrator
uses, so a real orchestrator process (its HTTP client, its logging) can run against it. The
real vLLM server is exercised in tests/inference and tests/orchestrator/test_eval_with_vllm.py.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from workbench.config import OrchestratorConfig, SamplingParams
from workbench.files import layout
from workbench.files.endpoint import Endpoint, new_api_key, write_endpoint
from workbench.inference.client import (
    NON_FINITE_ANSWER,
    AdapterVersions,
    ChatResult,
    Completion,
    InferenceError,
    NonFiniteSamples,
)
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

    def chat(self, messages, *, model, n, sampling, seed):
        temperature = sampling.temperature
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


def trainer_publishes_after(run: Path, step: int, polls: list[float], count: int):
    """An orchestrator's `sleep` that records each poll and publishes `broadcast/step_N`
    (as the trainer would) at the `count`-th."""

    def sleep(seconds: float) -> None:
        polls.append(seconds)
        if len(polls) == count:
            publish_adapter(run, step)

    return sleep


@contextlib.contextmanager
def scripted_server(experiment: Path, chat: ScriptedChat) -> Iterator[Endpoint]:
    """Serve `chat` over HTTP on a free loopback port (health, chat completions with token
    ids and log-probs, adapter loading, as vLLM answers them) and write the experiment's
    `supervisor/endpoint.json` pointing at it."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self._reply(200 if self.path == "/health" else 404, {})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            try:
                if self.path == "/v1/chat/completions":
                    self._reply(200, _chat_response(chat, body))
                elif self.path == "/v1/load_lora_adapter":
                    chat.load_adapter(body["lora_name"], Path(body["lora_path"]))
                    self._reply(200, {})
                elif self.path == "/v1/unload_lora_adapter":
                    chat.unload_adapter(body["lora_name"])
                    self._reply(200, {})
                else:
                    self._reply(404, {"error": f"no route {self.path}"})
            except NonFiniteSamples:
                # vLLM's answer when its response would hold inf or nan.
                error = {"message": NON_FINITE_ANSWER, "type": "BadRequestError", "code": 400}
                self._reply(400, {"error": error})
            except InferenceError as err:
                self._reply(404, {"error": str(err)})

        def _reply(self, status: int, data: dict) -> None:
            payload = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):  # the test's output, not the server's, matters here
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = Endpoint(
        base_url=f"http://127.0.0.1:{server.server_port}/v1",
        api_key=new_api_key(),
        model=BASE_MODEL,
    )
    write_endpoint(experiment, endpoint)
    try:
        yield endpoint
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _chat_response(chat: ScriptedChat, body: dict) -> dict:
    result = chat.chat(
        body["messages"],
        model=body["model"],
        n=body["n"],
        sampling=SamplingParams(
            max_tokens=body["max_tokens"], temperature=body["temperature"], top_p=body["top_p"]
        ),
        seed=body.get("seed"),
    )
    choices = [
        {
            "index": i,
            "message": {"role": "assistant", "content": completion.text},
            "token_ids": completion.token_ids,
            "logprobs": {"content": [{"logprob": value} for value in completion.logprobs]},
            "finish_reason": completion.finish_reason,
        }
        for i, completion in enumerate(result.completions)
    ]
    return {"prompt_token_ids": result.prompt_token_ids, "choices": choices}
