"""The alerts in the TUI: a banner on the main screen while alerts are new, `!` lists them
(newest first) and clears the banner until the next one."""

from __future__ import annotations

from tests.tui.conftest import next_polls, press_for, wait_until
from tests.tui.synthetic import FROZEN_NOW
from workbench.files.alerts import Alert, append_alert
from workbench.tui.screens.alerts import AlertsScreen
from workbench.tui.screens.main import MainScreen


def banner(app) -> str | None:
    line = app.screen.query_one("#alerts-banner")
    return str(line.render()) if line.display and line.region.height == 1 else None


def raise_alert(experiment, run: str, rule: str, message: str, step: int) -> None:
    append_alert(
        experiment,
        Alert(time=FROZEN_NOW - 60, run=run, rule=rule, message=message, key=f"step {step}"),
    )


async def test_a_new_alert_is_a_banner_until_the_list_is_opened(experiment, make_app):
    app = make_app(experiment)
    async with app.run_test(size=(80, 24)) as pilot:
        await next_polls(pilot, app)
        assert banner(app) is None
        raise_alert(experiment, "run_lr1e-3", "non_finite", "non-finite loss nan at update 2", 2)
        raise_alert(experiment, "run_lr3e-4", "reward_collapse", "reward collapsed: 0.1", 9)
        await wait_until(pilot, lambda: banner(app) is not None, what="the banner")
        assert banner(app).startswith(
            " ! 2 new alerts (! lists them): run_lr3e-4 reward_collapse: reward collapsed"
        )

        await press_for(pilot, "exclamation_mark", AlertsScreen)
        await next_polls(pilot, app)
        table = app.screen.query_one("#alerts-table").content
        rules = [str(cell) for cell in table.columns[2].cells]
        assert rules == ["reward_collapse", "non_finite"]  # newest first
        assert "non-finite loss nan at update 2" in list(table.columns[3].cells)
        assert "run_lr1e-3" in app.export_screenshot()  # on screen at 80x24

        await press_for(pilot, "escape", MainScreen)
        await next_polls(pilot, app)
        assert banner(app) is None
        raise_alert(experiment, "run_lr1e-3", "stall", "no record for 15 min", 3)
        await wait_until(pilot, lambda: banner(app) is not None, what="the banner again")
        assert banner(app).startswith(" ! 1 new alert (! lists them): run_lr1e-3 stall")
