"""The trainer's nodes as `status` and the TUI show them: `nodes/node<K>.json`, one file per
joined node (docs/contracts.md).

`workbench join` on node K (1 and up) writes its file when it starts, on every change of its
torchrun agent, and at least every `NODE_HEARTBEAT_S` while it runs:

    {"node_rank": 1, "nnodes": 2, "host": "gpu-017", "pid": 4242, "state": "running",
     "restarts": 0, "reason": null, "updated_at": "2026-11-27T08:00:00.000+00:00"}

state: `waiting` (for node 0's supervisor), `running` (its agent runs), `restarting` (its
agent exited; it meets node 0's restarted trainer next), `left` (the experiment stopped),
`failed` (it gave up: the message in `reason`). Node 0 has no file: it is the supervisor's
trainer process (state.json), on the host `supervisor/rendezvous.json` names.

A file left `waiting`, `running` or `restarting` that has not changed for `NODE_SILENT_S`
(by the reader's clock against the file's modification time) is shown `silent`: its
`join` was killed outright or its node was lost.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from workbench.files import layout
from workbench.system.clock import now_iso

NODE_HEARTBEAT_S = 10.0
NODE_SILENT_S = 6 * NODE_HEARTBEAT_S
# The states of a join that is still meant to be there.
PRESENT_STATES = ("waiting", "running", "restarting")


@dataclass(frozen=True)
class NodeStatus:
    """One row of the nodes table: a node's rank, host, state, restarts and a note."""

    node_rank: int
    host: str | None
    state: str
    restarts: int
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def write_node_status(
    experiment: Path,
    node_rank: int,
    nnodes: int,
    host: str,
    pid: int,
    state: str,
    restarts: int,
    reason: str | None = None,
) -> None:
    """Node `node_rank`'s file, as `workbench join` keeps it (the module docstring)."""
    payload = {
        "node_rank": node_rank,
        "nnodes": nnodes,
        "host": host,
        "pid": pid,
        "state": state,
        "restarts": restarts,
        "reason": reason,
        "updated_at": now_iso(),
    }
    path = layout.node_status_path(experiment, node_rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    layout.atomic_write_text(path, json.dumps(payload) + "\n")


def read_node_file(experiment: Path, node_rank: int) -> tuple[dict[str, Any], float] | None:
    """Node `node_rank`'s file and its modification time, or None without a readable one."""
    path = layout.node_status_path(experiment, node_rank)
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
        modified = path.stat().st_mtime
    except (OSError, ValueError):
        return None
    return (payload, modified) if isinstance(payload, dict) else None


def joined_node_status(
    node_rank: int, record: tuple[dict[str, Any], float] | None, now: float
) -> NodeStatus:
    """How node `node_rank` (1 and up) fares, from its file and its modification time."""
    if record is None:
        return NodeStatus(
            node_rank,
            None,
            "not joined",
            0,
            f"no `workbench join --node-rank {node_rank}` has reported yet",
        )
    payload, modified = record
    host = payload.get("host")
    state = str(payload.get("state") or "unknown")
    restarts = int(payload.get("restarts") or 0)
    reason = payload.get("reason")
    quiet_s = now - modified
    if state in PRESENT_STATES and quiet_s >= NODE_SILENT_S:
        return NodeStatus(
            node_rank,
            host,
            "silent",
            restarts,
            f"node {node_rank} ({host}) has not reported for {quiet_s:.0f} s: its join was "
            "killed or the node is lost; node 0's trainer restarts from its checkpoints and "
            "waits (up to 10 minutes) for it to join again",
        )
    return NodeStatus(node_rank, host, state, restarts, reason)


def node_statuses(
    experiment: Path,
    nnodes: int,
    node0_host: str | None,
    trainer: dict[str, Any] | None,
    now: float | None = None,
) -> list[NodeStatus]:
    """Every node of a trainer on `nnodes` nodes: node 0 from the supervisor's trainer
    record (state.json), the others from their files; [] for a trainer on one node."""
    if nnodes <= 1:
        return []
    now = time.time() if now is None else now
    trainer = trainer or {}
    node0 = NodeStatus(
        0,
        node0_host,
        str(trainer.get("state") or "not started"),
        int(trainer.get("restarts") or 0),
        trainer.get("reason"),
    )
    joined = [
        joined_node_status(rank, read_node_file(experiment, rank), now) for rank in range(1, nnodes)
    ]
    return [node0, *joined]


def lost_nodes(nodes: list[NodeStatus]) -> list[NodeStatus]:
    """The joined nodes that are not there while they should be: silent or failed."""
    return [node for node in nodes if node.node_rank > 0 and node.state in ("silent", "failed")]
