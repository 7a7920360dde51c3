"""The supervisor's warnings (state.json `warnings`, e.g. tracking failing) reach the TUI."""

from __future__ import annotations

import json
from pathlib import Path

from tests.tui.conftest import next_polls, wait_until

WARNING = "tracking (wandb): run_a: OSError('No space left on device'); trying again in 30s"


def add_warnings(experiment: Path, warnings: list[str]) -> None:
    path = experiment / "supervisor" / "state.json"
    state = json.loads(path.read_text())
    path.write_text(json.dumps({**state, "warnings": warnings}))


def warning_notifications(app) -> list[str]:
    return [n.message for n in app._notifications if n.severity == "warning"]


async def test_a_supervisor_warning_is_notified_once_while_it_lasts(experiment, make_app):
    app = make_app(experiment)
    async with app.run_test(size=(80, 24)) as pilot:
        await next_polls(pilot, app)
        assert warning_notifications(app) == []
        add_warnings(experiment, [WARNING])
        await wait_until(pilot, lambda: WARNING in warning_notifications(app), what="a warning")
        assert app.snapshot.warnings == (WARNING,)
        await next_polls(pilot, app, count=3)
        assert warning_notifications(app) == [WARNING]  # not again at every poll
