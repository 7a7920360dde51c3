"""Reading back what trackio and wandb stored, through each library's own local storage.

trackio: its SQLite storage API (`SQLiteStorage`), in the session's $TRACKIO_DIR.
wandb: the transaction log of each offline run (`offline-run-*/run-<id>.wandb`), the file
`wandb sync` uploads. wandb parses it only in its Go service, so the log's framing (LevelDB
log records in 32 KiB blocks after a 7-byte `:W&B` header) is read here, and each record
with wandb's own protobuf type.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.helpers import wait_for

WANDB_BLOCK = 32 * 1024
WANDB_HEADER = 7  # ":W&B", a 2-byte magic number, a version byte
CHUNK_HEADER = 7  # crc32 (4), length (2), type (1)
FULL, LAST = 1, 4


def trackio_runs(project: str) -> list[str]:
    from trackio.sqlite_storage import SQLiteStorage

    return SQLiteStorage.get_runs(project)


def trackio_logs(project: str, run: str) -> list[dict[str, Any]]:
    """Every row logged to `run`: its metrics and "step" (trackio adds a "timestamp")."""
    from trackio.sqlite_storage import SQLiteStorage

    return SQLiteStorage.get_logs(project, run)


def trackio_config(project: str, run: str) -> dict[str, Any]:
    from trackio.sqlite_storage import SQLiteStorage

    return SQLiteStorage.get_run_config(project, run) or {}


@dataclass
class WandbRun:
    id: str
    name: str
    group: str
    project: str
    config: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)  # every row, in order
    sessions: int = 0  # offline-run folders (one per supervisor that logged to it)
    finished: bool = False  # the last session ended with an exit record


def wandb_runs(directory: Path, run_id: str = "*") -> dict[str, WandbRun]:
    """Every wandb run under `directory` (a `dir` given to wandb.init), or the one whose id
    is `run_id`, by display name; the sessions of a resumed run are joined in the order
    they started. A session whose log holds no run record yet is left out: wandb writes
    the log from its own service process, which may not have flushed it yet."""
    runs: dict[str, WandbRun] = {}
    for log in sorted((directory / "wandb").glob(f"offline-run-*/run-{run_id}.wandb")):
        session_finished = False
        run: WandbRun | None = None
        for record in wandb_records(log):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                config = {
                    item.key: json.loads(item.value_json)
                    for item in record.run.config.update
                    if item.key != "_wandb"
                }
                run = runs.setdefault(
                    record.run.display_name,
                    WandbRun(
                        id=record.run.run_id,
                        name=record.run.display_name,
                        group=record.run.run_group,
                        project=record.run.project,
                        config=config,
                    ),
                )
                assert run.id == record.run.run_id, "two wandb runs share a name"
                run.sessions += 1
            elif kind == "history" and run is not None:
                row = {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
                run.history.append(row)
            elif kind == "exit":
                session_finished = True
        if run is not None:
            run.finished = session_finished
    return runs


def wait_for_finished_wandb_run(
    directory: Path, run_id: str, name: str, timeout_s: float = 60.0
) -> WandbRun:
    """The wandb run `name` (id `run_id`) once its last session's log ends with an exit
    record. `finish()` returns before wandb's service has flushed and closed the log
    (`inform_finish` is a message the service acts on later), so the log is read until it
    does or `timeout_s` passes."""

    def finished_run() -> WandbRun | None:
        run = wandb_runs(directory, run_id).get(name)
        return run if run is not None and run.finished else None

    return wait_for(finished_run, timeout_s, f"wandb run {name} ({run_id}) to finish", every_s=0.1)


def wandb_records(path: Path) -> Iterator[Any]:
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    if len(data) < WANDB_HEADER:
        return  # wandb's service has not flushed the header yet
    assert data[:4] == b":W&B", f"{path} is not a wandb transaction log"
    position, pending = WANDB_HEADER, b""
    while position + CHUNK_HEADER <= len(data):
        left_in_block = WANDB_BLOCK - position % WANDB_BLOCK
        if left_in_block < CHUNK_HEADER:  # a block's tail too short for a header is padding
            position += left_in_block
            continue
        length, kind = struct.unpack_from("<HB", data, position + 4)
        start = position + CHUNK_HEADER
        if start + length > len(data):
            return  # a chunk the service is still writing
        pending += data[start : start + length]
        position = start + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record
