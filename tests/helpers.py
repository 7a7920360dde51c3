"""Small builders shared by tests (importable as `tests.helpers`)."""

from __future__ import annotations

import socket
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make_run(experiment: Path, run_id: str, orch_toml: str = "") -> Path:
    """A run directory as the handshake leaves it: `control/orch.toml` written."""
    control = experiment / run_id / "control"
    control.mkdir(parents=True, exist_ok=True)
    (control / "orch.toml").write_text(orch_toml)
    return experiment / run_id
