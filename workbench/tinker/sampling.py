"""Sampling sessions and samples, through the experiment's vLLM.

A sampler is pinned when it is made: to the base model, or to one `sampler_weights`
checkpoint, a directory that never changes (`workbench.tinker.checkpoints`). vLLM serves
that adapter under a name of its own (`run_tinker_<hex>@<name>`, loaded on the first sample,
never reloaded in place: `workbench.inference.client` says why), so a sampler keeps sampling
the weights it was made from whatever the run trains or publishes later. vLLM's address and
key are read from the experiment (`supervisor/endpoint.json`) at each sample: a restarted
supervisor may have moved it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from workbench.files import endpoint as endpoint_file
from workbench.inference.client import InferenceClient, InferenceError
from workbench.inference.token_id_logprobs import with_logprobs_as_ids
from workbench.tinker import checkpoints as ckpt
from workbench.tinker import wire

log = logging.getLogger(__name__)
# Samples wait this long for vLLM to (re)start and for a sampler's adapter to be written.
WAIT_S = 600.0
POLL_S = 0.5
# How long vLLM, once it answered its health check, is taken to be up without asking again.
HEALTH_TRUST_S = 2.0
# vLLM batches what arrives together: enough threads that an RL group's samples all go out.
SAMPLE_THREADS = 64
ADAPTER_CONFIG = "adapter_config.json"


class SamplingError(Exception):
    """A sample request the service refuses: `status` and a message for the client."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(frozen=True)
class Sampler:
    sampler_id: str
    base_model: str
    run: Path | None = None  # the run whose checkpoint it samples; None: the base model
    path: ckpt.TinkerPath | None = None

    @property
    def model_path(self) -> str | None:
        return None if self.path is None else str(self.path)

    @property
    def adapter_name(self) -> str | None:
        """vLLM's name for the pinned checkpoint: one per directory, so one per content."""
        return (
            None if self.run is None or self.path is None else f"{self.run.name}@{self.path.name}"
        )


@dataclass(frozen=True)
class SampleJob:
    """What a SampleRequest asks, checked."""

    tokens: list[int]
    num_samples: int
    max_tokens: int | None
    temperature: float
    top_p: float
    top_k: int
    stop: str | list | None
    seed: int | None
    prompt_logprobs: bool
    prompt_logprobs_last_n: int | None


_UNSUPPORTED = {
    "topk_prompt_logprobs": 0,
    "topk_sample_logprobs": 0,
    "prompt_alt_tokens_k": 0,
    "target_prompt_logprobs": None,
    "record_stability_info": False,
}


def parse_job(document: dict[str, Any]) -> SampleJob:
    """A SampleRequest's JSON body (as the SDK sends it) as a job; 400 for what is wrong or
    not served, naming the field."""
    for key, off in _UNSUPPORTED.items():
        if document.get(key) not in (off, None):
            raise SamplingError(400, f"{key} is not supported by this service; leave it unset")
    tokens = _prompt_tokens(document.get("prompt"))
    params = document.get("sampling_params") or {}
    num_samples = document.get("num_samples", 1)
    if not isinstance(num_samples, int) or not 1 <= num_samples <= 256:
        raise SamplingError(400, f"num_samples must be an integer 1..256 (got {num_samples!r})")
    max_tokens = params.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise SamplingError(400, f"sampling_params.max_tokens must be >= 1 (got {max_tokens!r})")
    last_n = document.get("prompt_logprobs_last_n")
    if last_n is not None and not (isinstance(last_n, int) and 1 <= last_n <= len(tokens) - 1):
        raise SamplingError(400, f"prompt_logprobs_last_n must be 1..{len(tokens) - 1}")
    return SampleJob(
        tokens=tokens,
        num_samples=num_samples,
        max_tokens=max_tokens,
        temperature=float(params.get("temperature", 1.0)),
        top_p=float(params.get("top_p", 1.0)),
        top_k=int(params.get("top_k", -1)),
        stop=params.get("stop"),
        seed=params.get("seed"),
        prompt_logprobs=bool(document.get("prompt_logprobs")),
        prompt_logprobs_last_n=last_n,
    )


def _prompt_tokens(prompt: Any) -> list[int]:
    chunks = (prompt or {}).get("chunks") if isinstance(prompt, dict) else None
    if not isinstance(chunks, list):
        raise SamplingError(400, "prompt must be a ModelInput ({'chunks': [...]})")
    tokens: list[int] = []
    for chunk in chunks:
        if not isinstance(chunk, dict) or chunk.get("type", "encoded_text") != "encoded_text":
            raise SamplingError(400, "only encoded_text prompt chunks are served here")
        values = chunk.get("tokens")
        if not isinstance(values, list) or not all(isinstance(t, int) and t >= 0 for t in values):
            raise SamplingError(400, "an encoded_text chunk's tokens must be token ids (>= 0)")
        tokens.extend(values)
    if not tokens:
        raise SamplingError(400, "the prompt is empty")
    return tokens


def vllm_body(job: SampleJob, model: str) -> dict[str, Any]:
    """vLLM's completions request for a job: the prompt as token ids, nothing re-tokenised."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": job.tokens,
        "n": job.num_samples,
        "temperature": job.temperature,
        "top_p": job.top_p,
        "logprobs": 0,  # the sampled token's own log-prob
        "return_token_ids": True,
    }
    if job.max_tokens is not None:
        body["max_tokens"] = job.max_tokens
    if job.top_k > 0:
        body["top_k"] = job.top_k
    if job.seed is not None:
        body["seed"] = job.seed
    if job.prompt_logprobs:
        body["prompt_logprobs"] = 0
    stop = [job.stop] if isinstance(job.stop, str) else job.stop
    if stop == []:  # Tinker: no stop at all, EOS included
        body["ignore_eos"] = True
    elif stop and all(isinstance(s, int) for s in stop):
        body["stop_token_ids"] = list(stop)
    elif stop:
        body["stop"] = [str(s) for s in stop]
    return with_logprobs_as_ids(body)


def response_of(data: dict[str, Any], job: SampleJob) -> bytes:
    """vLLM's completions answer as the SDK's proto SampleResponse."""
    sequences = []
    choices = sorted(data["choices"], key=lambda c: c["index"])
    for choice in choices:
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs") or []
        stop_reason = "length" if choice.get("finish_reason") == "length" else "stop"
        sequences.append((list(choice.get("token_ids") or []), logprobs, stop_reason))
    prompt = None
    if job.prompt_logprobs:
        prompt = _prompt_logprobs(
            choices[0].get("prompt_logprobs") or data.get("prompt_logprobs"), job
        )
    return wire.sample_response(sequences, prompt)


def _prompt_logprobs(entries: list | None, job: SampleJob) -> np.ndarray:
    """Each prompt token's logprob (vLLM: one `{token: {"logprob": ...}}` per position, the
    prompt's own token among them), NaN where none is (the first token, before last_n)."""
    values = np.full(len(job.tokens), np.nan, dtype=np.float32)
    for position, entry in enumerate(entries or []):
        if position == 0 or not entry:
            continue
        token = job.tokens[position]
        found = entry.get(str(token)) or entry.get(f"token_id:{token}")
        if found is None:  # keyed by the decoded token: take the one ranked as the prompt's
            found = next(iter(entry.values()))
        values[position] = float(found["logprob"])
    if job.prompt_logprobs_last_n is not None:
        values[: len(job.tokens) - job.prompt_logprobs_last_n] = np.nan
    return values


class Samplers:
    """Every sampling session of the service, and the adapters it has loaded into vLLM."""

    def __init__(self, experiment: Path, base_model: str):
        self.experiment = experiment
        self.base_model = base_model
        self._lock = threading.Lock()
        self._samplers: dict[str, Sampler] = {}
        self._loaded: set[str] = set()
        self._running: Counter[str] = Counter()
        self._to_unload: set[str] = set()
        self._clients: dict[tuple[str, str], InferenceClient] = {}
        self._healthy_at: dict[tuple[str, str], float] = {}  # monotonic, per client
        self._loading: dict[str, threading.Lock] = {}  # per adapter being loaded
        self._pool = ThreadPoolExecutor(SAMPLE_THREADS, thread_name_prefix="tinker-sample")

    def add(self, sampler: Sampler) -> Sampler:
        with self._lock:
            return self._samplers.setdefault(sampler.sampler_id, sampler)

    def get(self, sampler_id: Any) -> Sampler:
        with self._lock:
            sampler = self._samplers.get(sampler_id) if isinstance(sampler_id, str) else None
        if sampler is None:
            raise SamplingError(404, f"unknown sampling session {sampler_id!r}")
        return sampler

    def submit(self, sampler: Sampler, job: SampleJob) -> Future:
        """Start a sample; its future gives the proto SampleResponse. A sampler whose
        checkpoint was deleted is refused now (410), never sent to vLLM."""
        if sampler.path is not None and ckpt.is_deleted(sampler.run, sampler.path):
            raise SamplingError(
                410, f"{sampler.path} was deleted: this sampling client can no longer sample"
            )
        if sampler.adapter_name is not None:
            with self._lock:
                self._running[sampler.adapter_name] += 1
        return self._pool.submit(self._sample, sampler, job)

    def checkpoint_deleted(self, run: Path, path: ckpt.TinkerPath) -> None:
        """Unload a deleted checkpoint's adapter from vLLM, once its running samples end."""
        name = Sampler("", "", run, path).adapter_name
        with self._lock:
            if name not in self._loaded:
                return
            if self._running[name]:
                self._to_unload.add(name)
                return
        self._unload(name)

    def _sample(self, sampler: Sampler, job: SampleJob) -> bytes:
        try:
            client = self._client()
            model = self._model_for(client, sampler)
            try:
                try:
                    data = client.post("/v1/completions", vllm_body(job, model))
                except httpx.TransportError:
                    # vLLM went away since it was last known healthy: wait for it, once.
                    self._distrust(client)
                    client = self._client()
                    data = client.post("/v1/completions", vllm_body(job, model))
            except InferenceError as err:
                if sampler.adapter_name is None or "does not exist" not in str(err):
                    raise
                # vLLM restarted and lost the adapter: load it again, once.
                with self._lock:
                    self._loaded.discard(sampler.adapter_name)
                data = client.post(
                    "/v1/completions", vllm_body(job, self._model_for(client, sampler))
                )
            return response_of(data, job)
        finally:
            self._finished(sampler)

    def _finished(self, sampler: Sampler) -> None:
        name = sampler.adapter_name
        if name is None:
            return
        with self._lock:
            self._running[name] -= 1
            unload = not self._running[name] and name in self._to_unload
            if unload:
                self._to_unload.discard(name)
        if unload:
            self._unload(name)

    def _model_for(self, client: InferenceClient, sampler: Sampler) -> str:
        """The vLLM model name to sample: the base, or the pinned adapter, loaded on first use
        (after the trainer has written it)."""
        name = sampler.adapter_name
        if name is None:
            return client.endpoint.model
        with self._lock:
            if name in self._loaded:
                return name
            loading = self._loading.setdefault(name, threading.Lock())
        # One load per adapter: a group's samples arrive together, and each of their threads
        # loaded the same adapter into vLLM at once.
        with loading:
            with self._lock:
                if name in self._loaded:
                    return name
            directory = self._wait_for_adapter(sampler)
            try:
                client.load_adapter(name, directory)
            except InferenceError as err:
                if "already" not in str(err):
                    raise
            with self._lock:
                self._loaded.add(name)
                self._loading.pop(name, None)
        log.info("loaded %s from %s into vLLM", name, directory)
        return name

    def _wait_for_adapter(self, sampler: Sampler) -> Path:
        deadline = time.monotonic() + WAIT_S
        while True:
            directory = ckpt.existing(sampler.run, sampler.path) if _saved(sampler) else None
            if directory is not None and (directory / ADAPTER_CONFIG).is_file():
                return directory
            if directory is not None:
                raise SamplingError(
                    400, f"{sampler.path} holds no sampler adapter ({ADAPTER_CONFIG})"
                )
            if time.monotonic() > deadline:
                raise SamplingError(404, f"{sampler.path} was not written in {WAIT_S:.0f} s")
            time.sleep(POLL_S)

    def _client(self) -> InferenceClient:
        """A client of vLLM as the experiment's endpoint file names it now; waits for vLLM
        to answer (it may be starting). Health is asked at most every `HEALTH_TRUST_S`: a
        check per sample, on a new connection each, was 45 % of the service's CPU with 8
        clients sampling (`workbench bench tinker`, py-spy)."""
        deadline = time.monotonic() + WAIT_S
        while True:
            endpoint = endpoint_file.read_endpoint(self.experiment)
            if endpoint is not None:
                key = (endpoint.base_url, endpoint.api_key)
                with self._lock:
                    client = self._clients.get(key) or self._clients.setdefault(
                        key, InferenceClient(endpoint)
                    )
                    trusted = time.monotonic() - self._healthy_at.get(key, -math.inf)
                if trusted < HEALTH_TRUST_S:
                    return client
                if client.healthy():
                    with self._lock:
                        self._healthy_at[key] = time.monotonic()
                    return client
            if time.monotonic() > deadline:
                raise SamplingError(503, f"vLLM did not answer in {WAIT_S:.0f} s")
            time.sleep(POLL_S)

    def _distrust(self, client: InferenceClient) -> None:
        with self._lock:
            self._healthy_at.pop((client.endpoint.base_url, client.endpoint.api_key), None)

    def _unload(self, name: str) -> None:
        with self._lock:
            self._loaded.discard(name)
        try:
            self._client().unload_adapter(name)
        except (InferenceError, SamplingError, httpx.HTTPError) as err:
            log.warning("could not unload %s from vLLM: %s", name, err)


def _saved(sampler: Sampler) -> bool:
    """Whether the pinned checkpoint exists; a deleted one raises (410)."""
    try:
        ckpt.existing(sampler.run, sampler.path)
    except ckpt.CheckpointError as err:
        if err.status == 410:
            raise
        return False
    return True
