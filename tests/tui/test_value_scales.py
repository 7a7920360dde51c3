"""The TUI's small charts are scaled to the values they show, whatever range rewards take."""

from __future__ import annotations

from pathlib import Path

from tests.tui.conftest import next_polls, press_for, rows
from tests.tui.synthetic import append_metrics, metrics_lines
from workbench.tui.format import SPARK_BLOCKS, spark_bounds, sparkline
from workbench.tui.screens.run_detail import RunDetailScreen
from workbench.tui.widgets.runs_table import RunsTable


def rewrite_rewards(run: Path, rewards: list[float]) -> None:
    """The run's metrics.jsonl again, with these rewards at steps 1, 2, ..."""
    lines = metrics_lines(1, len(rewards) + 1, reward0=0.0, slope=0.0)
    for line in lines:
        if line["source"] == "orchestrator":
            line["reward_mean"] = rewards[line["step"] - 1]
    (run / "metrics.jsonl").write_text("")
    append_metrics(run, lines)


def test_sparklines_of_rewards_close_together_fill_the_blocks():
    rewards = [0.80, 0.82, 0.84, 0.85, 0.87]
    low, high = spark_bounds([rewards], 10)
    assert sparkline(rewards, 10, low=low, high=high) == "▁▃▅▆█"
    assert spark_bounds([[0.1] * 20 + [0.5], [2.0, float("nan")]], 10) == (0.1, 2.0)
    assert spark_bounds([[], []], 10) is None


async def test_the_runs_trend_spans_the_rewards_the_rows_show(experiment, make_app):
    rewrite_rewards(experiment / "run_lr1e-3", [0.80, 0.81, 0.83, 0.85, 0.87])
    rewrite_rewards(experiment / "run_lr3e-4", [0.80, 0.80, 0.80])
    app = make_app(experiment)
    async with app.run_test(size=(80, 24)) as pilot:
        await next_polls(pilot, app)
        trend = rows(app, RunsTable)
        assert trend["run_lr1e-3"]["trend"] == "▁▂▄▆█", "0.80 lowest, 0.87 full"
        assert trend["run_lr3e-4"]["trend"] == "▁▁▁", "the same scale in every row"

        # A reward above 1 (a reward function scoring out of 2) moves every row's scale.
        rewrite_rewards(experiment / "run_lr3e-4", [0.80, 1.30, 1.74])
        await next_polls(pilot, app)
        trend = rows(app, RunsTable)
        assert trend["run_lr3e-4"]["trend"] == "▁▅█"
        assert trend["run_lr1e-3"]["trend"] == "▁▁▁▁▂", "drawn again on the new scale"
        assert set(trend["run_lr1e-3"]["trend"]) <= set(SPARK_BLOCKS)


async def test_a_runs_reward_chart_spans_its_values_not_zero_to_one(experiment, make_app):
    rewrite_rewards(experiment / "run_lr1e-3", [0.80, 0.81, 0.83, 0.85, 0.87])
    rewrite_rewards(experiment / "run_lr3e-4", [-0.5, 0.2, 1.5])
    app = make_app(experiment)
    async with app.run_test(size=(80, 24)) as pilot:
        await next_polls(pilot, app)
        await press_for(pilot, "enter", RunDetailScreen)
        await next_polls(pilot, app)
        chart = app.screen.query_one("#reward-chart")
        lines = str(chart.render()).splitlines()
        # The axis: 0.87 and 0.80 widened by a tenth of their range (at least 0.01) each side.
        assert lines[1].split("│")[0].strip() == "0.88"
        assert lines[-1].split("│")[0].strip() == "0.79"

        await press_for(pilot, "escape", type(app.screen_stack[0]))
        await pilot.press("down")
        await press_for(pilot, "enter", RunDetailScreen)
        await next_polls(pilot, app)
        lines = str(app.screen.query_one("#reward-chart").render()).splitlines()
        assert lines[1].split("│")[0].strip() == "1.5", "values outside [0, 1] stay on it"
        assert lines[-1].split("│")[0].strip() == "-0.5"
