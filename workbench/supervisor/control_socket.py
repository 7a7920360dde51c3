"""The supervisor's control channel: a Unix socket (mode 0600), one JSON request per connection.

Protocol (docs/contracts.md): the client sends one JSON object (`{"cmd": ...}`), ends its
side of the connection, and reads one JSON reply: `{"ok": true, ...}` or
`{"ok": false, "error": "message"}`. No TCP port is ever opened: only the owner of the
experiment can connect.

`ControlServer` only moves bytes: each request is handed to the supervisor's loop through
`pending` and answered when the loop has handled it, so every change of state happens on
one thread. `new_run_config` is the add_run logic, shared with the CLI for when no
supervisor is running.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.config import (
    ConfigError,
    OrchestratorConfig,
    check_run_id,
    deep_merge,
    nest_dotted,
    normalize_run_id,
    validate_model,
)
from workbench.files import layout
from workbench.recipe import load_recipe
from workbench.supervisor.paths import unix_socket_address
from workbench.supervisor.preflight import check_new_run

log = logging.getLogger(__name__)

COMMANDS = ("ping", "evict", "restart_run", "restart_process", "add_run", "stop_all")
MAX_REQUEST_BYTES = 1 << 20
REPLY_TIMEOUT_S = 30.0


class ControlError(Exception):
    """A request that cannot be carried out; the message goes back as the error."""


@dataclass
class PendingRequest:
    """A request waiting for the supervisor's loop; `finish` wakes the connection thread."""

    request: dict[str, Any]
    reply: dict[str, Any] | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def finish(self, reply: dict[str, Any]) -> None:
        self.reply = reply
        self.done.set()


class ControlServer:
    """Accepts connections on the socket and queues their requests for the supervisor."""

    def __init__(self, path: Path, wake: threading.Event):
        self.path = path
        self.pending: queue.Queue[PendingRequest] = queue.Queue()
        self._wake = wake
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()

    def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # left by a supervisor that was killed; we hold the lock
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # The umask makes the socket owner-only from the moment it exists; chmod makes sure.
        old_umask = os.umask(0o177)
        try:
            with unix_socket_address(self.path) as address:
                sock.bind(address)
        finally:
            os.umask(old_umask)
        os.chmod(self.path, 0o600)
        sock.listen(16)
        sock.settimeout(0.5)
        self._sock = sock
        self._thread = threading.Thread(target=self._accept_loop, name="control", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closing.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._sock is not None:
            self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        # Nobody will handle what is still queued: answer it rather than leave clients hanging.
        while True:
            try:
                pending = self.pending.get_nowait()
            except queue.Empty:
                break
            pending.finish({"ok": False, "error": "the supervisor has stopped"})

    def _accept_loop(self) -> None:
        assert self._sock is not None
        while not self._closing.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._closing.is_set():
                    return
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(REPLY_TIMEOUT_S)
            try:
                request = json.loads(_read_message(conn))
                if not isinstance(request, dict):
                    raise ValueError("a request must be a JSON object")
            except (ValueError, OSError) as err:
                _send(conn, {"ok": False, "error": f"bad request: {err}"})
                return
            pending = PendingRequest(request)
            self.pending.put(pending)
            self._wake.set()
            if not pending.done.wait(REPLY_TIMEOUT_S):
                reply = {"ok": False, "error": "the supervisor did not answer in time; try again"}
            else:
                reply = pending.reply or {"ok": False, "error": "no reply"}
            with contextlib.suppress(OSError):
                _send(conn, reply)


def _read_message(conn: socket.socket) -> bytes:
    """Bytes up to a newline or the end of the client's side, whichever comes first."""
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        if b"\n" in chunk:
            break
        if size > MAX_REQUEST_BYTES:
            raise ValueError(f"request larger than {MAX_REQUEST_BYTES} bytes")
    return b"".join(chunks).split(b"\n", 1)[0]


def _send(conn: socket.socket, reply: dict[str, Any]) -> None:
    conn.sendall(json.dumps(reply).encode() + b"\n")


# ---------------------------------------------------------------- add_run


def normalize_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    """Dotted keys (`sampling.temperature`) become nested tables; nested ones are kept."""
    nested: dict[str, Any] = {}
    for key, value in overrides.items():
        nested = deep_merge(nested, nest_dotted(str(key), value))
    return nested


def new_run_config(
    experiment: Path,
    raw_id: str,
    overrides: dict[str, Any],
    base: OrchestratorConfig | None = None,
) -> tuple[str, OrchestratorConfig]:
    """The id and orchestrator config of a run to add: `base` (default: the recipe's
    `[defaults]`) deep-merged with `overrides`. Raises ControlError naming what is wrong
    (bad or taken id, invalid keys or values, an unreadable recipe, what
    `workbench.supervisor.preflight.check_new_run` finds)."""
    raw_id = raw_id.strip()
    problem = check_run_id(raw_id)
    if problem:
        raise ControlError(problem)
    run_id = normalize_run_id(raw_id)
    run = layout.run_dir(experiment, run_id)
    if run.exists():
        raise ControlError(
            f"run {run_id} already exists ({run}); pick another id, or restart it with "
            f"`workbench restart {run_id}`"
        )
    recipe_file = layout.recipe_path(experiment)
    recipe = None
    if recipe_file.is_file():
        try:
            recipe = load_recipe(recipe_file)
        except ConfigError as err:
            raise ControlError(f"cannot read the experiment's recipe: {err}") from None
    # An experiment made by hand has no recipe: the built-in defaults.
    if base is None:
        base = recipe.defaults if recipe else OrchestratorConfig()
    merged = deep_merge(base.model_dump(mode="json"), normalize_overrides(overrides))
    try:
        config = validate_model(OrchestratorConfig, merged, f"{run_id} settings", "")
        check_new_run(experiment, recipe, run_id, config)
    except ConfigError as err:
        raise ControlError(str(err)) from None
    return run_id, config
