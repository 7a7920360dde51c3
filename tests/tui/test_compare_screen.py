"""The all-experiments screen (`a` on the leaderboard): the runs of every experiment under
the same folder, ranked together as `workbench compare` ranks them, read-only.

The experiments are real directories, as `workbench up` writes them, with metrics written
by the orchestrator's writer; the app is the real one, driven by Pilot.
"""

from __future__ import annotations

from pathlib import Path

from tests.helpers import keep_trainer_checkpoint, make_experiment, record_evals
from tests.tui.conftest import footer_shown, press_for, rows, wait_until
from workbench.supervisor.fork import fork_run
from workbench.tui.screens.compare import CompareScreen, CompareTable
from workbench.tui.screens.leaderboard import LeaderboardScreen


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
    build_compared_experiments(tmp_path)
    app = make_app(tmp_path / "outputs" / "reverse_text")
    async with app.run_test(size=(120, 30)) as pilot:
        await open_all_experiments(pilot)
        shown = rows(app, CompareTable)
        assert [(key, row["group"], row["rank"], row["value"]) for key, row in shown.items()] == [
            ("chat/run_lr3e-3", "A", "1", "0.66"),
            ("reverse_text/run_lr1e-3_more", "B", "1", "0.87"),
            ("reverse_text_v2/run_lr3e-3", "B", "2", "0.84"),
            ("reverse_text/run_lr5e-3", "B", "3", "0.8"),
            ("reverse_text/run_lr3e-3", "B", "4", "0.76"),
        ]
        assert shown["reverse_text_v2/run_lr3e-3"]["values"].startswith("max_steps=30")
        assert shown["reverse_text/run_lr1e-3_more"]["from"] == "run_lr5e-3@20"
        await pilot.press("down")
        selected = str(app.screen.query_one("#compare-selected").content)
        assert f"of {tmp_path / 'outputs' / 'reverse_text'}" in selected
        assert "from: run_lr5e-3@20" in selected
        assert "differs: max_steps=40 batch_size=64 lr=0.001" in selected
        assert "a back" in await footer_shown(pilot, "a back")
        await press_for(pilot, "a", LeaderboardScreen)


async def test_the_view_is_read_only_and_names_the_groups_kept_apart(tmp_path: Path, make_app):
    build_compared_experiments(tmp_path)
    app = make_app(tmp_path / "outputs" / "reverse_text")
    async with app.run_test(size=(120, 30)) as pilot:
        await open_all_experiments(pilot)
        top = str(app.screen.query_one("#compare-top").content)
        assert "A: builtin:tiny-reverse-chat · reverse_text  (chat)" in top
        assert "B: builtin:tiny-reverse · reverse_text  (reverse_text, reverse_text_v2)" in top
        assert "ranked in 2 separate groups" in top
        await pilot.press("e", "r")  # evict and restart do nothing here
        await pilot.pause()
        assert isinstance(app.screen, CompareScreen)
        assert app.commands.sent == []
