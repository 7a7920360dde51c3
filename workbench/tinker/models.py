"""Tinker models: a model id is a run of the experiment (`run_tinker_<hex>`, `source =
"tinker"`), and its commands become work items in the client's seq_id order. A retried
request (same seq_id) gets the same request id back and is never written twice; a request
that arrives before a lower seq_id waits until the gap fills.

Each run keeps its model's id in `tinker/model.json`, so that a service started again on
the experiment (`workbench down` then `up`, or the supervisor restarting it) knows its
models' `tinker://` paths: their checkpoints load, sample and list as before. Their
sessions are gone with the process that held them: a model found this way takes no more
training requests (`restored`); its client makes a new one from its state.

A Tinker run's log is where a native run's orchestrator logs (`run_<id>/logs/
orchestrator.log`, read by `workbench logs RUN` and the TUI): the service writes a line there
for the model's creation, each work item it hands the trainer, and the end of its session."""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.files import layout
from workbench.files import tinker_work as tw

# What a request becomes once its turn comes: its WorkRequest (seq filled in) and tensors.
WorkBuilder = Callable[[int], tuple[tw.WorkRequest, dict[str, Any]]]


@dataclass
class TinkerModel:
    model_id: str
    session_id: str
    run: Path
    rank: int
    next_seq_id: int = 1  # the SDK numbers a training client's requests from 1
    request_ids: dict[int, str] = field(default_factory=dict)
    waiting: dict[int, WorkBuilder] = field(default_factory=dict)
    unloaded: bool = False
    # Found on disk by a service started again: its session and pending requests are gone.
    restored: bool = False


def orch_toml(rank: int, seed: int | None) -> str:
    """A Tinker run's control/orch.toml: no orchestrator; the trainer reads rank and seed."""
    lines = ['source = "tinker"', f"seed = {int(seed or 0)}", "", "[lora]", f"rank = {rank}", ""]
    return "\n".join(lines)


MODEL_FILE = "model.json"


def model_file(run: Path) -> Path:
    return tw.tinker_dir(run) / MODEL_FILE


class Models:
    def __init__(self, experiment: Path):
        self.experiment = experiment
        self._lock = threading.RLock()
        self._models: dict[str, TinkerModel] = {}
        for model in _saved_models(experiment):
            self._models[model.model_id] = model

    @property
    def restored(self) -> list[TinkerModel]:
        """The models an earlier service made, found in the experiment at start."""
        with self._lock:
            return [model for model in self._models.values() if model.restored]

    def create(
        self, session_id: str, model_seq_id: int, rank: int, seed: int | None
    ) -> TinkerModel:
        # The SDK derives the same id from (session_id, model_seq_id).
        model_id = f"{session_id}:train:{model_seq_id}"
        with self._lock:
            existing = self._models.get(model_id)
            if existing is not None:
                return existing
            run = layout.run_dir(self.experiment, f"run_tinker_{secrets.token_hex(4)}")
            identity = {"model_id": model_id, "session_id": session_id, "rank": rank}
            # Before the orch.toml that makes it a run: a run found has its model's id.
            layout.atomic_write_text(model_file(run), json.dumps(identity) + "\n")
            layout.atomic_write_text(layout.orch_config_path(run), orch_toml(rank, seed))
            model = TinkerModel(model_id, session_id, run, rank)
            self._models[model_id] = model
            note(model, f"model {model_id} (LoRA rank {rank}) of session {session_id}")
            return model

    @property
    def lock(self) -> threading.RLock:
        """Held while a model's request ids and work items change."""
        return self._lock

    def get(self, model_id: str) -> TinkerModel | None:
        with self._lock:
            return self._models.get(model_id)

    def all(self) -> list[TinkerModel]:
        with self._lock:
            return list(self._models.values())

    def of_session(self, session_id: str) -> list[TinkerModel]:
        with self._lock:
            return [m for m in self._models.values() if m.session_id == session_id]

    def submit(
        self,
        model: TinkerModel,
        seq_id: int,
        build: WorkBuilder,
        new_request_id: Callable[[int], str],
    ) -> str:
        """The request id of `seq_id`: the one it already has (a retry), or a new one; its
        work item is written now if its turn has come, else once the lower ones arrive."""
        with self._lock:
            if seq_id in model.request_ids:
                return model.request_ids[seq_id]
            if seq_id < model.next_seq_id:
                raise ValueError(
                    f"seq_id {seq_id} of {model.model_id} is below the next expected "
                    f"({model.next_seq_id}) and was never seen"
                )
            model.request_ids[seq_id] = new_request_id(seq_id)
            model.waiting[seq_id] = build
            while model.next_seq_id in model.waiting:
                request, tensors = model.waiting.pop(model.next_seq_id)(model.next_seq_id)
                tw.write_request(model.run, request, tensors)
                note(model, describe(request))
                model.next_seq_id += 1
            return model.request_ids[seq_id]

    def append(self, model: TinkerModel, build: WorkBuilder) -> int:
        """Work the service itself adds (a session's end): after what was written; its seq."""
        with self._lock:
            seq = model.next_seq_id
            request, tensors = build(seq)
            tw.write_request(model.run, request, tensors)
            note(model, describe(request))
            model.next_seq_id += 1
            return seq


def _saved_models(experiment: Path) -> list[TinkerModel]:
    """Every model whose run is in `experiment`, as `restored`: its next seq after the
    work items its run holds (the service's own saves go after them)."""
    models = []
    for run in layout.list_run_dirs(experiment):
        try:
            identity = json.loads(model_file(run).read_text())
            model_id, session_id, rank = (
                str(identity["model_id"]), str(identity["session_id"]), int(identity["rank"])
            )  # fmt: skip
            items = tw.list_items(run)
        except (OSError, ValueError, KeyError, TypeError):
            # Not a Tinker run, one made before model.json, or one whose files do not
            # read: its paths are not found, the service starts all the same.
            continue
        next_seq = max((item.request.seq for item in items), default=0) + 1
        models.append(
            TinkerModel(model_id, session_id, run, rank, next_seq_id=next_seq, restored=True)
        )
    return models


def note(model: TinkerModel, text: str) -> None:
    """A line of the model's run log (best effort: a full disk must not fail a request)."""
    path = layout.orchestrator_log_path(model.run)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as log:
            log.write(f"{stamp} INFO workbench.tinker: {model.run.name} {text}\n")
    except OSError:
        pass


def describe(request: tw.WorkRequest) -> str:
    """One work item as its log line says it: `work item 7: forward_backward of 4 datums
    (importance_sampling)`, `work item 8: optim_step (lr 0.0001)`, `work item 9: save_state
    weights/s1`."""
    line = f"work item {request.seq}: {request.op}"
    if request.op in tw.DATUM_OPS:
        return f"{line} of {request.num_datums} datums ({request.loss_fn})"
    if request.op == "optim_step" and request.adam is not None:
        return f"{line} (lr {request.adam.lr:g})"
    if request.path:
        return f"{line} {Path(request.path).parent.name}/{Path(request.path).name}"
    return line
