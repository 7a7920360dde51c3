"""How values are written in cells: short, stable, and never wider than their column."""

from __future__ import annotations

import pytest

from workbench.tui.format import format_age, format_count, sparkline
from workbench.tui.widgets.curves import (
    BrailleCanvas,
    braille_plot,
    padded_range,
    resample,
    resample_by_step,
    step_columns,
)
from workbench.tui.widgets.keyed_table import shorten_middle


def test_ages_count_back_from_the_clock():
    assert format_age(100.0, now=107.5) == "7s ago"
    assert format_age(None, now=1.0) == "-"


@pytest.mark.parametrize(
    ("count", "text"), [(0, "0"), (950, "950"), (12_300, "12.3k"), (4_560_000, "4.56M")]
)
def test_counts_are_abbreviated(count, text):
    assert format_count(count) == text


def test_sparkline_uses_fixed_bounds_so_rows_compare():
    assert sparkline([0.0, 0.5, 1.0], 10, low=0.0, high=1.0) == "▁▅█"
    assert sparkline([0.2] * 20, 10, low=0.0, high=1.0) == "▂" * 10, "the last `width` values"
    assert sparkline([], 10) == ""
    assert sparkline([3.0, 3.0], 5) == "▄▄", "a flat series without bounds sits mid-height"


def test_braille_plot_draws_a_connected_line_within_its_box():
    rows = braille_plot([0.0, 1.0, 0.0], width=10, height=3, low=0.0, high=1.0)
    assert len(rows) == 3 and all(len(row) == 10 for row in rows)
    assert all(0x2800 <= ord(ch) <= 0x28FF for row in rows for ch in row)
    assert all(any(ch != "\u2800" for ch in row) for row in rows), "every row is crossed"
    assert braille_plot([1.0], width=0, height=3, low=0, high=1) == []


def test_resample_keeps_the_shape():
    assert resample([0.0, 1.0], 3) == [0.0, 0.5, 1.0]
    assert resample([1.0, 3.0, 5.0, 7.0], 2) == [2.0, 6.0]


def test_long_names_are_shortened_in_the_middle():
    assert shorten_middle("run_sweep_lr01_seed3", 14) == "run_sw…1_seed3"  # 14 cells
    assert shorten_middle("run_a", 14) == "run_a"


def test_resample_by_step_places_each_point_at_its_step():
    # Evals at steps 0, 5 and 20: the rise happens in the first quarter of the width.
    assert resample_by_step([(0, 0.0), (5, 1.0), (20, 1.0)], 5) == [0.0, 1.0, 1.0, 1.0, 1.0]
    assert resample_by_step([(0, 0.0), (20, 1.0)], 3) == [0.0, 0.5, 1.0]
    assert resample_by_step([(10, 0.4)], 3) == [0.4, 0.4, 0.4]
    assert resample_by_step([], 3) == []


def test_a_run_sits_on_the_step_axis_only_where_it_has_steps():
    # On an axis of steps 0-20 across 21 dot columns, a run of steps 10-20 takes the right
    # half, linear between its points.
    columns = step_columns([(10, 0.0), (20, 1.0)], dots=21, first=0, last=20)
    assert [x for x, _ in columns] == list(range(10, 21))
    assert columns[0] == (10, 0.0) and columns[5] == (15, 0.5) and columns[-1] == (20, 1.0)
    assert step_columns([], dots=21, first=0, last=20) == []


def test_each_cell_takes_the_colour_of_the_last_run_drawn_through_it():
    canvas = BrailleCanvas(width=4, height=1)
    canvas.draw_line([(x, 0.0) for x in range(8)], low=0.0, high=1.0, series=0)  # all along
    canvas.draw_line([(x, 0.0) for x in range(4, 8)], low=0.0, high=1.0, series=1)  # right half
    (row,) = canvas.styled_rows(["red", "blue"])
    assert [str(span.style) for span in row.spans] == ["red", "red", "blue", "blue"]


def test_the_runs_axis_spans_the_curves_shown_not_the_whole_reward_range():
    low, high = padded_range([0.65, 0.72, 0.80], 0.0, 1.0)
    assert low == pytest.approx(0.635) and high == pytest.approx(0.815)
    # near a bound, the axis stops at it; a value beyond a bound is still shown
    assert padded_range([0.2, 0.99], 0.0, 1.0) == (pytest.approx(0.121), 1.0)
    assert padded_range([-0.5, 0.5], 0.0, 1.0)[0] == -0.5
    # a flat curve still gets an axis of its own
    assert padded_range([0.7, 0.7], 0.0, 1.0) == (pytest.approx(0.69), pytest.approx(0.71))


def test_a_runs_sparkline_takes_in_rewards_outside_0_1():
    # A verifiers rubric's weighted sum may leave [0, 1]: the table's scale takes it in.
    from workbench.tui.data import RunView
    from workbench.tui.format import spark_bounds
    from workbench.tui.widgets.runs_table import SPARK_WIDTH, _still_cells

    runs = [
        RunView(id="a", status="running", step=3, rewards=(0.0, 1.0, 1.5)),
        RunView(id="b", status="running", step=3, rewards=(-1.0, 0.0, 0.5)),
    ]
    scale = spark_bounds([run.rewards for run in runs], SPARK_WIDTH)
    assert scale == (-1.0, 1.5)
    trends = [_still_cells(run, scale)["trend"].plain for run in runs]
    assert trends[0][-1] == "█" and trends[1][0] == "▁", "1.5 tops the scale, -1 is its floor"
    assert trends[0][1] != "█", "1.0 is not drawn as the top"
