"""Commands from the TUI to the supervisor, over its control channel.

The TUI never starts, stops or signals a process itself: it asks the supervisor
(`workbench.supervisor.client.SupervisorClient`, docs/contracts.md "Control channel") and
reports the answer. Every failure (no supervisor, a refused request, a broken socket)
comes back as a `CommandOutcome` the app shows as a notification, never as an exception
in the UI. `CommandSender` is the seam tests replace.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from workbench.supervisor.client import SupervisorClient, SupervisorError

NOT_RUNNING = (
    "supervisor not running: nothing to restart, add or stop. "
    "Start the experiment with `workbench up RECIPE`."
)


@dataclass(frozen=True)
class CommandOutcome:
    ok: bool
    message: str


class CommandSender(Protocol):
    def is_running(self) -> bool: ...

    def send(self, cmd: str, **fields: Any) -> CommandOutcome: ...


class SupervisorCommands:
    """Sends requests through the supervisor's client, if there is a supervisor."""

    def __init__(self, experiment: Path) -> None:
        self.experiment = experiment

    def is_running(self) -> bool:
        return SupervisorClient(self.experiment).is_running()

    def send(self, cmd: str, **fields: Any) -> CommandOutcome:
        client = SupervisorClient(self.experiment)
        if not client.is_running():
            return CommandOutcome(False, NOT_RUNNING)
        try:
            reply = client.request(cmd, **fields)
        except SupervisorError as err:  # nothing answered: the message says what to do
            return CommandOutcome(False, str(err))
        if not reply.get("ok", False):
            return CommandOutcome(False, f"{cmd} refused: {reply.get('error', 'no reason given')}")
        return CommandOutcome(True, _describe(cmd, fields))


def _describe(cmd: str, fields: dict[str, Any]) -> str:
    target = fields.get("run_id") or fields.get("name") or ""
    return f"{cmd.replace('_', ' ')} {target}".strip() + ": sent to the supervisor"
