"""Talking to an experiment's supervisor: is it running, what is its state, send it requests.

Used by the CLI and the TUI; light to import (no torch). Requests go over
`supervisor/control.sock` (docs/contracts.md); state comes from `supervisor/state.json`,
which the supervisor rewrites atomically after every change, so reading it never races.

    client = SupervisorClient(Path("outputs/reverse_text"))
    if client.is_running():
        client.restart_run("run_lr1e-3")
    state = client.read_state()          # dict as in docs/contracts.md, or None

`evict_and_tell` is how the CLI and the TUI evict a run: the file, then the supervisor.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from workbench.files import layout, run_control
from workbench.supervisor import paths
from workbench.supervisor.lifecycle import LIVE_STATES
from workbench.supervisor.process import describe_exit
from workbench.system.clock import unix_time
from workbench.system.procfs import process_cmdline, process_is_alive

DEFAULT_TIMEOUT_S = 10.0


class SupervisorError(Exception):
    """The supervisor refused a request; the message says why and what to do."""


class SupervisorUnavailable(SupervisorError):
    """No supervisor answers on the experiment's control socket."""


def running_supervisor_pid(experiment: Path) -> int | None:
    """The pid of the experiment's live supervisor, or None.

    Reads `supervisor/supervisor.pid` without locking it (a reader holding the lock could
    make a starting supervisor refuse), and checks the pid is alive and still a supervisor
    (pids are reused).
    """
    try:
        text = paths.pid_path(experiment).read_text().strip()
    except OSError:
        return None
    if not text.isdigit():
        return None
    pid = int(text)
    if not process_is_alive(pid):
        return None
    command = process_cmdline(pid)
    if command and not any("workbench.supervisor" in part for part in command):
        return None
    return pid


# The supervisor writes state.json when it changes, and at least this often: its
# `updated_at` is the heartbeat by which another node (`workbench join`), which cannot see
# node 0's processes, tells a supervisor killed outright from one with nothing new to say.
STATE_HEARTBEAT_S = 10.0


def read_state(experiment: Path) -> dict[str, Any] | None:
    """`supervisor/state.json` as a dict, or None when there is none (or it is unreadable)."""
    try:
        state = json.loads(paths.state_path(experiment).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # ValueError: broken JSON or not UTF-8
        return None
    return state if isinstance(state, dict) else None


def describe_last_exit(record: dict[str, Any]) -> str | None:
    """How a process of state.json last ended ("exit code 1", "killed by SIGKILL", an
    error), or None when it never ended."""
    exits = record.get("exits")
    if not (isinstance(exits, list) and exits and isinstance(exits[-1], dict)):
        return None
    last = exits[-1]
    if not (last.get("error") or last.get("signal") is not None or last.get("code") is not None):
        return None
    return describe_exit(last.get("code"), last.get("signal"), last.get("error"), last.get("cause"))


def process_summaries(state: dict[str, Any] | None, *, live: bool) -> list[dict[str, Any]]:
    """One row per process of a state.json: name, kind, run_id, state, pid, restarts,
    uptime_s (None unless it runs), reason and last_exit ("exit code 1", "killed by SIGKILL").

    `live` says whether the supervisor that wrote the state still runs; if not, pids and
    uptimes are left out: they describe processes that may be long gone.
    """
    rows = []
    now = time.time()
    for name, record in ((state or {}).get("processes") or {}).items():
        if not isinstance(record, dict):
            continue
        running = live and record.get("state") in LIVE_STATES
        uptime = None
        started = unix_time(record.get("started_at")) if running else None
        if started is not None:
            uptime = max(0.0, now - started)
        last_exit = describe_last_exit(record)
        rows.append(
            {
                "name": name,
                "kind": record.get("kind"),
                "run_id": record.get("run_id"),
                "state": record.get("state"),
                "pid": record.get("pid") if running else None,
                "restarts": record.get("restarts", 0),
                "uptime_s": uptime,
                "reason": record.get("reason"),
                "last_exit": last_exit,
            }
        )
    return rows


class SupervisorClient:
    """Client of one experiment's supervisor.

    `request` returns the reply as sent (`{"ok": false, ...}` included) and raises
    `SupervisorUnavailable` when nothing answers. The convenience methods raise
    `SupervisorError` with the supervisor's message when it refuses.
    """

    def __init__(self, experiment: Path | str, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.experiment = Path(experiment)
        self.timeout_s = timeout_s

    @property
    def socket_path(self) -> Path:
        return paths.socket_path(self.experiment)

    @property
    def state_path(self) -> Path:
        return paths.state_path(self.experiment)

    # -------------------------------------------------------------- state

    def pid(self) -> int | None:
        return running_supervisor_pid(self.experiment)

    def is_running(self) -> bool:
        return self.pid() is not None

    def read_state(self) -> dict[str, Any] | None:
        return read_state(self.experiment)

    def wait_until_stopped(self, timeout_s: float, poll_s: float = 0.05) -> bool:
        """True once no supervisor runs for the experiment and the one that ran has exited
        (not merely released its pid file); False after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        pid = self.pid()
        while self.is_running() or (pid is not None and process_is_alive(pid)):
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)
        return True

    # -------------------------------------------------------------- requests

    def request(self, cmd: str, **fields: Any) -> dict[str, Any]:
        """Send `{"cmd": cmd, **fields}` and return the supervisor's reply."""
        message = json.dumps({"cmd": cmd, **fields}).encode() + b"\n"
        try:
            with paths.connect_unix(self.socket_path, self.timeout_s) as sock:
                sock.sendall(message)
                chunks = []
                while chunk := sock.recv(65536):
                    chunks.append(chunk)
        except (FileNotFoundError, ConnectionRefusedError) as err:
            raise SupervisorUnavailable(
                f"no supervisor is running for {self.experiment} ({self.socket_path}: "
                f"{err.strerror}); start it with `workbench up`"
            ) from None
        except OSError as err:
            raise SupervisorUnavailable(
                f"cannot talk to the supervisor of {self.experiment} ({self.socket_path}): {err}"
            ) from None
        try:
            reply = json.loads(b"".join(chunks))
        except json.JSONDecodeError:
            raise SupervisorUnavailable(
                f"the supervisor of {self.experiment} closed the connection without an answer"
            ) from None
        if not isinstance(reply, dict):
            raise SupervisorUnavailable(f"unexpected reply from the supervisor: {reply!r}")
        return reply

    def _checked(self, cmd: str, **fields: Any) -> dict[str, Any]:
        reply = self.request(cmd, **fields)
        if not reply.get("ok"):
            raise SupervisorError(str(reply.get("error") or f"{cmd} failed"))
        return reply

    def ping(self) -> dict[str, Any]:
        return self._checked("ping")

    def evict(
        self, run_id: str, reason: str = "evicted by the user", by: str = "user"
    ) -> dict[str, Any]:
        """Have the supervisor evict the run (writing `evicted.txt` unless it is there)
        and stop its orchestrator; `evict_and_tell` writes the file first."""
        return self._checked("evict", run_id=run_id, reason=reason, by=by)

    def restart_run(self, run_id: str) -> dict[str, Any]:
        """Clear the run's eviction and start its orchestrator again (it resumes)."""
        return self._checked("restart_run", run_id=run_id)

    def restart_process(self, name: str) -> dict[str, Any]:
        """Restart `inference`, `trainer` or a run's orchestrator (by run id)."""
        return self._checked("restart_process", name=name)

    def add_run(self, run_id: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        """Create `run_<id>` from the recipe's defaults and `overrides`; discovery starts it."""
        return self._checked("add_run", run_id=run_id, overrides=overrides or {})

    def stop_all(self) -> dict[str, Any]:
        """Stop every process and the supervisor (returns at once; see wait_until_stopped)."""
        return self._checked("stop_all")


# ---------------------------------------------------------------- evicting a run


class EvictionListener(Protocol):
    """Whom `evict_and_tell` tells: a `SupervisorClient`, or what the TUI sends through."""

    def is_running(self) -> bool: ...

    def evict(self, run_id: str, reason: str, by: str) -> dict[str, Any]:
        """The supervisor's reply; raises SupervisorError when it did not take it."""
        ...


@dataclass(frozen=True)
class Evicted:
    """What `evict_and_tell` did: the eviction in force (an earlier one keeps its reason),
    whether there was one already, whether the supervisor is stopping the run's
    orchestrator, and why a running supervisor did not take the eviction (if it did not)."""

    eviction: run_control.Eviction
    already: bool
    stopping: bool = False
    not_taken: str | None = None


def evict_and_tell(
    experiment: Path,
    run_id: str,
    reason: str,
    *,
    by: str,
    supervisor: EvictionListener | None = None,
) -> Evicted:
    """Evict a run from outside the supervisor (the CLI, the TUI): write
    `control/evicted.txt` (`run_control.evict`; a run evicted already keeps its first
    eviction), then tell the experiment's supervisor if one runs, which stops the run's
    orchestrator at once (`Supervisor.evict_run`). The file is the eviction: without a
    supervisor, or when it does not answer, the trainer still frees the run's slot at its
    next discovery, the orchestrator exits at its next step, and a supervisor stops it at
    its next scan of the run directories. Raises FileNotFoundError when the run directory
    is gone (writing would bring a deleted run back), OSError when the file cannot be
    written."""
    eviction, already = run_control.evict(layout.run_dir(experiment, run_id), reason, by)
    supervisor = supervisor if supervisor is not None else SupervisorClient(experiment)
    if not supervisor.is_running():
        return Evicted(eviction, already)
    try:
        reply = supervisor.evict(run_id, reason, by)
    except SupervisorError as err:
        return Evicted(eviction, already, not_taken=str(err))
    return Evicted(eviction, already, stopping=bool(reply.get("stopped")))
