"""`tinker://<model id>/<kind>/<name>` paths: a model's saved states (`weights`) and sampler
adapters (`sampler_weights`), each a directory of its run that never changes content.

    run_tinker_<hex>/tinker/weights/<name>/          save_state (the trainer's format)
    run_tinker_<hex>/tinker/sampler_weights/<name>/  a peft adapter, as vLLM loads it
    run_tinker_<hex>/tinker/deleted/<kind>.<name>    a deleted path's tombstone

A deleted path stays taken (its tombstone): saving again under its name would give one
path two contents, and a sampler made from it answers that it was deleted.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from workbench.files import layout
from workbench.files import tinker_work as tw

PREFIX = "tinker://"
# The path segment of each kind, and the SDK's name for it (`Checkpoint.checkpoint_type`).
KINDS = {"weights": "training", "sampler_weights": "sampler"}


class CheckpointError(Exception):
    """A path the service cannot use: `status` (400, 404, 410) and a message for the client."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(frozen=True)
class TinkerPath:
    model_id: str
    kind: str  # weights | sampler_weights
    name: str

    def __str__(self) -> str:
        return f"{PREFIX}{self.model_id}/{self.kind}/{self.name}"

    @property
    def checkpoint_id(self) -> str:
        """What the SDK's REST calls name it by: `<kind>/<name>`."""
        return f"{self.kind}/{self.name}"


def parse(path: object) -> TinkerPath:
    """`tinker://<model id>/<kind>/<name>`, or a 400 naming what a path looks like."""
    parts = (
        path[len(PREFIX) :].split("/") if isinstance(path, str) and path.startswith(PREFIX) else []
    )
    if len(parts) != 3 or parts[1] not in KINDS or not valid_name(parts[2]) or not parts[0]:
        raise CheckpointError(
            400,
            f"{path!r} is not a tinker://<model id>/weights/<name> or "
            "tinker://<model id>/sampler_weights/<name> path",
        )
    return TinkerPath(parts[0], parts[1], parts[2])


def valid_name(name: object) -> bool:
    return isinstance(name, str) and bool(name) and "/" not in name and not name.startswith(".")


def directory(run: Path, path: TinkerPath) -> Path:
    return tw.tinker_dir(run) / path.kind / path.name


def tombstone(run: Path, path: TinkerPath) -> Path:
    return tw.tinker_dir(run) / "deleted" / f"{path.kind}.{path.name}"


def is_deleted(run: Path, path: TinkerPath) -> bool:
    return tombstone(run, path).exists()


def existing(run: Path, path: TinkerPath) -> Path:
    """The path's directory; 410 when it was deleted, 404 when it was never saved."""
    if is_deleted(run, path):
        raise CheckpointError(410, f"{path} was deleted")
    found = directory(run, path)
    if not found.is_dir():
        raise CheckpointError(404, f"no checkpoint at {path}")
    return found


def delete(run: Path, path: TinkerPath) -> None:
    """Remove the path's directory, its tombstone first: a reader never finds it half gone
    and taken for present."""
    existing(run, path)
    layout.atomic_write_text(tombstone(run, path), datetime.now(UTC).isoformat() + "\n")
    shutil.rmtree(directory(run, path), ignore_errors=True)


def listing(run: Path, model_id: str) -> list[dict]:
    """The SDK's `Checkpoint` of every saved (not deleted) path of a model, oldest first."""
    found = []
    for kind, checkpoint_type in KINDS.items():
        parent = tw.tinker_dir(run) / kind
        for entry in sorted(parent.iterdir()) if parent.is_dir() else []:
            path = TinkerPath(model_id, kind, entry.name)
            if not entry.is_dir() or not valid_name(entry.name) or is_deleted(run, path):
                continue
            stat = entry.stat()
            found.append(
                {
                    "checkpoint_id": path.checkpoint_id,
                    "checkpoint_type": checkpoint_type,
                    "time": datetime.fromtimestamp(stat.st_mtime, UTC).isoformat(),
                    "tinker_path": str(path),
                    "size_bytes": sum(f.stat().st_size for f in entry.rglob("*") if f.is_file()),
                }
            )
    return sorted(found, key=lambda c: c["time"])
