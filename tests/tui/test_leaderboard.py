"""The leaderboard: runs ranked as `workbench sweep report` ranks them, marked as they ended.

Driven through real Textual with Pilot on synthetic experiment directories
(`tests/tui/synthetic.py`): a sweep part-way under ASHA, and the plain four-run experiment
without a sweep.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.tui.conftest import (
    footer_fits,
    footer_shown,
    next_polls,
    press_for,
    rows,
    wait_until,
)
from tests.tui.synthetic import (
    STOPPED_EARLY_REASON,
    append_metrics,
    build_sweep_experiment,
    eval_lines,
    rung_result,
    write_json,
)
from workbench.files import run_control
from workbench.sweep.report import build_report
from workbench.tui.format import sparkline
from workbench.tui.screens.evict import EvictScreen
from workbench.tui.screens.leaderboard import LeaderboardScreen
from workbench.tui.screens.main import MainScreen
from workbench.tui.screens.run_detail import RunDetailScreen
from workbench.tui.widgets.leaderboard_table import LeaderboardTable
from workbench.tui.widgets.runs_table import SPARK_WIDTH

RANKED = [
    "run_lr1e-2_rank8",  # 0.70 at step 10, active
    "run_lr3e-3_rank4",  # 0.66 at step 20, finished
    "run_lr3e-4_rank4",  # 0.31 at step 5, stopped early at rung 0
    "run_lr3e-2_rank8",  # 0.30 at step 0, evicted by hand
    "run_lr1e-3_rank8",  # no eval yet, waiting
]


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    return build_sweep_experiment(tmp_path)


async def open_leaderboard(pilot, app) -> LeaderboardTable:
    await next_polls(pilot, app)
    await press_for(pilot, "b", LeaderboardScreen)
    table = app.screen.query_one(LeaderboardTable)
    await wait_until(pilot, lambda: table.row_count > 0, what="the leaderboard's rows")
    return table


def selected_text(app) -> str:
    return str(app.screen.query_one("#leaderboard-selected").content)


def recorded_evals(run: Path) -> list[float]:
    """eval_reward_mean of the run's eval records, by step, straight from metrics.jsonl."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = sorted((r["step"], r["eval_reward_mean"]) for r in records if r["source"] == "eval")
    return [value for _, value in evals]


async def test_b_switches_to_the_leaderboard_and_back(sweep, make_app):
    app = make_app(sweep)
    async with app.run_test(size=(80, 24)) as pilot:
        await next_polls(pilot, app)
        await footer_shown(pilot, "b ranks")
        assert footer_fits(app), "every key of the main screen's footer fits in 80 columns"
        await open_leaderboard(pilot, app)
        await footer_shown(pilot, "b back")
        await press_for(pilot, "b", MainScreen)
        await press_for(pilot, "b", LeaderboardScreen)
        await press_for(pilot, "escape", MainScreen)


async def test_runs_are_ranked_only_while_the_leaderboard_is_open(sweep, make_app):
    # Ranking is the part of a poll that grows with the runs: the main screen, shown all
    # day in a sweep of hundreds, must not pay for it.
    app = make_app(sweep)
    async with app.run_test(size=(160, 48)) as pilot:
        await next_polls(pilot, app)
        assert app.snapshot.leaderboard is None
        await open_leaderboard(pilot, app)
        assert list(rows(app, LeaderboardTable)) == RANKED
        await press_for(pilot, "escape", MainScreen)
        await next_polls(pilot, app)
        assert app.snapshot.leaderboard is None


async def test_runs_are_ranked_by_their_last_eval_as_the_sweep_report_ranks_them(sweep, make_app):
    app = make_app(sweep)
    async with app.run_test(size=(160, 48)) as pilot:
        await open_leaderboard(pilot, app)
        shown = rows(app, LeaderboardTable)
        assert list(shown) == RANKED
        assert list(shown) == [run.id for run in build_report(sweep).runs]
        assert [row["rank"] for row in shown.values()] == ["1", "2", "3", "4", "5"]
        assert [(row["value"], row["value_step"]) for row in shown.values()] == [
            ("0.7", "10"),
            ("0.66", "20"),
            ("0.31", "5"),
            ("0.3", "0"),
            ("-", "-"),
        ]
        assert [row["rung"] for row in shown.values()] == ["1", "1", "0", "-", "-"]
        assert shown["run_lr1e-2_rank8"]["values"] == "lr=0.01 lora.rank=8"
        assert shown["run_lr3e-3_rank4"]["values"] == "defaults"
        assert app.screen.query_one(LeaderboardTable).border_title == (
            "runs by eval_reward_mean, highest first"
        )


async def test_early_stopping_eviction_by_hand_and_finishing_are_told_apart(sweep, make_app):
    app = make_app(sweep)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_leaderboard(pilot, app)
        states = {run_id: row["state"] for run_id, row in rows(app, LeaderboardTable).items()}
        assert states == {
            "run_lr1e-2_rank8": "active",
            "run_lr3e-3_rank4": "finished",
            "run_lr3e-4_rank4": "early-stop",
            "run_lr3e-2_rank8": "evicted",
            "run_lr1e-3_rank8": "waiting",
        }
        assert "1 stopped early · 1 evicted" in str(app.screen.query_one("#top-bar").content)

        # Down the rows: below the table, why each one stopped.
        for presses, said in (
            (2, f"stopped early: {STOPPED_EARLY_REASON}"),
            (1, "evicted by tui: loss diverged"),
            (1, "note: no eval records"),
        ):
            await pilot.press(*["down"] * presses)
            await wait_until(pilot, lambda said=said: said in selected_text(app), what=said)


async def test_a_run_that_diverged_ranks_last_and_says_why(sweep, make_app):
    why = "diverged: gradient norm nan at updates 3-5; try a lower lr in a new run"
    run_control.write_eviction(sweep / "run_lr1e-2_rank8", why, by="trainer")
    app = make_app(sweep)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_leaderboard(pilot, app)
        shown = rows(app, LeaderboardTable)
        assert list(shown) == [*RANKED[1:], "run_lr1e-2_rank8"]
        assert list(shown) == [run.id for run in build_report(sweep).runs]
        assert shown["run_lr1e-2_rank8"]["state"] == "diverged"
        assert "1 evicted · 1 diverged" in str(app.screen.query_one("#top-bar").content)
        await pilot.press(*["down"] * 4)
        await wait_until(pilot, lambda: why in selected_text(app), what="its reason")


async def test_each_sparkline_draws_the_runs_eval_records_on_one_scale(sweep, make_app):
    app = make_app(sweep)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_leaderboard(pilot, app)
        curves = {run_id: row["curve"] for run_id, row in rows(app, LeaderboardTable).items()}
    recorded = {run_id: recorded_evals(sweep / run_id) for run_id in RANKED}
    every = [value for values in recorded.values() for value in values]
    for run_id, values in recorded.items():
        expected = sparkline(values, SPARK_WIDTH, low=min(every), high=max(every))
        assert curves[run_id] == expected, run_id
    # The same, spelled out: 0.30 is the bottom of the scale and 0.70 its top.
    assert curves["run_lr1e-2_rank8"] == "▁▅█"
    assert curves["run_lr3e-4_rank4"] == "▁▁"
    assert curves["run_lr1e-3_rank8"] == ""


async def test_the_ranking_follows_new_eval_records_and_config_changes(sweep, make_app):
    app = make_app(sweep)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_leaderboard(pilot, app)
        table = app.screen.query_one(LeaderboardTable)
        table.select_key("run_lr1e-3_rank8")

        append_metrics(sweep / "run_lr1e-3_rank8", eval_lines([(5, 0.9)]))
        orch = sweep / "run_lr1e-3_rank8" / "control" / "orch.toml"
        orch.write_text(orch.read_text().replace("lr = 0.001", "lr = 0.002"))
        await next_polls(pilot, app)

        shown = rows(app, LeaderboardTable)
        assert list(shown) == ["run_lr1e-3_rank8", *RANKED[:-1]]
        assert shown["run_lr1e-3_rank8"]["rank"] == "1"
        assert shown["run_lr1e-3_rank8"]["value"] == "0.9"
        assert shown["run_lr1e-3_rank8"]["values"] == "lr=0.002 lora.rank=8"
        assert table.selected_key == "run_lr1e-3_rank8", "the cursor stays on its run"


async def test_a_new_early_stopping_decision_shows_at_the_next_poll(sweep, make_app):
    app = make_app(sweep)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_leaderboard(pilot, app)
        run = sweep / "run_lr1e-3_rank8"
        append_metrics(run, eval_lines([(0, 0.3), (5, 0.2)]))
        asha = json.loads((sweep / "sweep" / "asha.json").read_text())
        asha["results"].append(rung_result("run_lr1e-3_rank8", 0, 0.2, 4, 4, 0.43, "stop"))
        write_json(sweep / "sweep" / "asha.json", asha)
        run_control.write_eviction(
            run, "asha rung 0 (step 5): eval_reward_mean 0.2 < ...", by="asha"
        )
        await next_polls(pilot, app)
        shown = rows(app, LeaderboardTable)["run_lr1e-3_rank8"]
        assert (shown["state"], shown["rung"], shown["value"]) == ("early-stop", "0", "0.2")
        assert "2 stopped early" in str(app.screen.query_one("#top-bar").content)


async def test_at_80x24_every_row_and_column_fits_and_ids_are_whole(sweep, make_app):
    app = make_app(sweep)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_leaderboard(pilot, app)
        table = app.screen.query_one(LeaderboardTable)
        widths = {column.key.value: column.width for column in table.ordered_columns}
        assert widths["id"] >= max(len(run_id) for run_id in RANKED)  # not shortened
        assert widths["state"] >= len("early-stop")
        padding = 2 * table.cell_padding * len(widths)
        assert sum(widths.values()) + padding <= table.region.width - 1  # and the scrollbar
        assert table.region.height >= len(RANKED) + 2  # every row, under border and header
        keys = await footer_shown(pilot, "b back")
        assert keys == [
            "b back",
            "c curves",
            "e evict",
            "r restart",
            "f fit/last",
            "a all exps",
            "q quit",
            "? help",
        ]
        assert footer_fits(app)


async def test_enter_opens_the_run_detail_with_its_eval_curve(sweep, make_app):
    app = make_app(sweep)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_leaderboard(pilot, app)
        await pilot.press("down")
        await press_for(pilot, "enter", RunDetailScreen)
        assert app.screen.run_id == "run_lr3e-3_rank4"
        chart = app.screen.query_one("#eval-chart")
        await wait_until(pilot, lambda: chart.points, what="the eval chart's points")
        assert chart.points == ((0, 0.30), (5, 0.56), (10, 0.60), (20, 0.66))
        assert "eval 0.660 at step 20" in str(app.screen.query_one("#detail-summary").content)
        assert "last 0.66 at step 20" in str(chart.render())
        await press_for(pilot, "escape", LeaderboardScreen)


async def test_evict_from_the_leaderboard_acts_on_the_selected_run(sweep, make_app, commands):
    app = make_app(sweep)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_leaderboard(pilot, app)
        await press_for(pilot, "e", EvictScreen)
        assert app.screen.run_id == "run_lr1e-2_rank8"
        await pilot.press(*"plateau", "enter")
        await wait_until(pilot, lambda: commands.sent, what="the evict command")
        assert run_control.read_eviction(sweep / "run_lr1e-2_rank8").evicted_by == "tui"
        await next_polls(pilot, app)
        assert isinstance(app.screen, LeaderboardScreen)
        assert rows(app, LeaderboardTable)["run_lr1e-2_rank8"]["state"] == "evicted"


async def test_without_a_sweep_runs_with_eval_records_rank_first(experiment, make_app):
    append_metrics(experiment / "run_lr3e-4", eval_lines([(0, 0.2), (5, 0.4)]))
    app = make_app(experiment)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_leaderboard(pilot, app)
        shown = rows(app, LeaderboardTable)
        assert list(shown) == ["run_lr3e-4", "run_lr1e-3", "run_queued", "run_typo"]
        assert (shown["run_lr3e-4"]["value"], shown["run_lr3e-4"]["value_step"]) == ("0.4", "5")
        assert [row["value"] for row in list(shown.values())[1:]] == ["-", "-", "-"]
        assert [row["rung"] for row in shown.values()] == ["-"] * 4
        assert shown["run_typo"]["state"] == "rejected"
        assert app.screen.query_one(LeaderboardTable).border_title == (
            "runs by eval_reward_mean, highest first"
        )


async def test_f_ranks_by_the_asymptote_of_reliable_fits_as_sweep_report_by_asymptote(
    sweep, make_app
):
    """run_lr3e-3_rank4's last eval (0.69) is below the leader's (0.70), but its curve has
    levelled off into a reliable fit; the leader's three evals make no reliable fit yet."""
    finished = sweep / "run_lr3e-3_rank4"
    append_metrics(finished, eval_lines([(30, 0.68), (40, 0.69), (50, 0.69)]))
    app = make_app(sweep)
    async with app.run_test(size=(160, 48)) as pilot:
        table = await open_leaderboard(pilot, app)
        assert list(rows(app, LeaderboardTable))[:2] == ["run_lr1e-2_rank8", "run_lr3e-3_rank4"]
        await footer_shown(pilot, "f fit/last")
        await pilot.press("f")
        await wait_until(
            pilot,
            lambda: next(iter(rows(app, LeaderboardTable))) == "run_lr3e-3_rank4",
            what="the ranking by asymptote",
        )
        by_fit = build_report(sweep, by="asymptote")
        assert list(rows(app, LeaderboardTable)) == [run.id for run in by_fit.runs]
        assert table.border_title.startswith("runs by asymptote of eval_reward_mean's fit")
        table.move_cursor(row=0)
        await wait_until(
            pilot,
            lambda: "fit: asymptote 0.7515, midpoint step 3 (reliable)" in selected_text(app),
            what="the selected run's fit",
        )
        table.move_cursor(row=1)
        await wait_until(
            pilot,
            lambda: "not reliable: 2 evals after version 0" in selected_text(app),
            what="why the leader's fit is not reliable",
        )
        await pilot.press("f")
        await wait_until(
            pilot,
            lambda: next(iter(rows(app, LeaderboardTable))) == "run_lr1e-2_rank8",
            what="the ranking by last value again",
        )
        assert "fit:" not in selected_text(app)
        assert table.border_title == "runs by eval_reward_mean, highest first"
