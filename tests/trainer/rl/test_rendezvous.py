"""The `workbench-static` rendezvous: node 0's store, which torchrun's workers meet through,
listens on the endpoint's address alone (127.0.0.1 by default, on the port the kernel
picked); the agents of other nodes are its clients, and every wildcard is refused."""

from __future__ import annotations

import os

import psutil
import pytest
from torch.distributed.elastic.rendezvous import RendezvousParameters

from workbench.system.ports import free_port, interface_ipv4, interface_names
from workbench.trainer.parallel import rendezvous
from workbench.trainer.parallel.launch import RENDEZVOUS_BACKEND


def parameters(
    endpoint: str, nodes: int = 1, node_rank: int = 0, max_nodes: int | None = None
) -> RendezvousParameters:
    return RendezvousParameters(
        RENDEZVOUS_BACKEND, endpoint, "run", nodes, max_nodes or nodes, node_rank=str(node_rank)
    )


def my_listeners() -> set[tuple[str, int]]:
    return {
        (conn.laddr.ip, conn.laddr.port)
        for conn in psutil.Process(os.getpid()).net_connections(kind="tcp")
        if conn.status == psutil.CONN_LISTEN
    }


def test_the_store_listens_on_127_0_0_1_at_the_port_the_workers_are_told(capfd):
    before = my_listeners()
    handler = rendezvous.create_handler(parameters("127.0.0.1:0"))
    info = handler.next_rendezvous()
    assert (info.rank, info.world_size) == (0, 1)
    assert info.bootstrap_store_info.master_addr == "127.0.0.1"
    port = info.bootstrap_store_info.master_port
    assert my_listeners() - before == {("127.0.0.1", port)}
    info.store.set("key", "value")
    assert info.store.get("key") == b"value"
    assert handler.use_agent_store, "workers must be clients of this store, not servers"
    assert (
        f"rendezvous on 127.0.0.1:{port} (loopback only; set [trainer] " in capfd.readouterr().err
    )


def network_address() -> str:
    """An IPv4 address of this machine other than the loopback's (skips without one)."""
    for name in interface_names():
        address = interface_ipv4(name)
        if address is not None and not address.startswith("127."):
            return address
    pytest.skip("this machine has no network interface with an IPv4 address")


def test_node_0_of_two_listens_on_the_chosen_address_only_and_node_1_is_its_client():
    host, port = network_address(), free_port()
    before = my_listeners()
    node0 = rendezvous.create_handler(parameters(f"{host}:{port}", nodes=2))
    info0 = node0.next_rendezvous()
    assert my_listeners() - before == {(host, port)}, "not 0.0.0.0, not 127.0.0.1"

    node1 = rendezvous.create_handler(parameters(f"{host}:{port}", nodes=2, node_rank=1))
    info1 = node1.next_rendezvous()
    assert my_listeners() - before == {(host, port)}, "node 1 listens on nothing"
    assert (info0.rank, info0.world_size, info1.rank, info1.world_size) == (0, 2, 1, 2)
    assert info1.bootstrap_store_info.master_addr == host
    assert info1.bootstrap_store_info.master_port == port
    info1.store.set("from node 1", "hello")
    assert info0.store.get("from node 1") == b"hello", "one store, node 1 its client"


@pytest.mark.parametrize(
    ("endpoint", "nodes", "node_rank", "max_nodes", "refusal"),
    [
        ("0.0.0.0:0", 1, 0, None, "not every interface"),
        ("0.0.0.0:29500", 2, 1, None, "not every interface"),
        ("127.0.0.1:0", 2, 0, None, "need a fixed port"),
        ("127.0.0.1:29500", 2, 2, None, "node_rank 2 is not in 0..1"),
        ("127.0.0.1:29500", 1, 0, 2, "fixed number of nodes"),
    ],
)
def test_a_wildcard_a_random_port_for_several_nodes_or_a_bad_rank_is_refused(
    endpoint: str, nodes: int, node_rank: int, max_nodes: int | None, refusal: str
):
    with pytest.raises(ValueError, match=refusal):
        rendezvous.create_handler(parameters(endpoint, nodes, node_rank, max_nodes))
