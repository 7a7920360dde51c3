"""Which interface gloo's and nccl's ranks bind when nothing names one (the one that reaches
the rendezvous host), and node 0's refusal of a loopback rendezvous address in a Slurm job
across machines. The namespaces of test_network_namespaces.py show both across machines."""

from __future__ import annotations

import pytest

from workbench.supervisor import plan
from workbench.supervisor.plan import RENDEZVOUS_HOST_ENV, rendezvous_host
from workbench.system.ports import interface_ipv4, interface_names
from workbench.trainer.parallel.launch import endpoint_host, main, rendezvous_args, socket_interface


def test_the_endpoint_host_is_read_from_torchruns_arguments():
    assert endpoint_host(["--nproc_per_node", "1", *rendezvous_args("10.1.2.3", 29400, 2)]) == (
        "10.1.2.3"
    )
    assert endpoint_host(["--rdzv_endpoint=[::1]:29400"]) == "::1"
    assert endpoint_host(["train.py"]) == "127.0.0.1"


def test_the_ranks_bind_the_interface_that_holds_or_reaches_the_rendezvous_address():
    assert socket_interface("127.0.0.1") == socket_interface("127.0.1.1") == "lo"
    own = {name: interface_ipv4(name) for name in interface_names() if name != "lo"}
    for name, address in own.items():
        if address is not None:
            assert socket_interface(address) == name


def test_a_rendezvous_host_no_route_reaches_is_refused_before_torchrun_starts(monkeypatch, capsys):
    for variable in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr("workbench.trainer.parallel.launch.interface_reaching", lambda host: None)
    monkeypatch.setattr("workbench.trainer.parallel.launch.die_with_parent", lambda: None)
    monkeypatch.setattr("workbench.trainer.parallel.launch.run_as_batch", lambda: None)
    assert main(rendezvous_args("10.9.9.9", 29400, 2)) == 2
    assert "no network interface of this machine reaches" in capsys.readouterr().err


@pytest.fixture
def slurm_first_node_on(monkeypatch):
    def at(address: str, machines: int) -> None:
        monkeypatch.setenv(RENDEZVOUS_HOST_ENV, address)
        monkeypatch.setenv("SLURM_JOB_NUM_NODES", str(machines))

    return at


def test_a_loopback_first_node_across_machines_is_refused_naming_the_key(slurm_first_node_on):
    slurm_first_node_on("127.0.1.1", machines=2)
    host, problem = rendezvous_host(None)
    assert host is None
    assert "'127.0.1.1'" in str(problem) and "set [trainer] rendezvous_interface" in str(problem)
    assert plan.rendezvous_problems(None, 0)[0][0] == "trainer.rendezvous_interface"


def test_the_recipes_interface_stands_for_a_loopback_first_node(slurm_first_node_on):
    slurm_first_node_on("127.0.1.1", machines=2)
    assert rendezvous_host("lo") == ("127.0.0.1", None)


def test_a_loopback_first_node_on_one_machine_is_kept(slurm_first_node_on):
    slurm_first_node_on("127.0.0.1", machines=1)
    assert rendezvous_host(None) == ("127.0.0.1", None)
