"""Picking TCP ports that stay free until their owner binds them, checking a chosen one, and
the address of a network interface to bind them on, the interface that reaches an address;
whether an address is this machine's only.

The one port picker of workbench: the supervisor's plan picks the inference port (or checks
the recipe's), the inference process picks a new one when the planned port was taken
meanwhile, and the local servers of the benchmarks and tests pick theirs here. The
trainer's rendezvous store needs none on one node: it binds port 0 itself
(`workbench.trainer.parallel.launch`); on several, the recipe fixes it.
"""

from __future__ import annotations

import fcntl
import ipaddress
import random
import socket
import struct
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
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as err:
            return err
        return None


def port_is_free(host: str, port: int) -> bool:
    return bind_error(host, port) is None


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address, IPv6 with or without brackets) is this machine
    only: localhost, 127.0.0.0/8 or ::1."""
    name = host.strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


# ioctl(SIOCGIFADDR): an interface's IPv4 address (linux/sockios.h).
_SIOCGIFADDR = 0x8915


def interface_names() -> list[str]:
    """The network interfaces of this machine, by name."""
    return [name for _, name in socket.if_nameindex()]


def interface_ipv4(name: str) -> str | None:
    """The IPv4 address of the network interface `name`, or None when it has none (or no
    such interface exists)."""
    request = struct.pack("256s", name.encode()[:15])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            answer = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, request)
        except OSError:
            return None
    return socket.inet_ntoa(answer[20:24])


def source_address(host: str) -> str | None:
    """The address of this machine that the kernel sends from to reach `host` (IPv4), or
    None when no route reaches it. Connecting a UDP socket sends nothing: it only asks the
    kernel for its route, which holds the source address."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((host, 9))  # any port: nothing is sent
        except OSError:
            return None
        return str(probe.getsockname()[0])


def interface_reaching(host: str) -> str | None:
    """The network interface this machine reaches `host` through: the one holding the source
    address of the kernel's route to it (for one of this machine's own addresses, the
    interface holding it); None when no route reaches `host` or its source address is not
    an interface's first IPv4 address."""
    address = source_address(host)
    if address is None:
        return None
    return next((name for name in interface_names() if interface_ipv4(name) == address), None)
