"""`workbench join` before it starts anything: which node it may join as, where node 0's
store is, and when the experiment has a trainer to join (the loop itself runs in
tests/trainer_rl/test_multi_node.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.config import ModelSection, TrainerConfig, TrainerSection, model_to_toml
from workbench.supervisor import paths
from workbench.supervisor.join import JoinError, joining_node, trainer_phase
from workbench.supervisor.plan import Rendezvous, write_rendezvous


def node_0_started(experiment: Path, nnodes: int = 2, output_dir: Path | None = None) -> None:
    """What `workbench up` on node 0 leaves for the other nodes."""
    port = 29400 if nnodes > 1 else 0
    config = TrainerConfig(
        output_dir=output_dir or experiment,
        model=ModelSection(base="builtin:tiny-reverse"),
        trainer=TrainerSection(nproc_per_node=3, nnodes=nnodes, rendezvous_port=port),
    )
    paths.trainer_config_path(experiment).parent.mkdir(parents=True)
    paths.trainer_config_path(experiment).write_text(model_to_toml(config))
    write_rendezvous(experiment, Rendezvous("10.1.2.3", port, nnodes))


def test_a_node_joins_with_node_0s_config_and_store_address(experiment: Path):
    node_0_started(experiment, nnodes=3)
    node = joining_node(experiment, 2, interface="lo")
    argv = node.argv
    assert argv[argv.index("--nproc_per_node") + 1] == "3"
    assert argv[argv.index("--nnodes") + 1] == "3"
    assert argv[argv.index("--rdzv-endpoint") + 1] == "10.1.2.3:29400"
    assert argv[argv.index("--rdzv-conf") + 1] == "node_rank=2"
    assert argv[-1] == str(paths.trainer_config_path(experiment))
    assert node.env["GLOO_SOCKET_IFNAME"] == node.env["NCCL_SOCKET_IFNAME"] == "lo"
    assert node.log_path.name == "trainer-node2.log"


@pytest.mark.parametrize(
    ("nnodes", "node_rank", "refusal"),
    [
        (1, 1, "runs on one node"),
        (2, 2, "--node-rank 2 is not one of 1..1"),
    ],
)
def test_a_rank_the_experiment_has_no_room_for_is_refused(
    experiment: Path, nnodes: int, node_rank: int, refusal: str
):
    node_0_started(experiment, nnodes=nnodes)
    with pytest.raises(JoinError, match=refusal):
        joining_node(experiment, node_rank)


def test_an_experiment_not_started_or_mounted_elsewhere_is_refused(tmp_path: Path):
    with pytest.raises(JoinError, match="start the experiment with `workbench up`"):
        joining_node(tmp_path, 1)
    elsewhere = tmp_path / "mnt" / "exp"
    elsewhere.mkdir(parents=True)
    node_0_started(tmp_path, output_dir=elsewhere)
    with pytest.raises(JoinError, match="at the same path on every node"):
        joining_node(tmp_path, 1)


def test_an_interface_this_node_lacks_is_refused(experiment: Path):
    node_0_started(experiment)
    with pytest.raises(JoinError, match="no network interface 'nosuch0'"):
        joining_node(experiment, 1, interface="nosuch0")


def test_the_join_runs_while_the_supervisor_runs_and_its_trainer_may_restart():
    def state(status: str, trainer: str) -> dict:
        return {"status": status, "processes": {"trainer": {"state": trainer}}}

    assert trainer_phase(state("running", "backoff"))[0] == "running"
    assert trainer_phase(state("starting", "waiting"))[0] == "running"
    assert trainer_phase(state("stopping", "stopping"))[0] == "stopped"
    assert trainer_phase(None)[0] == "stopped"
    assert trainer_phase(state("running", "failed")) == (
        "failed",
        "its trainer has failed and will not be restarted",
    )
