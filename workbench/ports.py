"""Picking TCP ports that stay free until their owner binds them, and checking a chosen one.

The one port picker of workbench: the supervisor's plan picks the inference port (or checks
the recipe's), the inference process picks a new one when the planned port was taken
meanwhile, and the local servers of the benchmarks and tests pick theirs here. The
trainer's rendezvous store needs none: it binds port 0 itself (`workbench.trainer.launch`).
"""

from __future__ import annotations

import random
import socket
from pathlib import Path


def ephemeral_port_range() -> tuple[int, int]:
    """The ports the kernel hands out for bind(0) and outgoing connections."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now, below the kernel's ephemeral range.

    The kernel's own pick (bind to port 0) comes from the ephemeral range, where any
    process binding port 0 (gloo, vLLM's internal sockets, other tests) or any outgoing
    connection may take it in the minute before vLLM binds it. Below that range only
    explicit choices land.
    """
    low, _ = ephemeral_port_range()
    if low > 12000:
        candidates = random.SystemRandom().sample(range(10000, low), k=50)
        for port in candidates:
            if port_is_free(host, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def bind_error(host: str, port: int) -> OSError | None:
    """Why a server could not bind `host:port` now, or None when it could.

    Probed as vLLM's server binds (SO_REUSEADDR): a port whose last connections linger in
    TIME_WAIT, as after a restart, counts as free; one something listens on does not.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as err:
            return err
        return None


def port_is_free(host: str, port: int) -> bool:
    return bind_error(host, port) is None
