"""Tinker work items: the hand-off between the Tinker service and the shared trainer.

A Tinker training client is a run directory whose `control/orch.toml` says
`source = "tinker"`: the supervisor starts no orchestrator for it; the trainer admits it to
an adapter slot like any run and executes what the client asks, one work item at a time:

    run_<id>/tinker/work/00000007/
      request.json          {"seq": 7, "op": "forward_backward", "loss_fn": ..., ...}
      request.safetensors   the datums' tensors, keys `d<i>.<name>` (DATUM_DTYPES)
      result.json           {"ok": true, "metrics": {...}} or {"ok": false, "error": "..."}
      result.safetensors    per-datum outputs, keys `d<i>.<name>` (RESULT_DTYPES)
      DONE                  empty; written last: the result is complete

The service writes a request directory whole (staged under a temporary name, then renamed),
numbered in the order of the client's seq_id. The trainer takes a run's items strictly in
seq order, writes `result.*` atomically and then `DONE`. Positions: for a datum of length T,
`input_ids[t]` is the model's input at t and `target_tokens[t]` the token whose logprob
position t predicts (Tinker's convention: the client has already shifted them); outputs are
per position too. Losses are token sums, as Tinker documents them (docs/contracts.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file, save, save_file

from workbench.files import layout

SOURCE_TINKER = "tinker"
OPS = (
    "forward_backward",
    "forward",
    "optim_step",
    "save_state",
    "load_state",
    "save_weights_for_sampler",
)
DATUM_OPS = ("forward_backward", "forward")
PATH_OPS = ("save_state", "load_state", "save_weights_for_sampler")
LOSS_FNS = ("cross_entropy", "importance_sampling", "ppo", "cispo", "dro")
# The tensors a datum may carry, each of shape [T] (the datum's length).
DATUM_DTYPES: dict[str, np.dtype] = {
    "input_ids": np.dtype(np.int64),
    "target_tokens": np.dtype(np.int64),
    "weights": np.dtype(np.float32),
    "advantages": np.dtype(np.float32),
    "logprobs": np.dtype(np.float32),
    "clip_low_threshold": np.dtype(np.float32),
    "clip_high_threshold": np.dtype(np.float32),
}
# What the trainer answers per datum, each [T].
RESULT_DTYPES: dict[str, np.dtype] = {
    "logprobs": np.dtype(np.float32),
    "elementwise_loss": np.dtype(np.float32),
}
REQUEST_JSON = "request.json"
REQUEST_TENSORS = "request.safetensors"
RESULT_JSON = "result.json"
RESULT_TENSORS = "result.safetensors"
DONE = "DONE"
_ITEM_NAME = re.compile(r"^\d{8}$")
_KEY = re.compile(r"^d(\d+)\.([a-z_]+)$")


class WorkItemError(ValueError):
    """A request or result that breaks the contract; the message names the item and key."""


@dataclass(frozen=True)
class AdamParams:
    """Tinker's `AdamParams` (its defaults): decoupled weight decay; grad_clip_norm 0 is off."""

    lr: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0


@dataclass(frozen=True)
class WorkRequest:
    """request.json. `path` is a directory the service chose, for the save/load ops."""

    seq: int
    op: str
    loss_fn: str | None = None
    loss_fn_config: dict[str, float] | None = None
    num_datums: int = 0
    adam: AdamParams | None = None
    path: str | None = None
    with_optimizer: bool = False

    def __post_init__(self) -> None:
        problem = _request_problem(self)
        if problem:
            raise WorkItemError(f"work item {self.seq}: {problem}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> WorkRequest:
        data = json.loads(text)
        adam = data.pop("adam", None)
        return cls(**data, adam=None if adam is None else AdamParams(**adam))


def _request_problem(request: WorkRequest) -> str | None:
    if request.seq < 0:
        return "seq must be >= 0"
    if request.op not in OPS:
        return f"op {request.op!r} is not one of {', '.join(OPS)}"
    if request.op in DATUM_OPS:
        if request.loss_fn not in LOSS_FNS:
            return f"loss_fn {request.loss_fn!r} is not one of {', '.join(LOSS_FNS)}"
        if request.num_datums < 1:
            return f"{request.op} needs at least one datum"
    if request.op == "optim_step" and request.adam is None:
        return "optim_step needs adam parameters"
    if request.op in PATH_OPS and not request.path:
        return f"{request.op} needs a path"
    return None


@dataclass(frozen=True)
class WorkItem:
    """A request on disk: its directory and what request.json says."""

    path: Path
    request: WorkRequest

    @property
    def seq(self) -> int:
        return self.request.seq

    def tensors(self) -> dict[str, np.ndarray]:
        """request.safetensors as numpy arrays (`torch.from_numpy` shares their memory)."""
        file = self.path / REQUEST_TENSORS
        return load_file(file) if file.is_file() else {}

    def datums(self) -> list[dict[str, np.ndarray]]:
        """The datums' tensors, one dict per datum, by name (`input_ids`, `weights`, ...)."""
        return split_datums(self.tensors(), self.request.num_datums)


@dataclass(frozen=True)
class WorkResult:
    """result.json (its other keys in `data`) and result.safetensors."""

    ok: bool
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    tensors: dict[str, np.ndarray] = field(default_factory=dict)

    def datums(self, num_datums: int) -> list[dict[str, np.ndarray]]:
        return split_datums(self.tensors, num_datums)


# ---------------------------------------------------------------- paths


def tinker_dir(run: Path) -> Path:
    return run / "tinker"


def work_dir(run: Path) -> Path:
    return tinker_dir(run) / "work"


def item_dir(run: Path, seq: int) -> Path:
    return work_dir(run) / f"{seq:08d}"


def datum_key(index: int, name: str) -> str:
    return f"d{index}.{name}"


def split_datums(tensors: Mapping[str, np.ndarray], num_datums: int) -> list[dict[str, np.ndarray]]:
    """`{"d0.x": a, "d1.x": b}` -> `[{"x": a}, {"x": b}]`; a key of another form or an
    index >= num_datums is refused."""
    datums: list[dict[str, np.ndarray]] = [{} for _ in range(num_datums)]
    for key, value in tensors.items():
        match = _KEY.match(key)
        if not match or int(match.group(1)) >= num_datums:
            raise WorkItemError(f"tensor key {key!r} is not d<i>.<name> with i < {num_datums}")
        datums[int(match.group(1))][match.group(2)] = value
    return datums


def _checked_tensors(
    tensors: Mapping[str, Any], num_datums: int, dtypes: Mapping[str, np.dtype], what: str
) -> dict[str, np.ndarray]:
    """Contiguous numpy arrays of the contract's dtypes, one dimension, each datum's the
    same length; torch tensors are taken too (on the CPU)."""
    arrays = {key: np.ascontiguousarray(_as_numpy(value)) for key, value in tensors.items()}
    for index, datum in enumerate(split_datums(arrays, num_datums)):
        lengths = set()
        for name, array in datum.items():
            key = datum_key(index, name)
            if name not in dtypes:
                raise WorkItemError(f"{what}: {key}: unknown name (one of {', '.join(dtypes)})")
            if array.dtype != dtypes[name] or array.ndim != 1:
                raise WorkItemError(
                    f"{what}: {key} is {array.dtype}{list(array.shape)}, expected {dtypes[name]}[T]"
                )
            lengths.add(array.shape[0])
        if len(lengths) > 1:
            raise WorkItemError(f"{what}: datum {index} has tensors of lengths {sorted(lengths)}")
    return arrays


def _as_numpy(value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach"):  # a torch tensor, without importing torch here
        return value.detach().cpu().numpy()
    return np.asarray(value)


# ---------------------------------------------------------------- the service's side


def write_request(
    run: Path, request: WorkRequest, tensors: Mapping[str, Any] | None = None
) -> WorkItem:
    """Write work item `request.seq` of `run` whole: staged, then renamed into place.

    A datum op needs `input_ids` and `target_tokens` for every datum. An item that already
    exists is refused (FileExistsError): a seq is written once, a retry is answered from it.
    """
    arrays = _checked_tensors(
        tensors or {}, request.num_datums, DATUM_DTYPES, f"request {request.seq}"
    )
    if request.op in DATUM_OPS:
        for index, datum in enumerate(split_datums(arrays, request.num_datums)):
            missing = {"input_ids", "target_tokens"} - set(datum)
            if missing:
                raise WorkItemError(
                    f"request {request.seq}: datum {index} lacks {', '.join(sorted(missing))}"
                )
    final = item_dir(run, request.seq)
    if final.exists():
        raise FileExistsError(f"{final} exists: work item {request.seq} was written already")
    with layout.staged_directory(final) as staging:
        (staging / REQUEST_JSON).write_text(request.to_json())
        if arrays:
            save_file(arrays, str(staging / REQUEST_TENSORS))
    return WorkItem(final, request)


def read_result(run: Path, seq: int) -> WorkResult | None:
    """Work item `seq`'s result, or None until the trainer wrote DONE."""
    directory = item_dir(run, seq)
    if not (directory / DONE).is_file():
        return None
    data = json.loads((directory / RESULT_JSON).read_text())
    tensors_file = directory / RESULT_TENSORS
    tensors = load_file(tensors_file) if tensors_file.is_file() else {}
    return WorkResult(
        ok=bool(data.pop("ok")),
        metrics=data.pop("metrics", None) or {},
        error=data.pop("error", None),
        data=data,
        tensors=tensors,
    )


# ---------------------------------------------------------------- the trainer's side


def list_items(run: Path) -> list[WorkItem]:
    """Every work item of `run` in seq order (a staging directory is not one yet)."""
    root = work_dir(run)
    if not root.is_dir():
        return []
    items = []
    for entry in sorted(root.iterdir()):
        if entry.is_dir() and _ITEM_NAME.match(entry.name):
            request = WorkRequest.from_json((entry / REQUEST_JSON).read_text())
            items.append(WorkItem(entry, request))
    return items


def pending_requests(run: Path) -> list[WorkItem]:
    """The items the trainer has not answered (no DONE), in seq order: take them in this
    order, the first one first."""
    return [item for item in list_items(run) if not (item.path / DONE).is_file()]


def write_result(
    item: WorkItem,
    ok: bool,
    metrics: Mapping[str, float] | None = None,
    tensors: Mapping[str, Any] | None = None,
    error: str | None = None,
    **extra: Any,
) -> None:
    """Answer `item`: result.safetensors, result.json, then DONE, each atomically.
    `extra` goes into result.json beside ok/metrics/error (e.g. `"path"` of a save)."""
    if not ok and not error:
        raise WorkItemError(f"work item {item.seq}: a failed result needs an error message")
    arrays = _checked_tensors(
        tensors or {}, item.request.num_datums, RESULT_DTYPES, f"result {item.seq}"
    )
    if arrays:
        layout.atomic_write_bytes(item.path / RESULT_TENSORS, save(arrays))
    body = {"ok": ok, "metrics": dict(metrics or {}), **extra}
    if error is not None:
        body["error"] = error
    layout.atomic_write_text(item.path / RESULT_JSON, json.dumps(body, indent=1, sort_keys=True))
    layout.atomic_write_text(item.path / DONE, "")
