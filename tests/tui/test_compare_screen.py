"""The all-experiments screen (`a` on the leaderboard): the runs of every experiment under
the same folder, ranked together as `workbench compare` ranks them, read-only.

The experiments are real directories, as `workbench up` writes them, with metrics written
by the orchestrator's writer; the app is the real one, driven by Pilot.
"""

from __future__ import annotations

from pathlib import Path

from tests.helpers import keep_trainer_checkpoint, make_experiment, record_evals
from tests.tui.conftest import footer_shown, press_for, rows, wait_until
from workbench.commands.fork import fork_run
from workbench.tui.screens.compare import CompareScreen, CompareTable
from workbench.tui.screens.leaderboard import LeaderboardScreen


def two_weeks(root: Path) -> tuple[Path, Path]:
    last_week = make_experiment(
        root,
        "last_week",
        "lr = 3e-3",
        '[[runs]]\nid = "lr3e-3"\n\n[[runs]]\nid = "lr5e-3"\nlr = 5e-3\n',
    )
    record_evals(last_week, "run_lr3e-3", (0, 0.4), (10, 0.7))
    record_evals(last_week, "run_lr5e-3", (0, 0.4), (10, 0.75))
    this_week = make_experiment(root, "this_week", "lr = 1e-3", '[[runs]]\nid = "lr1e-3"\n')
    record_evals(this_week, "run_lr1e-3", (0, 0.4), (10, 0.8))
    return last_week, this_week


def build_compared_experiments(root: Path) -> None:
    """Three experiments under root/outputs, for the screenshot: reverse_text (two runs and
    a fork of one), reverse_text_v2 (one run, batch size 32) and chat (another base
    model, so ranked apart)."""
    first = make_experiment(
        root,
        "reverse_text",
        "lr = 3e-3",
        '[[runs]]\nid = "lr3e-3"\n\n[[runs]]\nid = "lr5e-3"\nlr = 5e-3\n',
    )
    record_evals(first, "run_lr3e-3", (0, 0.61), (10, 0.7), (20, 0.76))
    record_evals(first, "run_lr5e-3", (0, 0.61), (10, 0.72), (20, 0.8))
    keep_trainer_checkpoint(first, "run_lr5e-3", 20)
    fork_run(first, "run_lr5e-3@20", "lr1e-3_more", {"lr": 1e-3, "max_steps": 40})
    record_evals(first, "run_lr1e-3_more", (30, 0.85), (40, 0.87))
    second = make_experiment(
        root, "reverse_text_v2", "lr = 3e-3\nbatch_size = 32", '[[runs]]\nid = "lr3e-3"\n'
    )
    record_evals(second, "run_lr3e-3", (0, 0.61), (10, 0.78), (20, 0.84))
    chat = make_experiment(
        root, "chat", "lr = 3e-3", '[[runs]]\nid = "lr3e-3"\n', base="builtin:tiny-reverse-chat"
    )
    record_evals(chat, "run_lr3e-3", (0, 0.5), (10, 0.66))


async def open_all_experiments(pilot) -> None:
    await press_for(pilot, "b", LeaderboardScreen)
    await press_for(pilot, "a", CompareScreen)
    table = pilot.app.screen.query_one(CompareTable)
    await wait_until(pilot, lambda: table.row_count > 0, what="the compared runs")
    await pilot.pause()


async def test_a_on_the_leaderboard_ranks_the_runs_of_every_experiment_beside_it(
    tmp_path: Path, make_app
):
    last_week, _ = two_weeks(tmp_path)
    app = make_app(last_week)
    async with app.run_test(size=(120, 30)) as pilot:
        await open_all_experiments(pilot)
        shown = rows(app, CompareTable)
        assert list(shown) == [
            "this_week/run_lr1e-3",
            "last_week/run_lr5e-3",
            "last_week/run_lr3e-3",
        ]
        assert [(row["rank"], row["value"], row["values"]) for row in shown.values()] == [
            ("1", "0.8", "lr=0.001"),
            ("2", "0.75", "lr=0.005"),
            ("3", "0.7", "lr=0.003"),
        ]
        selected = str(app.screen.query_one("#compare-selected").content)
        assert f"of {tmp_path / 'outputs' / 'this_week'}" in selected
        assert "a back" in await footer_shown(pilot, "a back")
        await press_for(pilot, "a", LeaderboardScreen)


async def test_the_view_is_read_only_and_names_the_groups_kept_apart(tmp_path: Path, make_app):
    last_week, _ = two_weeks(tmp_path)
    chat = make_experiment(
        tmp_path, "chat", "lr = 3e-3", '[[runs]]\nid = "a"\n', base="builtin:tiny-reverse-chat"
    )
    record_evals(chat, "run_a", (0, 0.9))
    app = make_app(last_week)
    async with app.run_test(size=(120, 30)) as pilot:
        await open_all_experiments(pilot)
        shown = rows(app, CompareTable)
        assert (shown["chat/run_a"]["group"], shown["chat/run_a"]["rank"]) == ("A", "1")
        assert shown["this_week/run_lr1e-3"]["group"] == "B"
        top = str(app.screen.query_one("#compare-top").content)
        assert "A: builtin:tiny-reverse-chat · reverse_text" in top
        assert "ranked in 2 separate groups" in top
        await pilot.press("e", "r")  # evict and restart do nothing here
        await pilot.pause()
        assert isinstance(app.screen, CompareScreen)
        assert app.commands.sent == []
