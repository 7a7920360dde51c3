"""The sampling and checkpoint routes: sampling sessions, `asample` (which `sample` and
`compute_logprobs` send), `weights_info`, and a model's `tinker://` checkpoints listed and
deleted."""

from __future__ import annotations

import asyncio
import functools
import json
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from workbench.inference.client import InferenceError
from workbench.tinker import checkpoints as ckpt
from workbench.tinker.futures import Answer, FutureStore
from workbench.tinker.http import ServiceSettings, TinkerError, field, read_json
from workbench.tinker.sampling import Sampler, Samplers, SamplingError, parse_job


def sampling_routes(app: FastAPI, settings: ServiceSettings) -> None:
    samplers: Samplers = app.state.samplers
    futures: FutureStore = app.state.futures
    # (sampler id, seq_id) -> the asample answer: a retried request is not sampled twice.
    submitted: dict[tuple[str, Any], dict] = {}

    @app.post("/api/v1/create_sampling_session")
    async def create_sampling_session(request: Request) -> dict:
        document = await read_json(request)
        session_id = field(document, "session_id")
        if app.state.sessions.get(session_id) is None:
            raise TinkerError(404, f"unknown session {session_id!r}")
        sampler_id = f"{session_id}:sample:{field(document, 'sampling_session_seq_id', int)}"
        samplers.add(_pinned(app, settings, sampler_id, document))
        return {"type": "create_sampling_session", "sampling_session_id": sampler_id}

    @app.get("/api/v1/samplers/{sampler_id}")
    async def get_sampler(sampler_id: str) -> dict:
        sampler = samplers.get(sampler_id)
        return {
            "sampler_id": sampler.sampler_id,
            "base_model": sampler.base_model,
            "model_path": sampler.model_path,
        }

    @app.post("/api/v1/asample")
    async def asample(request: Request) -> dict:
        document = await read_json(request)
        if document.get("sampling_session_id") is not None:
            sampler = samplers.get(document["sampling_session_id"])
        else:  # a one-off sample of a path or of the base model
            sampler = _pinned(app, settings, f"oneoff-{secrets.token_hex(6)}", document)
        key = (sampler.sampler_id, document.get("seq_id"))
        if key[1] is not None and key in submitted:
            return submitted[key]
        job = parse_job(document)
        vocab = vocab_size(settings.tokenizer_dir)
        if vocab is not None and max(job.tokens) >= vocab:
            raise TinkerError(
                400, f"prompt token {max(job.tokens)} is outside the vocabulary (0..{vocab - 1})"
            )
        future = samplers.submit(sampler, job)
        request_id = futures.pending(lambda: _sample_answer(future))
        ids = [f"{sampler.sampler_id}:{key[1]}:{i}" for i in range(job.num_samples)]
        answer = {"request_id": request_id, "sample_sequence_ids": ids}
        if key[1] is not None:
            submitted[key] = answer
        return answer


def _pinned(app: FastAPI, settings: ServiceSettings, sampler_id: str, document: dict) -> Sampler:
    """A sampler of `model_path` (a sampler_weights checkpoint, as it is now and ever will
    be) or, without one, of the served base model."""
    model_path = document.get("model_path")
    if model_path is None:
        base = document.get("base_model")
        if base not in (None, settings.base_model):
            raise TinkerError(
                400,
                f"base_model {base!r} is not served here; this service samples {settings.base_model!r}",
            )
        return Sampler(sampler_id, settings.base_model)
    path = ckpt.parse(model_path)
    if path.kind != "sampler_weights":
        raise TinkerError(
            400,
            f"{path} is a training state: sample a tinker://.../sampler_weights/... path "
            "(save_weights_for_sampler)",
        )
    model = app.state.models.get(path.model_id)
    if model is None:
        raise TinkerError(404, f"no checkpoint at {path}: no model {path.model_id} here")
    ckpt.existing(model.run, path)
    return Sampler(sampler_id, settings.base_model, model.run, path)


@functools.cache
def vocab_size(model_dir: str) -> int | None:
    """The served model's vocabulary size (its config.json), None where it cannot be read."""
    try:
        return int(json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _sample_answer(future) -> Answer | None:
    if not future.done():
        return None
    error = future.exception()
    if error is None:
        return Answer(proto=future.result())
    if isinstance(error, SamplingError | ckpt.CheckpointError):
        return Answer(error=error.message)
    if isinstance(error, InferenceError):  # vLLM refused what the client asked
        return Answer(error=f"vLLM refused the sample: {error}")
    return Answer(error=f"sampling failed: {error}", category="server")


def checkpoint_routes(app: FastAPI, settings: ServiceSettings) -> None:
    samplers: Samplers = app.state.samplers

    @app.post("/api/v1/weights_info")
    async def weights_info(request: Request) -> dict:
        path = ckpt.parse(field(await read_json(request), "tinker_path"))
        model = _known_model(app, path.model_id)
        ckpt.existing(model.run, path)
        return {
            "base_model": settings.base_model,
            "is_lora": True,
            "lora_rank": model.rank,
            "train_unembed": False,
            "train_mlp": True,
            "train_attn": True,
        }

    @app.get("/api/v1/training_runs/{model_id}")
    async def training_run(model_id: str) -> dict:
        model = _known_model(app, model_id)
        saved = ckpt.listing(model.run, model_id)
        last = {c["checkpoint_type"]: c for c in saved}
        return {
            "training_run_id": model_id,
            "base_model": settings.base_model,
            "model_owner": "workbench",
            "is_lora": True,
            "lora_rank": model.rank,
            "last_request_time": datetime.now(UTC).isoformat(),
            "last_checkpoint": last.get("training"),
            "last_sampler_checkpoint": last.get("sampler"),
        }

    @app.get("/api/v1/training_runs/{model_id}/checkpoints")
    async def list_checkpoints(model_id: str) -> dict:
        model = _known_model(app, model_id)
        return {"checkpoints": ckpt.listing(model.run, model_id)}

    @app.delete("/api/v1/training_runs/{model_id}/checkpoints/{checkpoint_id:path}")
    async def delete_checkpoint(model_id: str, checkpoint_id: str) -> Response:
        path = ckpt.parse(f"{ckpt.PREFIX}{model_id}/{checkpoint_id}")
        model = _known_model(app, model_id)
        ckpt.delete(model.run, path)
        # Its samplers answer 410 from now on; vLLM lets its adapter go once they are idle.
        await asyncio.to_thread(samplers.checkpoint_deleted, model.run, path)
        return Response(status_code=204)


def _known_model(app: FastAPI, model_id: str):
    """The model of a path or REST call; unloaded ones too (their checkpoints stay)."""
    model = app.state.models.get(model_id)
    if model is None:
        raise TinkerError(404, f"unknown training run {model_id!r}")
    return model
