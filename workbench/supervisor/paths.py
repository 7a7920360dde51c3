"""Paths of the supervisor's own files under `{experiment}/supervisor/`, and Unix socket addresses.

Layered on `workbench.files.layout.supervisor_dir` so the experiment layout keeps one source of
truth. These files belong to the supervisor; other processes only read them:

    supervisor/
      state.json       what every supervised process is doing (docs/contracts.md)
      control.sock     the control channel (Unix socket, mode 0600)
      supervisor.pid   the running supervisor's pid; flock-ed while it lives
      endpoint.json    where the inference server listens and its API key (mode 0600)
      inference.toml   the InferenceConfig handed to the inference server
      trainer.toml     the TrainerConfig handed to the trainer
      rendezvous.json  where node 0's trainer meets the others (`workbench join` reads it)
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from workbench.files import endpoint as inference_endpoint
from workbench.files import layout

# sockaddr_un.sun_path is 108 bytes on Linux, including the terminating NUL.
_MAX_SOCKET_PATH = 107


def state_path(experiment: Path) -> Path:
    return layout.supervisor_dir(experiment) / "state.json"


def socket_path(experiment: Path) -> Path:
    return layout.supervisor_dir(experiment) / "control.sock"


def pid_path(experiment: Path) -> Path:
    return layout.supervisor_dir(experiment) / "supervisor.pid"


def endpoint_path(experiment: Path) -> Path:
    return inference_endpoint.endpoint_path(experiment)


def inference_config_path(experiment: Path) -> Path:
    return layout.supervisor_dir(experiment) / "inference.toml"


def trainer_config_path(experiment: Path) -> Path:
    return layout.supervisor_dir(experiment) / "trainer.toml"


def rendezvous_path(experiment: Path) -> Path:
    return layout.supervisor_dir(experiment) / "rendezvous.json"


@contextlib.contextmanager
def unix_socket_address(path: Path) -> Iterator[str]:
    """An address for `bind`/`connect` that reaches `path`, however long `path` is.

    A Unix socket path longer than 107 bytes cannot be bound or connected to directly
    (deep experiment directories, pytest's temp dirs). Going through an open descriptor
    of the socket's directory, `/proc/self/fd/N/name`, keeps the address short on Linux.
    """
    text = os.fspath(path)
    if len(os.fsencode(text)) <= _MAX_SOCKET_PATH:
        yield text
        return
    directory_fd = os.open(Path(path).parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{directory_fd}/{Path(path).name}"
    finally:
        os.close(directory_fd)


def connect_unix(path: Path, timeout_s: float) -> socket.socket:
    """A connected stream socket to the Unix socket at `path` (raises OSError if none)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        with unix_socket_address(path) as address:
            sock.connect(address)
    except BaseException:
        sock.close()
        raise
    return sock
