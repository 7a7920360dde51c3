"""The routes the tinker SDK calls (`/api/v1/...`), over the sessions, models and futures.

Every route but `healthz` needs the API key (`X-API-Key`, as the SDK sends it); errors are
Tinker-style JSON (`{"error": ..., "category": "user"}`) with a 4xx status.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from workbench.files import run_control
from workbench.files import tinker_work as tw
from workbench.supervisor import paths
from workbench.system.procfs import process_is_alive
from workbench.tinker import checkpoints as ckpt
from workbench.tinker import wire
from workbench.tinker.futures import Answer, FutureStore, try_again
from workbench.tinker.http import (
    ServiceSettings,
    TinkerError,
    bearer,
    error_response,
    field,
    read_json,
)
from workbench.tinker.models import Models, TinkerModel, note
from workbench.tinker.routes import checkpoint_routes, sampling_routes
from workbench.tinker.sampling import Sampler, Samplers, SamplingError
from workbench.tinker.sessions import Sessions

log = logging.getLogger(__name__)
# How long retrieve_future holds a pending request before answering try-again.
LONG_POLL_S = 2.0
# How often the held retrieve_futures' answers are looked at: a client waits about half of it.
ANSWER_CHECK_S = 0.01
# How often a pending work item's run is looked at for an eviction.
EVICTION_CHECK_S = 0.25
_OPEN_ROUTES = ("/api/v1/healthz",)


def create_app(settings: ServiceSettings) -> FastAPI:
    app = FastAPI(title="workbench tinker service")
    app.state.settings = settings
    app.state.sessions = Sessions(settings.session_timeout_s)
    app.state.models = Models(settings.experiment)
    app.state.futures = FutureStore(ANSWER_CHECK_S)
    app.state.samplers = Samplers(settings.experiment, settings.base_model)

    # Plain ASGI and exception handlers rather than `@app.middleware("http")`, which runs
    # every request in a task of its own with a streamed body: in-process, a small route's
    # request took 1.57 ms of CPU with it and 0.76 ms without (client included).
    app.add_middleware(RequireKey, api_key=settings.api_key)
    for error in (TinkerError, wire.WireError, SamplingError, ckpt.CheckpointError):
        app.add_exception_handler(error, _error_as_response)

    _service_routes(app, settings)
    _model_routes(app, settings)
    _work_routes(app, settings)
    _future_routes(app)
    sampling_routes(app, settings)
    checkpoint_routes(app, settings)

    @app.on_event("startup")
    async def start_reaper() -> None:
        _end_restored_models(app)
        app.state.reaper = asyncio.create_task(_reap_sessions(app))

    @app.on_event("shutdown")
    async def save_on_stop() -> None:
        await _save_live_models(app)

    return app


class RequireKey:
    """Every route but the open ones answers 401 without the key `workbench serve` printed
    (`X-API-Key` or `Authorization: Bearer`)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.api_key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in _OPEN_ROUTES:
            request = Request(scope)
            given = request.headers.get("x-api-key") or bearer(request)
            if not given or not hmac.compare_digest(given.encode(), self.api_key):
                what = "a wrong" if given else "no"
                response = error_response(
                    401, f"{what} API key: give the one `workbench serve` printed (X-API-Key)"
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _error_as_response(_request: Request, err: Exception) -> Response:
    return error_response(err.status, err.message)  # type: ignore[attr-defined]


async def _reap_sessions(app: FastAPI) -> None:
    """End the sessions whose heartbeats stopped: each model's state saved, its slot given
    back once the trainer has saved it (the run is then finished)."""
    while True:
        await asyncio.sleep(min(5.0, app.state.sessions.timeout_s / 2))
        for session in app.state.sessions.expire():
            _end_session(app, session.session_id, "its heartbeats stopped")


def _end_session(app: FastAPI, session_id: str, why: str) -> None:
    """A session's models: each one's state saved as `tinker://<model id>/weights/session_end`
    and its slot given back once the trainer has saved it (the run is then finished)."""
    for model in app.state.models.of_session(session_id):
        if model.unloaded:
            continue
        note(model, f"session {session_id} ended ({why}); its state saved as session_end")
        seq = _save_state(app.state.models, model, "session_end")
        model.unloaded = True
        _release_slot(model)
        log.info(
            "%s: session %s ended (%s); state saved as work item %d",
            model.run.name,
            session_id,
            why,
            seq,
        )


def _end_restored_models(app: FastAPI) -> None:
    """The models of an earlier service whose runs are still open (it stopped without
    saving them, say it crashed): their sessions are gone, so each one's state is saved as
    `tinker://<model id>/weights/restart-<time>` and its slot given back, as a session that
    ended. Their checkpoints stay loadable either way."""
    name = "restart-" + time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    for model in app.state.models.restored:
        model.unloaded = True
        if run_control.run_condition(model.run).kind is not run_control.Condition.OPEN:
            continue
        note(model, f"its service stopped without saving it; its state saved as {name}")
        seq = _save_state(app.state.models, model, name)
        _release_slot(model)
        log.info("%s: of an earlier service; state saved as work item %d", model.run.name, seq)


def _save_state(models: Models, model: TinkerModel, name: str) -> int:
    """A save_state work item (the optimizer too) after the model's others, into
    `tinker://<model id>/weights/<name>`; its seq."""
    path = tw.tinker_dir(model.run) / "weights" / name
    request = lambda seq: tw.WorkRequest(  # noqa: E731
        seq=seq, op="save_state", path=str(path), with_optimizer=True
    )
    return models.append(model, lambda seq: (request(seq), {}))


# How long the service, stopping, waits for the trainer to save its live models: under the
# 20 s the supervisor gives it (`workbench.supervisor.tinker_service`), which stops it before
# the trainer so that the trainer is there to save them.
STOP_SAVE_WAIT_S = 15.0


async def _save_live_models(app: FastAPI) -> None:
    """`workbench down`: every model still in use gets a save_state work item (its optimizer
    too) under `tinker://<model id>/weights/stopped-<time>`, for `load_state` in a later
    session, and the service waits for the trainer to answer them while it runs."""
    models: Models = app.state.models
    name = "stopped-" + time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    saves = []
    for model in models.all():
        if model.unloaded or run_control.read_eviction(model.run) is not None:
            continue
        saves.append((model, _save_state(models, model, name)))
    deadline = time.monotonic() + STOP_SAVE_WAIT_S
    pending = saves
    while pending and time.monotonic() < deadline and _trainer_running(app.state.settings):
        pending = [(m, seq) for m, seq in pending if tw.read_result(m.run, seq) is None]
        await asyncio.sleep(0.1)
    unsaved = {model.model_id for model, _ in pending}
    for model, seq in saves:
        if model.model_id in unsaved:
            # Still open: the next service saves it again and gives its slot back.
            log.warning("%s: stopping before the trainer saved it (work item %d)", model.run, seq)
            continue
        # Saved: its session ends with this process; the next `up` gives it no slot.
        run_control.mark_finished(model.run, _optim_steps(model.run))


def _trainer_running(settings: ServiceSettings) -> bool:
    """Whether the experiment's trainer runs, by the supervisor's state.json (no trainer, as
    in a test of the service alone: nothing will answer a save)."""
    try:
        state = json.loads(paths.state_path(settings.experiment).read_text())
        pid = state["processes"]["trainer"]["pid"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return isinstance(pid, int) and process_is_alive(pid)


# How long a model's slot waits for its last work item before it is given back anyway.
RELEASE_WAIT_S = 600.0
_RELEASES: set[asyncio.Task] = set()


def _release_slot(model: TinkerModel) -> asyncio.Task:
    """Give the model's trainer slot back once its last work item (a session's final
    save_state) is answered: the run is marked finished, which the trainer reads as a run
    that leaves its slot (its checkpoint kept)."""

    async def release() -> None:
        items = tw.list_items(model.run)
        last = items[-1].seq if items else None
        deadline = asyncio.get_running_loop().time() + RELEASE_WAIT_S
        while last is not None and tw.read_result(model.run, last) is None:
            if asyncio.get_running_loop().time() > deadline:
                log.warning("%s: work item %d unanswered; its slot given back", model.run, last)
                break
            await asyncio.sleep(0.1)
        run_control.mark_finished(model.run, _optim_steps(model.run))
        note(model, "finished: its trainer slot given back")
        log.info("%s: unloaded; its trainer slot given back", model.run.name)

    task = asyncio.create_task(release())
    _RELEASES.add(task)  # the loop keeps only a weak reference to a task
    task.add_done_callback(_RELEASES.discard)
    return task


def _optim_steps(run: Path) -> int:
    """A Tinker run's steps: its optim_step work items."""
    return sum(1 for item in tw.list_items(run) if item.request.op == "optim_step")


def _service_routes(app: FastAPI, settings: ServiceSettings) -> None:
    sessions: Sessions = app.state.sessions

    @app.get("/api/v1/healthz")
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.post("/api/v1/client/config")
    async def client_config() -> dict:
        # zstd for forward_backward bodies: the path the hosted service takes too.
        return {"proto_compress_fwdbwd": True, "use_pyqwest_transport": False}

    @app.post("/api/v1/client/dynamic_config")
    async def dynamic_config() -> dict:
        return {"refresh_interval_sec": 300, "sample_cancel_enabled": False}

    @app.post("/api/v1/telemetry")
    async def telemetry() -> dict:
        return {"status": "accepted"}

    @app.get("/api/v1/get_server_capabilities")
    async def capabilities() -> dict:
        model = {"model_name": settings.base_model, "trainable": True, "sampleable": True}
        return {"supported_models": [model]}

    @app.post("/api/v1/create_session")
    async def create_session(request: Request) -> dict:
        await read_json(request)
        return {"type": "create_session", "session_id": sessions.create().session_id}

    @app.post("/api/v1/session_heartbeat")
    async def heartbeat(request: Request) -> Response:
        session_id = field(await read_json(request), "session_id")
        session = sessions.beat(session_id)
        if session is None:
            return error_response(404, f"unknown session {session_id!r}")
        if session.ended:
            return error_response(410, f"session {session_id} ended")
        return JSONResponse({"type": "session_heartbeat"})

    @app.post("/api/v1/sessions/{session_id}/finish")
    async def finish_session(session_id: str, request: Request) -> Response:
        # `ServiceClient.close(status)` and the end of a `with ServiceClient(...)` block.
        document = await read_json(request)
        if sessions.get(session_id) is None:
            return error_response(404, f"unknown session {session_id!r}")
        if sessions.finish(session_id) is not None:
            reason = document.get("reason")
            status = reason.get("type") if isinstance(reason, dict) else None
            _end_session(app, session_id, f"closed by its client: {status or 'finished'}")
        return JSONResponse({})


def _model(app: FastAPI, model_id: Any) -> TinkerModel:
    model = app.state.models.get(model_id) if isinstance(model_id, str) else None
    if model is None:
        raise TinkerError(
            404, f"unknown model id {model_id!r}: make one with create_lora_training_client"
        )
    if model.restored:
        raise TinkerError(
            410,
            f"model {model_id} belongs to a session of an earlier run of this service; its "
            "checkpoints load: make a new training client from one "
            "(create_training_client_from_state)",
        )
    if model.unloaded:
        raise TinkerError(410, f"model {model_id} was unloaded")
    if (evicted := _eviction(model)) is not None:
        raise TinkerError(410, evicted)
    return model


def _eviction(model: TinkerModel) -> str | None:
    """Why the model's run was evicted (`workbench evict`, the TUI, the trainer), as the
    client's error; None while it is not. An evicted run has left its trainer slot: its
    pending work items are never answered, so their futures answer this instead."""
    eviction = run_control.read_eviction(model.run)
    if eviction is None:
        return None
    return (
        f"model {model.model_id} (run {model.run.name}) was evicted by "
        f"{eviction.evicted_by or 'someone'}: {eviction.reason}; its trainer slot is free: "
        "make a new training client (create_training_client_from_state with a saved "
        "checkpoint to go on from one)"
    )


def _work_answer(model: TinkerModel, seq: int, answer_of) -> Any:
    """A resolver: None until the trainer answered work item `seq`, then `answer_of(result)`."""

    looked = [0.0]  # when the eviction was last looked for

    def resolve() -> Answer | None:
        result = tw.read_result(model.run, seq)
        if result is None:
            # Looked at each check of the poller (10 ms) this was a file read per pending
            # request; an eviction answered a quarter second late is as clear.
            now = time.monotonic()
            if now - looked[0] < EVICTION_CHECK_S:
                return None
            looked[0] = now
            evicted = _eviction(model)
            return None if evicted is None else Answer(error=evicted)
        if not result.ok:
            return Answer(error=result.error or "the trainer failed this request")
        return answer_of(result)

    return resolve


def _model_routes(app: FastAPI, settings: ServiceSettings) -> None:
    """Creating a model (a run of the trainer) and what a client asks about it."""
    futures: FutureStore = app.state.futures
    models: Models = app.state.models

    @app.post("/api/v1/create_model")
    async def create_model(request: Request) -> dict:
        document = await read_json(request)
        session_id = field(document, "session_id")
        if app.state.sessions.get(session_id) is None:
            raise TinkerError(404, f"unknown session {session_id!r}")
        if document.get("base_model") != settings.base_model:
            raise TinkerError(
                400,
                f"base_model {document.get('base_model')!r} is not served here; this service trains {settings.base_model!r}",
            )
        lora = document.get("lora_config") or {"rank": 32}
        rank = field(lora, "rank", int)
        if not 1 <= rank <= settings.trainer_rank:
            raise TinkerError(
                400,
                f"LoRA rank {rank}: the trainer's slots hold rank 1 to {settings.trainer_rank} ([trainer] lora.rank of the recipe)",
            )
        for part in ("train_mlp", "train_attn"):
            if lora.get(part, True) is False:
                raise TinkerError(
                    400,
                    f"{part}=False: the trainer adapts the attention and MLP layers of every slot alike; leave it True",
                )
        model = models.create(
            session_id, field(document, "model_seq_id", int), rank, lora.get("seed")
        )
        app.state.sessions.get(session_id).model_ids.append(model.model_id)
        log.info("%s: model %s (rank %d)", model.run.name, model.model_id, rank)
        request_id = futures.done(Answer(body={"model_id": model.model_id, "type": "create_model"}))
        return {"request_id": request_id}

    @app.post("/api/v1/get_info")
    async def get_info(request: Request) -> dict:
        model = _model(app, (await read_json(request)).get("model_id"))
        data = {"model_name": settings.base_model, "tokenizer_id": settings.tokenizer_dir}
        return {
            "type": "get_info",
            "model_id": model.model_id,
            "model_data": data,
            "is_lora": True,
            "lora_rank": model.rank,
        }


def _work_routes(app: FastAPI, settings: ServiceSettings) -> None:
    """The routes that become work items for the trainer, in each model's seq_id order."""
    models: Models = app.state.models

    @app.post("/api/v1/forward_backward")
    async def forward_backward(request: Request) -> dict:
        raw = wire.decompressed(await request.body(), request.headers.get("content-encoding"))
        body = wire.parse_forward_backward(raw, request.headers.get("content-type"))
        model = _model(app, body.model_id)
        if body.loss_fn not in tw.LOSS_FNS:
            raise TinkerError(
                400, f"loss_fn {body.loss_fn!r} is not one of {', '.join(tw.LOSS_FNS)}"
            )
        tensors = _datum_tensors(body)
        op = "forward" if body.forward_only else "forward_backward"
        work = tw.WorkRequest(
            seq=0,
            op=op,
            loss_fn=body.loss_fn,
            loss_fn_config=body.loss_fn_config,
            num_datums=len(body.datums),
        )
        return {"request_id": await _submit(app, model, body.seq_id, work, tensors, _fb_answer)}

    @app.post("/api/v1/optim_step")
    async def optim_step(request: Request) -> dict:
        document = await read_json(request)
        model = _model(app, document.get("model_id"))
        adam = adam_params(document.get("adam_params") or document.get("optim_params") or {})
        work = tw.WorkRequest(seq=0, op="optim_step", adam=adam)
        answer = lambda result: Answer(body={"type": "optim_step", "metrics": result.metrics})  # noqa: E731
        return {"request_id": await _submit(app, model, document.get("seq_id"), work, {}, answer)}

    @app.post("/api/v1/save_weights")
    async def save_weights(request: Request) -> dict:
        return await _save(app, request, "save_state", "weights")

    @app.post("/api/v1/save_weights_for_sampler")
    async def save_for_sampler(request: Request) -> dict:
        return await _save(app, request, "save_weights_for_sampler", "sampler_weights")

    @app.post("/api/v1/load_weights")
    async def load_weights(request: Request) -> dict:
        document = await read_json(request)
        directory = _checkpoint_from_path(models, field(document, "path"))
        with_optimizer = bool(document.get("optimizer"))
        if document.get("model_id") is None and document.get("session_id") is not None:
            return {"request_id": _model_from_state(app, settings, document, directory)}
        model = _model(app, document.get("model_id"))
        work = tw.WorkRequest(
            seq=0, op="load_state", path=str(directory), with_optimizer=with_optimizer
        )
        answer = lambda result: Answer(body={"type": "load_weights", "path": document["path"]})  # noqa: E731
        return {"request_id": await _submit(app, model, document.get("seq_id"), work, {}, answer)}


def _future_routes(app: FastAPI) -> None:
    """Unloading a model and the futures every request answers through."""
    futures: FutureStore = app.state.futures

    @app.post("/api/v1/unload_model")
    async def unload_model(request: Request) -> dict:
        model = _model(app, (await read_json(request)).get("model_id"))
        if not model.unloaded:
            model.unloaded = True
            _release_slot(model)
        return {
            "request_id": futures.done(
                Answer(body={"type": "unload_model", "model_id": model.model_id})
            )
        }

    @app.post("/api/v1/retrieve_future")
    async def retrieve_future(request: Request) -> Response:
        request_id = field(await read_json(request), "request_id")
        if not futures.known(request_id):
            return error_response(404, f"unknown request id {request_id!r}")
        answer = await futures.wait(request_id, LONG_POLL_S)
        if answer is not None:
            return _answer_response(answer)
        return JSONResponse(try_again(request_id))


def adam_params(params: dict[str, Any]) -> tw.AdamParams:
    """The SDK's AdamParams (`learning_rate`, ...) as the work item's (`lr`, ...)."""
    given = {("lr" if k == "learning_rate" else k): v for k, v in params.items()}
    fields = tw.AdamParams.__dataclass_fields__
    return tw.AdamParams(**{k: float(v) for k, v in given.items() if k in fields})


def _datum_tensors(body: wire.ForwardBackwardBody) -> dict[str, np.ndarray]:
    tensors: dict[str, np.ndarray] = {}
    for index, datum in enumerate(body.datums):
        for name, array in datum.items():
            if name not in tw.DATUM_DTYPES:
                raise TinkerError(
                    400,
                    f"datum {index}: loss input {name!r} is not one of {', '.join(tw.DATUM_DTYPES)}",
                )
            tensors[tw.datum_key(index, name)] = array.astype(tw.DATUM_DTYPES[name], copy=False)
    return tensors


def _fb_answer(result: tw.WorkResult) -> Answer:
    outputs = result.datums(result.data.get("num_datums", _num_datums(result)))
    return Answer(proto=wire.forward_backward_output(result.metrics, outputs))


def _num_datums(result: tw.WorkResult) -> int:
    indices = [int(key.split(".")[0][1:]) for key in result.tensors]
    return max(indices) + 1 if indices else 0


async def _submit(
    app: FastAPI, model: TinkerModel, seq_id: Any, work: tw.WorkRequest, tensors: dict, answer_of
) -> str:
    """The request id of the model's `seq_id`; its work item is written (fsynced, a few ms)
    in a worker thread, so that the other clients' requests and polls are served meanwhile."""
    if not isinstance(seq_id, int) or seq_id < 1:
        raise TinkerError(400, f"seq_id must be an integer >= 1 (got {seq_id!r})")

    def build(seq: int) -> tuple[tw.WorkRequest, dict]:
        return tw.WorkRequest(**{**work.__dict__, "seq": seq}), tensors

    futures: FutureStore = app.state.futures
    try:
        return await asyncio.to_thread(
            app.state.models.submit,
            model,
            seq_id,
            build,
            lambda seq: futures.pending(_work_answer(model, seq, answer_of)),
        )
    except (ValueError, tw.WorkItemError) as err:
        raise TinkerError(400, str(err)) from None


async def _save(app: FastAPI, request: Request, op: str, kind: str) -> dict:
    """save_weights / save_weights_for_sampler: a new tinker:// path of the model, written by
    the trainer. A sampler save without a name (`save_weights_and_get_sampling_client`)
    also makes a sampling session pinned to it, named in the answer."""
    document = await read_json(request)
    model = _model(app, document.get("model_id"))
    name = document.get("path") or f"seq{document.get('seq_id')}"
    if not ckpt.valid_name(name):
        raise TinkerError(400, f"checkpoint name {name!r}: a plain name, without '/'")
    path = ckpt.TinkerPath(model.model_id, kind, name)
    known = model.request_ids.get(document.get("seq_id"))  # a retry: answered as the first
    if known is None and (
        ckpt.directory(model.run, path).exists() or ckpt.is_deleted(model.run, path)
    ):
        raise TinkerError(
            # Not 409: the SDK retries a 409, and this one never resolves by waiting.
            400,
            f"{path} exists or existed; tinker:// paths never change: pick another name",
        )
    work = tw.WorkRequest(
        seq=0, op=op, path=str(ckpt.directory(model.run, path)), with_optimizer=op == "save_state"
    )
    body: dict[str, Any] = {
        "type": "save_weights" if op == "save_state" else "save_weights_for_sampler",
        "path": str(path),
    }
    session_seq = document.get("sampling_session_seq_id")
    if op == "save_weights_for_sampler" and isinstance(session_seq, int):
        sampler_id = f"{model.session_id}:sample:{session_seq}"
        app.state.samplers.add(Sampler(sampler_id, app.state.settings.base_model, model.run, path))
        body["sampling_session_id"] = sampler_id
    return {
        "request_id": await _submit(
            app, model, document.get("seq_id"), work, {}, lambda result: Answer(body=body)
        )
    }


def _model_from_state(
    app: FastAPI, settings: ServiceSettings, document: dict, directory: Path
) -> str:
    """create_training_client_from_state: a new model of the checkpoint's rank whose first
    work item (seq 0, before the client's first seq_id 1) loads it."""
    session_id = field(document, "session_id")
    if app.state.sessions.get(session_id) is None:
        raise TinkerError(404, f"unknown session {session_id!r}")
    source = app.state.models.get(ckpt.parse(document["path"]).model_id)
    model = app.state.models.create(
        session_id, field(document, "model_seq_id", int), source.rank, None
    )
    app.state.sessions.get(session_id).model_ids.append(model.model_id)
    futures: FutureStore = app.state.futures
    with app.state.models.lock:
        if 0 not in model.request_ids:
            work = tw.WorkRequest(
                seq=0,
                op="load_state",
                path=str(directory),
                with_optimizer=bool(document.get("optimizer")),
            )
            tw.write_request(model.run, work)
            answer = lambda result: Answer(  # noqa: E731
                body={"type": "load_weights", "path": document["path"], "model_id": model.model_id}
            )
            model.request_ids[0] = futures.pending(_work_answer(model, 0, answer))
    log.info("%s: model %s from %s", model.run.name, model.model_id, document["path"])
    return model.request_ids[0]


def _checkpoint_from_path(models: Models, path: str) -> Path:
    """`tinker://<model_id>/<kind>/<name>` -> its directory in the model's run."""
    parsed = ckpt.parse(path)
    model = models.get(parsed.model_id)
    if model is None:
        raise TinkerError(404, f"no checkpoint at {path}: no model {parsed.model_id} here")
    return ckpt.existing(model.run, parsed)


def _answer_response(answer: Answer) -> Response:
    if answer.error is not None:
        return JSONResponse({"error": answer.error, "category": answer.category})
    if answer.proto is not None:
        return Response(answer.proto, media_type=wire.PROTO_CONTENT_TYPE)
    return JSONResponse(answer.body)
