"""The runs list as researchers expect it: select (space), pin (p), filter (/), one colour
per run in every view, the selected runs' curves overlaid, smoothing (s on the curves).

Driven through real Textual with Pilot at 80x24 on synthetic experiment directories;
what the chart shows is checked against each run's metrics.jsonl read back here.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from rich.text import Text

from tests.tui.conftest import next_polls, press_for, rows, wait_until
from tests.tui.synthetic import append_metrics, build_sweep_experiment, make_run, metrics_lines
from tests.tui.test_curves_screen import charted, legend, recorded
from workbench.curves import RunColours, run_colours
from workbench.tui.screens.curves import SMOOTHING, CurvesScreen, ema
from workbench.tui.screens.main import MainScreen, RunsFilterInput
from workbench.tui.selection import FilterError, RunFilter, flatten
from workbench.tui.widgets.curves import RunsChart
from workbench.tui.widgets.runs_table import PINNED, SELECTED, UNSELECTED, RunsTable

SWEEP_RUNS = [
    "run_lr1e-2_rank8",
    "run_lr1e-3_rank8",
    "run_lr3e-2_rank8",
    "run_lr3e-3_rank4",
    "run_lr3e-4_rank4",
]


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    return build_sweep_experiment(tmp_path)


def table(app) -> RunsTable:
    return app.screen.query_one(RunsTable)


def shown_ids(app) -> list[str]:
    return list(rows(app, RunsTable))


def mark(app, run_id: str) -> Text:
    cell = table(app).get_cell(run_id, "mark")
    assert isinstance(cell, Text)
    return cell


async def loaded(pilot, app) -> None:
    await next_polls(pilot, app)
    await wait_until(pilot, lambda: table(app).row_count == 5, what="the runs")


async def move_to(pilot, app, run_id: str) -> None:
    table(app).select_key(run_id)
    await pilot.pause()


# ---------------------------------------------------------------- the filter syntax


def config_of(text: str) -> dict:
    import tomllib

    return flatten(tomllib.loads(text))


def test_a_filter_keeps_runs_by_id_text_and_by_config_values():
    config = config_of('lr = 1e-3\n[lora]\nrank = 8\n[loss]\nkind = "GRPO"\n')

    def keeps(text: str, run_id: str = "run_lr1e-3_rank8") -> bool:
        return RunFilter.parse(text).keeps(run_id, lambda _: config)

    assert keeps("lr1e") and keeps("RANK8") and not keeps("rank4")
    assert keeps("lr=0.001") and keeps("lr>5e-4") and keeps("lr<=1e-3") and not keeps("lr>1e-3")
    assert keeps("lora.rank>=8") and keeps("rank=8"), "a key matches the dotted key it ends"
    assert keeps("loss.kind=grpo") and keeps("kind!=ppo") and not keeps("kind=ppo")
    assert keeps("rank8 lr>5e-4") and not keeps("rank8 lr>5e-3"), "every term must hold"
    assert not keeps("seed=1"), "a run without the key fails the term"
    assert not keeps("ank=8"), "a key matches whole dotted parts only"


def test_a_filter_that_cannot_compare_says_which_term():
    with pytest.raises(FilterError, match=r"lr>fast: > compares numbers; 'fast' is not one"):
        RunFilter.parse("rank8 lr>fast")


# ---------------------------------------------------------------- colours


def test_a_runs_colour_comes_from_its_id_not_from_the_runs_beside_it():
    ids = [f"run_{i}" for i in range(10)]
    assert run_colours(ids) == run_colours(list(reversed(ids)))
    assert len(set(run_colours(ids).values())) == 10, "ten runs, ten colours of tab10"
    colours = RunColours()
    before = colours.assign(ids[:5])
    after = colours.assign(["run_new", *ids[:5]])
    assert {run_id: after[run_id] for run_id in before} == before, "a new run moves no colour"
    assert after["run_new"] not in before.values()
    alone = run_colours(["run_lr1e-3"])["run_lr1e-3"]
    assert run_colours(["run_lr1e-3", "zzz"])["run_lr1e-3"] == alone


async def test_each_run_has_one_colour_in_the_table_and_the_curves_through_polls_and_filters(
    sweep, make_app
):
    app = make_app(sweep)
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot, app)
        colours = {run_id: app.run_colour(run_id) for run_id in SWEEP_RUNS}
        assert colours == run_colours(SWEEP_RUNS), "the colours `workbench plot` gives"
        assert len(set(colours.values())) == 5
        for run_id in SWEEP_RUNS:
            assert str(mark(app, run_id).spans[0].style) == colours[run_id]
        # Filtered, polled again, a run added: no run changes colour.
        await pilot.press("slash", *"rank4", "enter")
        await wait_until(pilot, lambda: table(app).row_count == 2, what="the filter")
        make_run(sweep, "run_added")
        await next_polls(pilot, app)
        await pilot.press("escape")
        await wait_until(pilot, lambda: table(app).row_count == 6, what="every run again")
        for run_id in SWEEP_RUNS:
            assert str(mark(app, run_id).spans[0].style) == colours[run_id]
        assert app.run_colour("run_added") not in colours.values()
        await press_for(pilot, "c", CurvesScreen)
        chart = app.screen.query_one(RunsChart)
        await wait_until(pilot, lambda: len(chart.series) == 6, what="the curves")
        assert {s.run_id: s.colour for s in chart.series if s.run_id in colours} == colours


# ---------------------------------------------------------------- select, pin, filter


async def test_space_selects_the_run_under_the_cursor_and_again_unselects_it(sweep, make_app):
    app = make_app(sweep)
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot, app)
        assert app.selected_runs() == [] and app.plotted_runs() == SWEEP_RUNS
        await move_to(pilot, app, "run_lr3e-3_rank4")
        await pilot.press("space")
        await move_to(pilot, app, "run_lr1e-2_rank8")
        await pilot.press("space")
        await pilot.pause()
        assert app.selected_runs() == ["run_lr1e-2_rank8", "run_lr3e-3_rank4"], "table order"
        assert app.plotted_runs() == app.selected_runs()
        assert mark(app, "run_lr3e-3_rank4").plain == SELECTED + " "
        assert mark(app, "run_lr3e-4_rank4").plain == UNSELECTED + " "
        assert table(app).border_title == "runs · 2 selected"
        await pilot.press("space")
        await pilot.pause()
        assert app.selected_runs() == ["run_lr3e-3_rank4"]
        assert mark(app, "run_lr1e-2_rank8").plain == UNSELECTED + " "


async def test_p_pins_a_run_on_top_through_polls_and_again_unpins_it(sweep, make_app):
    app = make_app(sweep)
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot, app)
        await move_to(pilot, app, "run_lr3e-4_rank4")
        await pilot.press("p")
        await wait_until(pilot, lambda: shown_ids(app)[0] == "run_lr3e-4_rank4", what="pinned")
        assert table(app).selected_key == "run_lr3e-4_rank4", "the cursor follows the run"
        assert mark(app, "run_lr3e-4_rank4").plain == UNSELECTED + PINNED
        append_metrics(sweep / "run_lr1e-2_rank8", metrics_lines(11, 12, reward0=0.9, slope=0))
        await next_polls(pilot, app)
        assert shown_ids(app)[0] == "run_lr3e-4_rank4", "still on top after a poll"
        await pilot.press("p")
        await wait_until(pilot, lambda: shown_ids(app) == SWEEP_RUNS, what="back in place")


async def test_slash_filters_the_runs_by_id_or_config_and_escape_clears_it(sweep, make_app):
    app = make_app(sweep)
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot, app)
        await pilot.press("slash", *"rank8")
        line = app.screen.query_one(RunsFilterInput)
        assert line.display and line.has_focus
        await wait_until(pilot, lambda: table(app).row_count == 3, what="filtered as typed")
        await pilot.press("escape")  # in the filter line: clears it and closes it
        await wait_until(pilot, lambda: table(app).row_count == 5, what="the filter cleared")
        assert not line.display and table(app).has_focus

        await pilot.press("slash", *"lr>2e-3 lora.rank=8", "enter")
        await wait_until(pilot, lambda: table(app).row_count == 2, what="the config filter")
        assert shown_ids(app) == ["run_lr1e-2_rank8", "run_lr3e-2_rank8"]
        assert table(app).border_title == "runs · /lr>2e-3 lora.rank=8: 2 of 5"
        assert table(app).has_focus and not line.display, "enter keeps the filter, closes"
        assert app.plotted_runs() == ["run_lr1e-2_rank8", "run_lr3e-2_rank8"]
        await pilot.press("escape")  # on the table: clears the filter
        await wait_until(pilot, lambda: table(app).row_count == 5, what="every run again")


async def test_a_filter_that_cannot_compare_is_refused_naming_its_term(sweep, make_app):
    app = make_app(sweep)
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot, app)
        await pilot.press("slash", *"lr>fast", "enter")
        await pilot.pause()
        said = [n.message for n in app._notifications]
        assert any("lr>fast: > compares numbers" in message for message in said), said
        assert app.screen.query_one(RunsFilterInput).has_focus, "left open to be corrected"
        assert table(app).row_count == 5


async def test_slash_in_the_log_still_searches_the_log(sweep, make_app):
    app = make_app(sweep)
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot, app)
        await pilot.press("l", "slash")
        await pilot.pause()
        assert app.screen.query_one("#log-search").has_focus
        assert not app.screen.query_one(RunsFilterInput).display


# ---------------------------------------------------------------- curves


async def test_the_curves_overlay_the_selected_runs_or_else_the_filtered_ones(sweep, make_app):
    app = make_app(sweep)
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot, app)
        every = recorded(sweep, "reward_mean")
        for run_id in ("run_lr3e-3_rank4", "run_lr1e-2_rank8"):
            await move_to(pilot, app, run_id)
            await pilot.press("space")
        await press_for(pilot, "c", CurvesScreen)
        chart = app.screen.query_one(RunsChart)
        await wait_until(pilot, lambda: len(chart.series) == 2, what="the selected curves")
        assert charted(app) == {r: every[r] for r in ("run_lr1e-2_rank8", "run_lr3e-3_rank4")}
        assert "2 of 2 selected runs" in str(app.screen.query_one("#top-bar").content)
        assert "run_lr3e-4_rank4" not in legend(app)
        await press_for(pilot, "c", MainScreen)

        for run_id in ("run_lr3e-3_rank4", "run_lr1e-2_rank8"):  # none selected, a filter
            await move_to(pilot, app, run_id)
            await pilot.press("space")
        await pilot.press("slash", *"rank4", "enter")
        await press_for(pilot, "c", CurvesScreen)
        chart = app.screen.query_one(RunsChart)
        await wait_until(pilot, lambda: len(chart.series) == 2, what="the filtered curves")
        assert set(charted(app)) == {"run_lr3e-3_rank4", "run_lr3e-4_rank4"}
        assert "filtered runs" in str(app.screen.query_one("#top-bar").content)


def test_ema_is_debiased_and_leaves_a_constant_curve_alone():
    assert ema([(1, 0.5), (2, 0.5), (3, 0.5)], 0.6) == ((1, 0.5), (2, 0.5), (3, 0.5))
    smoothed = ema([(1, 0.0), (2, 1.0)], 0.6)
    assert smoothed[0] == (1, 0.0)
    assert smoothed[1][1] == pytest.approx(0.4 / (1 - 0.6**2))  # (0.6*0.4*0 + 0.4*1) / 0.64
    with_nan = ema([(1, 1.0), (2, math.nan), (3, 1.0)], 0.6)
    assert math.isnan(with_nan[1][1]) and with_nan[2] == (3, pytest.approx(1.0))


async def test_s_smooths_the_curves_and_again_shows_them_raw(sweep, make_app):
    app = make_app(sweep)
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot, app)
        await press_for(pilot, "c", CurvesScreen)
        chart = app.screen.query_one(RunsChart)
        await wait_until(pilot, lambda: len(chart.series) == 5, what="the curves")
        raw = recorded(sweep, "reward_mean")
        await pilot.press("s")
        await pilot.pause()
        smoothed = {run_id: list(ema(points, SMOOTHING)) for run_id, points in raw.items()}
        assert charted(app) == smoothed and charted(app) != raw
        assert f"EMA {SMOOTHING}" in str(app.screen.query_one("#top-bar").content)
        await next_polls(pilot, app)
        assert charted(app) == smoothed, "still smoothed after a poll"
        await pilot.press("s")
        await pilot.pause()
        assert charted(app) == raw


def test_a_term_without_its_value_is_refused_not_read_as_text():
    with pytest.raises(FilterError, match=r"lr>: a value is missing after >"):
        RunFilter.parse("lr>")
