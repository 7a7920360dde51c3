"""The trainer's nodes as `status` and the TUI show them: node 0 from the supervisor's
state.json, every joined node from its `nodes/node<K>.json`, a silent one named."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from workbench.commands.status import read_status
from workbench.files import layout
from workbench.files.nodes import NODE_SILENT_S, node_statuses, write_node_status
from workbench.status import node_warnings
from workbench.supervisor import paths
from workbench.tui.data import ExperimentReader


def node_0_running(experiment: Path, nnodes: int = 3) -> None:
    """What node 0's supervisor leaves: where its store listens, and its trainer's record."""
    paths.rendezvous_path(experiment).parent.mkdir(parents=True, exist_ok=True)
    paths.rendezvous_path(experiment).write_text(
        json.dumps({"host": "10.0.0.1", "port": 29400, "nnodes": nnodes, "node0_host": "gpu-1"})
    )
    state = {
        "status": "running",
        "processes": {"trainer": {"state": "running", "restarts": 1, "pid": 10}},
    }
    paths.state_path(experiment).write_text(json.dumps(state))


def gone_quiet(experiment: Path, node_rank: int, seconds: float) -> None:
    path = layout.node_status_path(experiment, node_rank)
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_every_node_shows_its_rank_host_state_and_restarts(experiment: Path):
    node_0_running(experiment)
    write_node_status(experiment, 1, 3, "gpu-2", 42, "running", restarts=2)
    nodes = node_statuses(experiment, 3, "gpu-1", {"state": "running", "restarts": 1})
    assert [(n.node_rank, n.host, n.state, n.restarts) for n in nodes] == [
        (0, "gpu-1", "running", 1),
        (1, "gpu-2", "running", 2),
        (2, None, "not joined", 0),
    ]
    assert "--node-rank 2" in (nodes[2].note or "")
    assert node_statuses(experiment, 1, "gpu-1", None) == [], "one node: no nodes table"


def test_a_node_that_stopped_reporting_is_named_silent(experiment: Path):
    node_0_running(experiment, nnodes=2)
    write_node_status(experiment, 1, 2, "gpu-2", 42, "running", restarts=0)
    gone_quiet(experiment, 1, NODE_SILENT_S + 5)

    report = read_status(experiment)
    node = report.to_json()["nodes"][1]
    assert node["state"] == "silent" and node["host"] == "gpu-2"
    assert "has not reported for" in node["note"]
    # A warning while the experiment runs; none once it stopped, nodes and all.
    (warning,) = node_warnings(report.nodes, supervisor_running=True)
    assert warning.startswith("node 1 (gpu-2) is silent: node 1 (gpu-2) has not reported")
    assert "restarts from its checkpoints" in warning
    assert node_warnings(report.nodes, supervisor_running=False) == []


def test_a_node_that_left_with_the_experiment_is_not_a_warning(experiment: Path):
    node_0_running(experiment, nnodes=2)
    write_node_status(experiment, 1, 2, "gpu-2", 42, "left", 0, "its supervisor is stopping")
    gone_quiet(experiment, 1, NODE_SILENT_S + 5)
    report = read_status(experiment)
    assert report.to_json()["nodes"][1]["state"] == "left"
    assert node_warnings(report.nodes, supervisor_running=True) == []


def test_the_tui_lists_each_joined_node_under_its_log_name_and_warns_of_a_failed_one(
    experiment: Path,
):
    node_0_running(experiment, nnodes=2)
    write_node_status(experiment, 1, 2, "gpu-2", 42, "failed", 3, "its trainer has failed")
    snapshot = ExperimentReader(experiment, supervisor_pid=lambda _: 4242).poll()
    row = snapshot.process("trainer-node1")
    assert row is not None and row.state == "failed" and row.restarts == 3
    assert row.last_exit == "on gpu-2: its trainer has failed"
    assert any("node 1 (gpu-2) failed: its trainer" in warning for warning in snapshot.warnings)
