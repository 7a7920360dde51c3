"""Picking TCP ports that stay free until their owner binds them.

Shared by the supervisor's plan (the trainer's rendezvous port, the first inference port)
and the inference process (a new port when the planned one was taken meanwhile).
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


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
        return True
