"""The `workbench-loopback` rendezvous: the store torchrun's workers meet through listens
on 127.0.0.1 alone, on the port the kernel picked, and nothing else is accepted."""

from __future__ import annotations

import os

import psutil
import pytest
from torch.distributed.elastic.rendezvous import RendezvousParameters

from workbench.trainer import rendezvous
from workbench.trainer.launch import RENDEZVOUS_BACKEND


def parameters(endpoint: str, max_nodes: int = 1) -> RendezvousParameters:
    return RendezvousParameters(RENDEZVOUS_BACKEND, endpoint, "run", 1, max_nodes)


def my_listeners() -> set[tuple[str, int]]:
    return {
        (conn.laddr.ip, conn.laddr.port)
        for conn in psutil.Process(os.getpid()).net_connections(kind="tcp")
        if conn.status == psutil.CONN_LISTEN
    }


def test_the_store_listens_on_127_0_0_1_at_the_port_the_workers_are_told():
    before = my_listeners()
    handler = rendezvous.create_handler(parameters("127.0.0.1:0"))
    info = handler.next_rendezvous()
    assert (info.rank, info.world_size) == (0, 1)
    assert info.bootstrap_store_info.master_addr == "127.0.0.1"
    assert my_listeners() - before == {("127.0.0.1", info.bootstrap_store_info.master_port)}
    info.store.set("key", "value")
    assert info.store.get("key") == b"value"
    assert handler.use_agent_store, "workers must be clients of this store, not servers"


@pytest.mark.parametrize(
    ("endpoint", "max_nodes"), [("0.0.0.0:0", 1), ("example.org:29500", 1), ("127.0.0.1:0", 2)]
)
def test_another_address_or_more_than_one_node_is_refused(endpoint: str, max_nodes: int):
    with pytest.raises(ValueError, match=r"127\.0\.0\.1 only|one node"):
        rendezvous.create_handler(parameters(endpoint, max_nodes))
