"""torchrun's rendezvous with a store bound to one address: the `workbench-static` backend.

torchrun's agent keeps the store its workers meet through (a c10d TCPStore: keys and
values, no authentication). Every rendezvous torchrun ships creates that store from a host
name and port, and the store's server then listens on every interface whatever the host
(measured with torch 2.13: `TCPStore("127.0.0.1", port, is_master=True)` shows as `*:port`
in `ss -ltn`): anyone who can reach the machine could write into the trainer's store.
TCPStore accepts a socket that is already listening (`master_listen_fd`), and only here can
we hand it one: node 0's agent binds the endpoint's address itself (127.0.0.1 unless the
recipe names an interface) and gives the store that socket. Port 0 (one node) lets the
kernel pick a free port at bind time, so a restarted trainer never finds its port taken;
the workers learn it from the rendezvous, as ever.

Static, as torchrun's `static` backend: the number of nodes is fixed (`--nnodes N`) and
each node knows its rank (`--rdzv-conf node_rank=K`). Node 0 holds the store; the agents of
the other nodes connect to it as clients (retrying until the timeout, so a node may start
first) and torchrun hands out global ranks through it, node by node. The backend is
registered by `workbench.trainer.parallel.launch` (torchrun's agent runs in that process), which
also builds the arguments that ask for it (`rendezvous_args`).
"""

from __future__ import annotations

import socket
import sys
from datetime import timedelta

from torch.distributed import PrefixStore, TCPStore
from torch.distributed.elastic.rendezvous import (
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
    rendezvous_handler_registry,
)
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

LOOPBACK = "127.0.0.1"
# Wildcards listen on every interface, which is what this backend exists to avoid.
WILDCARDS = ("", "0.0.0.0", "::", "*")
# One node: the store is this machine's own. Several: node 0 waits this long for the
# others to join (torchrun's c10d join timeout), and the others for node 0's store.
TIMEOUT_S = 60.0
JOIN_TIMEOUT_S = 600.0


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on `host` alone (port 0: any free port)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock


def describe_listening(host: str, port: int, nnodes: int) -> str:
    """The line the launcher logs once node 0's store listens."""
    where = f"rendezvous on {host}:{port}"
    waiting = f"; waiting for {nnodes - 1} more node(s)" if nnodes > 1 else ""
    if host == LOOPBACK:
        return (
            f"{where} (loopback only; set [trainer] rendezvous_interface to let other "
            f"nodes join){waiting}"
        )
    return f"{where}{waiting}"


class StaticRendezvous(RendezvousHandler):
    """`nnodes` agents, node 0 holding the store on `host` alone, the others its clients."""

    def __init__(
        self,
        backend: str,
        host: str,
        port: int,
        run_id: str,
        nnodes: int,
        node_rank: int,
        timeout_s: float,
    ) -> None:
        if host in WILDCARDS:
            raise ValueError(f"{backend} listens on one address, not every interface ({host!r})")
        if not 0 <= node_rank < nnodes:
            raise ValueError(f"{backend}: node_rank {node_rank} is not in 0..{nnodes - 1}")
        if nnodes > 1 and port == 0:
            raise ValueError(f"{backend}: {nnodes} nodes need a fixed port, not 0")
        self.backend = backend
        self.host = host
        self.run_id = run_id
        self.nnodes = nnodes
        self.node_rank = node_rank
        self.timeout = timedelta(seconds=timeout_s)
        self._port = port
        self._store: TCPStore | None = None

    def get_backend(self) -> str:
        return self.backend

    @property
    def use_agent_store(self) -> bool:
        # The workers use node 0's store as clients instead of starting a server of their
        # own (which would listen on every interface again).
        return True

    def _open_store(self) -> TCPStore:
        if self.node_rank > 0:
            return TCPStore(self.host, self._port, None, False, self.timeout)
        sock = listening_socket(self.host, self._port)
        port = sock.getsockname()[1]
        # The agent's own log (logs/trainer.log): where other nodes must reach, or why not.
        print(describe_listening(self.host, port, self.nnodes), file=sys.stderr, flush=True)
        # The store owns the socket from here on (it closes the descriptor). The others
        # join through torchrun's rank assignment, which waits for each node's key.
        return TCPStore(
            self.host, port, None, True, self.timeout,
            wait_for_workers=False, master_listen_fd=sock.detach(),
        )  # fmt: skip

    def next_rendezvous(self) -> RendezvousInfo:
        if self._store is None:
            self._store = self._open_store()
        store_info = RendezvousStoreInfo(self.host, self._store.port)
        store = PrefixStore(self.run_id, self._store)
        return RendezvousInfo(store, self.node_rank, self.nnodes, store_info)

    def is_closed(self) -> bool:
        return False

    def set_closed(self) -> None:
        pass

    def num_nodes_waiting(self) -> int:
        return 0

    def get_run_id(self) -> str:
        return self.run_id

    def shutdown(self) -> bool:
        return True


def create_handler(params: RendezvousParameters) -> RendezvousHandler:
    if params.min_nodes != params.max_nodes:
        raise ValueError(
            f"{params.backend} takes a fixed number of nodes, not {params.min_nodes}:"
            f"{params.max_nodes}"
        )
    nnodes = params.max_nodes
    host, port = parse_rendezvous_endpoint(params.endpoint, default_port=0)
    default_timeout = JOIN_TIMEOUT_S if nnodes > 1 else TIMEOUT_S
    timeout_s = float(params.config.get("timeout", default_timeout))
    node_rank = int(params.config.get("node_rank", 0))
    return StaticRendezvous(params.backend, host, port, params.run_id, nnodes, node_rank, timeout_s)


def register(backend: str) -> None:
    """Make `--rdzv-backend <backend>` this rendezvous for torchrun in this process."""
    rendezvous_handler_registry.register(backend, create_handler)
