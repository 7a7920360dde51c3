"""Fixtures for the TUI tests: a synthetic experiment, an app on it, a way to wait."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.text import Text
from textual.pilot import Pilot
from textual.widgets._footer import FooterKey

from tests.tui.synthetic import FROZEN_NOW, build_experiment
from workbench.tui.app import WorkbenchApp
from workbench.tui.commands import NOT_RUNNING, CommandOutcome
from workbench.tui.data import ExperimentReader
from workbench.tui.widgets.keyed_table import KeyedTable

# Fixed pid of the synthetic supervisor, running as far as the reader given to the app
# knows: screenshots then never depend on the processes of the machine running the tests.
SUPERVISOR_PID = 4100


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run `async def` tests in a fresh event loop (Pilot needs one); no plugin needed."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    arguments = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    asyncio.run(pyfuncitem.obj(**arguments))
    return True


class RecordingCommands:
    """Stands in for the supervisor's control channel: records what the TUI sends."""

    def __init__(self, running: bool = True) -> None:
        self.running = running
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def is_running(self) -> bool:
        return self.running

    def send(self, cmd: str, **fields: Any) -> CommandOutcome:
        if not self.running:
            return CommandOutcome(False, NOT_RUNNING)
        self.sent.append((cmd, fields))
        return CommandOutcome(True, f"{cmd}: sent to the supervisor")


@pytest.fixture
def experiment(tmp_path: Path) -> Path:
    return build_experiment(tmp_path, supervisor_pid=SUPERVISOR_PID)


@pytest.fixture
def commands() -> RecordingCommands:
    return RecordingCommands()


@pytest.fixture
def make_app(commands: RecordingCommands) -> Callable[..., WorkbenchApp]:
    def make(experiment: Path, **kwargs: Any) -> WorkbenchApp:
        kwargs.setdefault("clock", lambda: FROZEN_NOW)
        kwargs.setdefault("commands", commands)
        kwargs.setdefault("poll_interval", 0.1)
        kwargs.setdefault(
            "reader", ExperimentReader(experiment, supervisor_pid=lambda _: SUPERVISOR_PID)
        )
        return WorkbenchApp(experiment, **kwargs)

    return make


def rows(app: WorkbenchApp, table_type: type[KeyedTable]) -> dict[str, dict[str, str]]:
    """What a table of the current screen shows: {row key: {column key: plain text}}."""
    table = app.screen.query_one(table_type)
    shown = {}
    for row in table.ordered_rows:
        cells = table.get_row(row.key)
        shown[row.key.value] = {
            column.key.value: cell.plain if isinstance(cell, Text) else str(cell)
            for column, cell in zip(table.ordered_columns, cells, strict=True)
        }
    return shown


async def wait_until(
    pilot: Pilot, condition: Callable[[], bool], timeout: float = 10.0, what: str = ""
) -> None:
    """Let the app run until `condition()` holds; fail with `what` after `timeout` s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        await pilot.pause(0.05)


async def next_polls(pilot: Pilot, app: WorkbenchApp, count: int = 2) -> None:
    """Wait for `count` more complete polls of the experiment directory."""
    target = app.polls + count
    await wait_until(pilot, lambda: app.polls >= target, what=f"{count} polls")


async def press_for(pilot, key: str, screen_type: type) -> None:
    """Press `key`, then wait for the screen it opens (or goes back to) to be shown."""
    await pilot.press(key)
    app = pilot.app
    await wait_until(pilot, lambda: isinstance(app.screen, screen_type), what=screen_type.__name__)


def footer_keys(app) -> list[str]:
    """The keys the footer of the current screen shows, as "key description"."""
    return [f"{key.key_display} {key.description}" for key in app.screen.query(FooterKey)]


async def footer_shown(pilot, key: str) -> list[str]:
    """The current screen's footer keys, once `key` is among them (the footer is laid out
    after the screen)."""
    app = pilot.app
    await wait_until(pilot, lambda: key in footer_keys(app), what=f"{key!r} in the footer")
    await pilot.pause()
    return footer_keys(app)


def footer_fits(app) -> bool:
    return all(key.region.right <= app.size.width for key in app.screen.query(FooterKey))
