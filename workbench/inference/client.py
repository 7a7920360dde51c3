"""Talking to the inference server: chat completions with token ids and log-probs,
completions of token-id prompts (multi-turn episodes), the chat template's tokens, and
runtime adapter loading.

Adapter versions are loaded under one name per version (`run_abc@step3`), never reloaded
in place under a fixed name. Two vLLM pitfalls make in-place reloads wrong or slow: a
same-name reload may keep serving the old weights or re-read the adapter from disk on
later requests, and prefix-cache blocks computed with the old weights stay keyed to the
old name's adapter id. A fresh name gets a fresh adapter id, so neither can happen; the
previous version is unloaded once the new one is in.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from workbench.config import SamplingParams
from workbench.files.endpoint import Endpoint
from workbench.inference.token_id_logprobs import with_logprobs_as_ids

logger = logging.getLogger(__name__)

KEEPALIVE_EXPIRY_S = 2.0


class InferenceError(RuntimeError):
    """The inference server refused a request; the message carries its answer."""


class NonFiniteSamples(InferenceError):
    """vLLM sampled but cannot send its answer: a log-prob in it is not a finite number,
    which JSON cannot carry. The model's numbers overflow with the adapter asked for (a
    policy that diverged); the same request fails again."""


# What vLLM's server answers (400) when a response holds inf or nan (Starlette's JSON
# encoder refuses them).
NON_FINITE_ANSWER = "Out of range float values are not JSON compliant"


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


@dataclass
class ChatResult:
    prompt_token_ids: list[int]
    completions: list[Completion] = field(default_factory=list)


def adapter_name(run_id: str, step: int) -> str:
    return f"{run_id}@step{step}"


class InferenceClient:
    """Synchronous client (each orchestrator sends one batched request at a time)."""

    def __init__(self, endpoint: Endpoint, timeout_s: float = 600.0):
        self.endpoint = endpoint
        self._http = httpx.Client(
            headers={"Authorization": f"Bearer {endpoint.api_key}"},
            timeout=httpx.Timeout(timeout_s, connect=10.0),
            # vLLM closes a connection idle for 5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE), httpx's default
            # expiry too: a request may go out on a connection the server is closing and
            # fail with "connection reset". Dropping idle connections sooner avoids that.
            limits=httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY_S),
        )

    def close(self) -> None:
        self._http.close()

    def healthy(self, timeout_s: float = 5.0) -> bool:
        """Whether vLLM answers its health check now (over this client's connections)."""
        try:
            url = self.endpoint.server_url + "/health"
            return self._http.get(url, timeout=timeout_s).status_code == 200
        except httpx.HTTPError:
            return False

    def __enter__(self) -> InferenceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def chat(
        self,
        messages: list[dict[str, str]],
        *,
        model: str,
        n: int,
        sampling: SamplingParams,
        seed: int | None = None,
    ) -> ChatResult:
        """`n` completions of one conversation with the token ids and their log-probs."""
        body: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "n": n,
            **asdict(sampling),
            "logprobs": True,
            "return_token_ids": True,
        }
        if seed is not None:
            body["seed"] = seed
        data = self._post("/v1/chat/completions", with_logprobs_as_ids(body))
        result = ChatResult(prompt_token_ids=list(data.get("prompt_token_ids") or []))
        for choice in sorted(data["choices"], key=lambda c: c["index"]):
            content = (choice.get("logprobs") or {}).get("content") or []
            result.completions.append(
                Completion(
                    text=choice["message"].get("content") or "",
                    token_ids=list(choice.get("token_ids") or []),
                    logprobs=[float(item["logprob"]) for item in content],
                    finish_reason=choice.get("finish_reason"),
                )
            )
        return result

    def complete_tokens(
        self,
        prompt_ids: list[int],
        *,
        model: str,
        sampling: SamplingParams,
        seed: int | None = None,
    ) -> Completion:
        """One completion of a prompt given as token ids (no template applied, nothing
        re-tokenised), with the sampled token ids and their log-probs: how a multi-turn
        episode continues from exactly the tokens it has so far."""
        body: dict[str, Any] = {
            "model": model,
            "prompt": prompt_ids,
            **asdict(sampling),
            "logprobs": 0,  # the sampled token's own log-prob, no alternatives
            "return_token_ids": True,
        }
        if seed is not None:
            body["seed"] = seed
        choice = self._post("/v1/completions", with_logprobs_as_ids(body))["choices"][0]
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs") or []
        return Completion(
            text=choice.get("text") or "",
            token_ids=list(choice.get("token_ids") or []),
            logprobs=[float(value) for value in logprobs],
            finish_reason=choice.get("finish_reason"),
        )

    def tokenize_chat(
        self, messages: list[dict[str, str]], *, add_generation_prompt: bool
    ) -> list[int]:
        """The server's tokens for a conversation rendered by the model's chat template."""
        body = {
            "model": self.endpoint.model,
            "messages": messages,
            "add_generation_prompt": add_generation_prompt,
        }
        return list(self._post("/tokenize", body)["tokens"])

    def tokenize_text(self, text: str) -> list[int]:
        """The server's tokens for plain text, without special tokens added."""
        body = {"model": self.endpoint.model, "prompt": text, "add_special_tokens": False}
        return list(self._post("/tokenize", body)["tokens"])

    def load_adapter(self, name: str, path: Path) -> None:
        self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})

    def unload_adapter(self, name: str) -> None:
        self._post("/v1/unload_lora_adapter", {"lora_name": name})

    def served_models(self) -> list[str]:
        """Every model name the server answers to now: the base and each adapter loaded."""
        response = self._http.get(self.endpoint.base_url.removesuffix("/") + "/models")
        if response.status_code != 200:
            raise InferenceError(f"GET /v1/models answered {response.status_code}")
        return [model["id"] for model in response.json().get("data", [])]

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """Any request of vLLM's API as given (the Tinker service's samples); its JSON answer."""
        return self._post(path, body)

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        url = self.endpoint.server_url + path
        response = self._http.post(url, json=body)
        if response.status_code != 200:
            error = NonFiniteSamples if NON_FINITE_ANSWER in response.text else InferenceError
            raise error(f"POST {path} answered {response.status_code}: {response.text[:500]}")
        try:
            return response.json()
        except ValueError:
            return {}


class AdapterVersions:
    """The adapter versions one run has loaded; serves the newest, unloads the older.

    A version someone still uses (an eval running in the background holds it) is unloaded
    when they let it go rather than when a newer one replaces it, so their requests never
    name an adapter that is gone. Holds are taken and released from different threads.
    """

    def __init__(self, client: InferenceClient, run_id: str):
        self.client = client
        self.run_id = run_id
        self.current_step: int | None = None
        self._lock = threading.Lock()
        self._holds: Counter[int] = Counter()
        self._replaced_while_held: set[int] = set()

    @property
    def current_name(self) -> str | None:
        return None if self.current_step is None else adapter_name(self.run_id, self.current_step)

    def model_for_requests(self) -> str:
        """The model name to generate with: the newest adapter, or the base before any."""
        return self.current_name or self.client.endpoint.model

    def load(self, step: int, path: Path) -> str:
        """Load `broadcast/step_N` as a new version, then unload the previous one (or leave
        that to `release` while it is held)."""
        name = adapter_name(self.run_id, step)
        self.client.load_adapter(name, path)
        with self._lock:
            previous, self.current_step = self.current_step, step
            if previous == step:
                previous = None
            elif previous is not None and self._holds[previous]:
                self._replaced_while_held.add(previous)
                previous = None
        if previous is not None:
            self._unload(previous)
        return name

    def hold_current(self) -> HeldVersion:
        """The version requests go to now, kept loaded until `release(held)`."""
        with self._lock:
            step = self.current_step
            if step is not None:
                self._holds[step] += 1
            return HeldVersion(step=step, model=self.model_for_requests())

    def release(self, held: HeldVersion) -> None:
        if held.step is None:  # the base model is never unloaded
            return
        with self._lock:
            if self._holds[held.step] <= 0:  # `unload_all` came first
                return
            self._holds[held.step] -= 1
            if self._holds[held.step]:
                return
            del self._holds[held.step]
            if held.step not in self._replaced_while_held:
                return
            self._replaced_while_held.discard(held.step)
        self._unload(held.step)

    def unload_all(self) -> None:
        """Unload every version this run has in vLLM, held ones included (it is stopping)."""
        with self._lock:
            steps = sorted(self._replaced_while_held)
            if self.current_step is not None:
                steps.append(self.current_step)
            self._replaced_while_held.clear()
            self._holds.clear()
            self.current_step = None
        for step in steps:
            self._unload(step)

    def _unload(self, step: int) -> None:
        name = adapter_name(self.run_id, step)
        try:
            self.client.unload_adapter(name)
        except (InferenceError, httpx.HTTPError) as err:  # a version left loaded costs memory
            logger.warning("could not unload %s: %s", name, err)


@dataclass(frozen=True)
class HeldVersion:
    """A policy version kept loaded for its holder: `step` None is the base model."""

    step: int | None
    model: str

    @property
    def policy_version(self) -> int:
        return self.step or 0
