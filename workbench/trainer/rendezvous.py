"""torchrun's rendezvous, listening on 127.0.0.1 only: the `workbench-loopback` backend.

torchrun's agent keeps the store its workers meet through (a c10d TCPStore: keys and
values, no authentication). Every rendezvous torchrun ships creates that store from a host
name and port, and the store's server then listens on every interface whatever the host
(measured with torch 2.13: `TCPStore("127.0.0.1", port, is_master=True)` shows as `*:port`
in `ss -ltn`): anyone who can reach the machine could write into the trainer's store.
TCPStore accepts a socket that is already listening (`master_listen_fd`), and only here can
we hand it one: this backend binds 127.0.0.1 itself and gives the store that socket. Port 0
(the supervisor's choice) lets the kernel pick a free port at bind time, so a restarted
trainer never finds its port taken; the workers learn it from the rendezvous, as ever.

One node only, as the product runs one trainer on one machine. The backend is registered
by `workbench.trainer.launch` (torchrun's agent runs in that process) under the name its
`RENDEZVOUS_ARGS` ask for: `--rdzv-backend workbench-loopback --rdzv-endpoint 127.0.0.1:0`.
"""

from __future__ import annotations

import socket
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

HOST = "127.0.0.1"
TIMEOUT_S = 60.0


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


class LoopbackRendezvous(RendezvousHandler):
    """The one node's agent holds the store; its server listens on 127.0.0.1 only."""

    def __init__(self, backend: str, host: str, port: int, run_id: str, timeout_s: float) -> None:
        if host not in ("127.0.0.1", "localhost"):
            raise ValueError(f"{backend} listens on 127.0.0.1 only, not {host!r}")
        self.backend = backend
        self.run_id = run_id
        self.timeout = timedelta(seconds=timeout_s)
        self._port = port
        self._store: TCPStore | None = None

    def get_backend(self) -> str:
        return self.backend

    @property
    def use_agent_store(self) -> bool:
        # The workers use the agent's store as clients instead of starting a server of
        # their own (which would listen on every interface again).
        return True

    def next_rendezvous(self) -> RendezvousInfo:
        if self._store is None:
            sock = listening_socket(HOST, self._port)
            port = sock.getsockname()[1]
            # The store owns the socket from here on (it closes the descriptor).
            self._store = TCPStore(
                HOST, port, 1, True, self.timeout, master_listen_fd=sock.detach()
            )
        store_info = RendezvousStoreInfo(HOST, self._store.port)
        return RendezvousInfo(PrefixStore(self.run_id, self._store), 0, 1, store_info)

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
    if params.max_nodes != 1:
        raise ValueError(f"{params.backend} is for one node, not {params.max_nodes}")
    host, port = parse_rendezvous_endpoint(params.endpoint, default_port=0)
    timeout_s = float(params.config.get("timeout", TIMEOUT_S))
    return LoopbackRendezvous(params.backend, host, port, params.run_id, timeout_s)


def register(backend: str) -> None:
    """Make `--rdzv-backend <backend>` this rendezvous for torchrun in this process."""
    rendezvous_handler_registry.register(backend, create_handler)
