"""The curves screen: every run's reward (or eval) curve on one chart, a colour per run,
every run named in the legend.

Driven through real Textual with Pilot at 80x24 on synthetic experiment directories
(`tests/tui/synthetic.py`). The chart is checked by its data (each run's points, read
back independently from metrics.jsonl) and by the colour of each run's cells, not pixels.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from matplotlib.colors import to_hex

from tests.tui.conftest import footer_fits, footer_shown, next_polls, press_for, wait_until
from tests.tui.synthetic import append_metrics, build_sweep_experiment, metrics_lines
from workbench.curves import experiment_figure
from workbench.tui.screens.curves import SWATCH, CurvesScreen
from workbench.tui.screens.leaderboard import LeaderboardScreen
from workbench.tui.screens.main import MainScreen
from workbench.tui.screens.run_detail import RunDetailScreen
from workbench.tui.widgets.curves import RunsChart
from workbench.tui.widgets.runs_table import RunsTable


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    return build_sweep_experiment(tmp_path)


def recorded(experiment: Path, metric: str) -> dict[str, list[tuple[int, float]]]:
    """Every run's (step, value) of `metric`, straight from its metrics.jsonl."""
    curves = {}
    for run in sorted(experiment.glob("run_*")):
        path = run / "metrics.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        records = [json.loads(line) for line in lines]
        curves[run.name] = sorted((r["step"], r[metric]) for r in records if metric in r)
    return curves


def charted(app) -> dict[str, list[tuple[int, float]]]:
    return {run.run_id: list(run.points) for run in app.screen.query_one(RunsChart).series}


def legend(app) -> str:
    return str(app.screen.query_one("#curves-legend-text").content)


async def open_curves(pilot, app) -> RunsChart:
    await next_polls(pilot, app)
    await press_for(pilot, "c", CurvesScreen)
    chart = app.screen.query_one(RunsChart)
    await wait_until(pilot, lambda: chart.series, what="the chart's curves")
    return chart


async def test_c_shows_every_runs_reward_curve_and_names_every_run(experiment, make_app):
    app = make_app(experiment)
    async with app.run_test(size=(80, 24)) as pilot:
        chart = await open_curves(pilot, app)
        assert charted(app) == recorded(experiment, "reward_mean")
        assert len(charted(app)["run_lr1e-3"]) == 12  # steps 1-12, one point each
        assert charted(app)["run_queued"] == []  # no record yet: in the legend only
        assert "reward_mean (training batch) by step" in chart.title
        for run_id in ("run_lr1e-3", "run_lr3e-4", "run_queued", "run_typo"):
            assert f"{SWATCH} {run_id}" in legend(app)
        assert "0.780 at step 12" in legend(app)  # run_lr1e-3's last reward: 0.3 + 0.04 x 12
        assert "no reward_mean yet" in legend(app)
        keys = await footer_shown(pilot, "t reward/eval")
        assert "c back" in keys
        assert footer_fits(app), "the curves screen's footer fits in 80 columns"
        await press_for(pilot, "c", MainScreen)


async def test_each_run_has_its_own_colour_on_the_chart_and_in_the_legend(sweep, make_app):
    app = make_app(sweep)
    async with app.run_test(size=(80, 24)) as pilot:
        chart = await open_curves(pilot, app)
        colours = {run.run_id: run.colour for run in chart.series}
        assert len(set(colours.values())) == len(colours) == 5
        # The legend's swatch of each run is drawn in its colour.
        text = app.screen.query_one("#curves-legend-text").content
        for line in text.split("\n"):
            run_id = line.plain.split()[1]
            swatch = next(span for span in line.spans if span.end <= len(SWATCH) + 1)
            assert str(swatch.style) == colours[run_id]
        # Every run with points has cells on the chart in its colour.
        rendered = chart.render()
        drawn = {str(span.style) for span in rendered.spans}
        for run in chart.series:
            assert (run.colour in drawn) == bool(run.points), run.run_id


async def test_t_switches_to_every_runs_eval_curve_and_back(sweep, make_app):
    app = make_app(sweep)
    async with app.run_test(size=(80, 24)) as pilot:
        chart = await open_curves(pilot, app)
        await pilot.press("t")
        await wait_until(pilot, lambda: "eval_reward_mean" in chart.title, what="eval curves")
        assert charted(app) == recorded(sweep, "eval_reward_mean")
        assert charted(app)["run_lr3e-3_rank4"] == [(0, 0.3), (5, 0.56), (10, 0.6), (20, 0.66)]
        assert "no eval_reward_mean yet" in legend(app)  # run_lr1e-3_rank8 is waiting
        await pilot.press("t")
        await wait_until(pilot, lambda: "reward_mean (training" in chart.title, what="rewards")
        assert charted(app) == recorded(sweep, "reward_mean")


async def test_a_new_record_reaches_the_chart_at_the_next_poll(experiment, make_app):
    app = make_app(experiment)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_curves(pilot, app)
        append_metrics(experiment / "run_lr3e-4", metrics_lines(9, 10, reward0=0.9, slope=0.0))
        await wait_until(
            pilot, lambda: (9, 0.9) in charted(app)["run_lr3e-4"], what="step 9 on the chart"
        )
        assert "0.900 at step 9" in legend(app)


async def test_the_runs_keep_the_colours_workbench_plot_gives_them(sweep, make_app):
    rewards, _ = experiment_figure(sweep).axes
    plotted = {line.get_label(): to_hex(line.get_color()) for line in rewards.lines}
    app = make_app(sweep)
    async with app.run_test(size=(80, 24)) as pilot:
        chart = await open_curves(pilot, app)
        shown = {run.run_id: run.colour for run in chart.series if run.run_id in plotted}
        assert shown == plotted


async def test_the_leaderboard_and_a_runs_detail_open_the_curves_too(sweep, make_app):
    app = make_app(sweep)
    async with app.run_test(size=(80, 24)) as pilot:
        await next_polls(pilot, app)
        await press_for(pilot, "b", LeaderboardScreen)
        assert "c curves" in await footer_shown(pilot, "c curves")
        assert footer_fits(app)
        await press_for(pilot, "c", CurvesScreen)
        await press_for(pilot, "escape", LeaderboardScreen)
        await press_for(pilot, "escape", MainScreen)
        app.screen.query_one(RunsTable).focus()
        await press_for(pilot, "enter", RunDetailScreen)
        assert footer_fits(app)
        await press_for(pilot, "c", CurvesScreen)
        await press_for(pilot, "c", RunDetailScreen)
