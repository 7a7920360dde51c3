"""Screenshots of the main screen and the leaderboard at the two sizes that matter: 80x24
(SSH) and 160x48; the curves screen at 80x24; runs selected, pinned and filtered, and
the selected runs' curves smoothed, at 80x24.

The data is the synthetic experiment with a frozen clock and a fixed supervisor pid, so
the pictures are the same on every machine. After an intended change of the UI, look at
the new pictures and accept them with `pytest tests/tui --snapshot-update`.
"""

from __future__ import annotations

from pathlib import Path

from tests.tui.conftest import next_polls, wait_until
from tests.tui.synthetic import build_sweep_experiment
from tests.tui.test_compare_screen import build_compared_experiments
from workbench.tui.screens.compare import CompareScreen, CompareTable
from workbench.tui.screens.leaderboard import LeaderboardScreen
from workbench.tui.widgets.curves import RunsChart
from workbench.tui.widgets.leaderboard_table import LeaderboardTable
from workbench.tui.widgets.log_pane import LogPane
from workbench.tui.widgets.runs_table import RunsTable


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


async def _leaderboard(pilot) -> None:
    app = pilot.app
    await next_polls(pilot, app)
    await pilot.press("b")
    table = app.screen.query_one(LeaderboardTable)
    await wait_until(pilot, lambda: table.row_count == 5, what="the leaderboard's rows")
    await pilot.press("down", "down")  # the run early stopping stopped: its reason below
    await pilot.pause()


def test_leaderboard_80x24(snap_compare, tmp_path, make_app):
    experiment = build_sweep_experiment(tmp_path)
    app = make_app(experiment)
    assert snap_compare(app, terminal_size=(80, 24), run_before=_leaderboard)


def test_leaderboard_160x48(snap_compare, tmp_path, make_app):
    experiment = build_sweep_experiment(tmp_path)
    app = make_app(experiment)
    assert snap_compare(app, terminal_size=(160, 48), run_before=_leaderboard)


async def _curves(pilot) -> None:
    app = pilot.app
    await next_polls(pilot, app)
    await pilot.press("c")
    await wait_until(pilot, lambda: app.screen.query(RunsChart), what="the curves screen")
    chart = app.screen.query_one(RunsChart)
    await wait_until(pilot, lambda: len(chart.series) == 5, what="every run's curve")
    await pilot.pause()


def test_curves_80x24(snap_compare, tmp_path, make_app):
    experiment = build_sweep_experiment(tmp_path)
    app = make_app(experiment)
    assert snap_compare(app, terminal_size=(80, 24), run_before=_curves)


async def _all_experiments(pilot) -> None:
    app = pilot.app
    await next_polls(pilot, app)
    await pilot.press("b")
    await wait_until(pilot, lambda: isinstance(app.screen, LeaderboardScreen), what="leaderboard")
    await pilot.press("a")
    await wait_until(
        pilot,
        lambda: (
            isinstance(app.screen, CompareScreen)
            and app.screen.query_one(CompareTable).row_count == 5
        ),
        what="the runs of every experiment",
    )
    await pilot.press("down")  # the fork: its lineage below
    await pilot.pause()


def test_all_experiments_100x30(snap_compare, tmp_path, make_app, monkeypatch):
    build_compared_experiments(tmp_path)
    monkeypatch.chdir(tmp_path)  # paths shown as a user in that folder sees them
    app = make_app(Path("outputs/reverse_text"))
    assert snap_compare(app, terminal_size=(100, 30), run_before=_all_experiments)


async def _picked(pilot) -> None:
    """run_lr1e-2_rank8 and run_lr3e-2_rank8 selected, run_lr3e-2_rank8 pinned, the runs
    filtered to rank 8."""
    app = pilot.app
    await next_polls(pilot, app)
    table = app.screen.query_one(RunsTable)
    await wait_until(pilot, lambda: table.row_count == 5, what="the runs")
    for run_id, keys in (("run_lr1e-2_rank8", ["space"]), ("run_lr3e-2_rank8", ["space", "p"])):
        table.select_key(run_id)
        await pilot.press(*keys)
    await pilot.press("slash", *"rank8", "enter")
    await wait_until(pilot, lambda: table.row_count == 3, what="the filter")
    await pilot.pause()


def test_runs_selected_pinned_filtered_80x24(snap_compare, tmp_path, make_app):
    app = make_app(build_sweep_experiment(tmp_path))
    assert snap_compare(app, terminal_size=(80, 24), run_before=_picked)


async def _selected_curves_smoothed(pilot) -> None:
    await _picked(pilot)
    app = pilot.app
    await pilot.press("c")
    await wait_until(pilot, lambda: app.screen.query(RunsChart), what="the curves screen")
    chart = app.screen.query_one(RunsChart)
    await wait_until(pilot, lambda: len(chart.series) == 2, what="the selected runs' curves")
    await pilot.press("s")
    await pilot.pause()


def test_curves_of_the_selected_runs_smoothed_80x24(snap_compare, tmp_path, make_app):
    app = make_app(build_sweep_experiment(tmp_path))
    assert snap_compare(app, terminal_size=(80, 24), run_before=_selected_curves_smoothed)
