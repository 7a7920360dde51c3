"""`workbench.system.ports`: a port is free when a server could bind it, as vLLM's binds."""

from __future__ import annotations

import errno
import socket

from workbench.system import ports


def test_a_listened_on_port_is_taken_and_one_left_in_time_wait_by_a_server_is_free():
    """After a server stops (a restart, `down` then `up`), its port waits in TIME_WAIT; vLLM
    binds with SO_REUSEADDR and gets it again, so the check must not call it taken."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as vLLM's server
    listener.bind(("127.0.0.1", ports.free_port()))
    listener.listen()
    port = listener.getsockname()[1]
    assert ports.bind_error("127.0.0.1", port).errno == errno.EADDRINUSE
    assert not ports.port_is_free("127.0.0.1", port)

    # The server closes first, so its side of the connection waits in TIME_WAIT.
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = listener.accept()
    accepted.close()
    listener.close()
    client.close()
    assert ports.bind_error("127.0.0.1", port) is None
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))  # as the check said
