"""Screenshots of the main screen at the two sizes that matter: 80x24 (SSH) and 160x48.

The data is the synthetic experiment with a frozen clock and a fixed supervisor pid, so
the pictures are the same on every machine. After an intended change of the UI, look at
the new pictures and accept them with `pytest tests/tui --snapshot-update`.
"""

from __future__ import annotations

from tests.tui.conftest import next_polls, wait_until
from workbench.tui.widgets.log_pane import LogPane


async def _loaded(pilot) -> None:
    app = pilot.app
    await next_polls(pilot, app)
    pane = app.screen.query_one(LogPane)
    await wait_until(pilot, lambda: pane.log.line_count == 12, what="the log pane's lines")
    await pilot.pause()


def test_main_screen_80x24(snap_compare, experiment, make_app):
    assert snap_compare(make_app(experiment), terminal_size=(80, 24), run_before=_loaded)


def test_main_screen_160x48(snap_compare, experiment, make_app):
    assert snap_compare(make_app(experiment), terminal_size=(160, 48), run_before=_loaded)
