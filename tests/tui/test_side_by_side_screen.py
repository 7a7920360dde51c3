"""The side-by-side screen (`v`) and the playground (`A`) at 80x24, keyboard only.

Real Textual driven by Pilot over the synthetic experiment; the eval records are written
through the evaluator's own writer (`workbench.files.eval_samples.record_eval`). The
playground's answers from a real vLLM are tests/inference/test_ask.py.
"""

from __future__ import annotations

from pathlib import Path

from tests.tui.conftest import next_polls, wait_until
from workbench.files.eval_samples import EvalCompletion, EvalPrompt, EvalSamples, record_eval
from workbench.tui.screens.playground import PlaygroundScreen
from workbench.tui.screens.side_by_side import SideBySideScreen

FAST, SLOW = "run_lr1e-3", "run_lr3e-4"
PROMPTS = ("abc", "hello")


def record(run: Path, version: int, good: bool) -> None:
    prompts = [
        EvalPrompt(p, p[::-1], [EvalCompletion(p[::-1] if good else p, float(good), False)])
        for p in PROMPTS
    ]
    record_eval(run, EvalSamples(version, f"{run.name}@step{version}", prompts))


def columns(screen) -> list[str]:
    return [str(column.label) for column in screen.query_one("#sbs-table").columns.values()]


def top_bar(app) -> str:
    return str(app.screen.query_one("#top-bar").render())


async def test_v_shows_each_prompt_with_every_runs_completion_and_reward(experiment, make_app):
    for version in (0, 10):
        record(experiment / FAST, version, good=version > 0)
    record(experiment / SLOW, 0, good=False)
    app = make_app(experiment)
    async with app.run_test(size=(80, 24)) as pilot:
        await next_polls(pilot, app)
        await pilot.press("v")
        await wait_until(pilot, lambda: isinstance(app.screen, SideBySideScreen), what="screen")
        screen = app.screen
        # The newest step both runs have: 0 (SLOW has no eval of 10).
        await wait_until(pilot, lambda: "held-out eval of step 0" in top_bar(app), what="step")
        assert columns(screen) == ["#", "prompt", f"{FAST} 0.00", f"{SLOW} 0.00"]
        table = screen.query_one("#sbs-table")
        assert table.row_count == len(PROMPTS)
        assert [str(c) for c in table.get_row_at(1)][1:] == ["hello", "0.00 hello", "0.00 hello"]
        assert "answer olleh" not in str(screen.query_one("#sbs-prompt").render())
        await pilot.press("down")
        await pilot.pause()
        assert "answer olleh" in str(screen.query_one("#sbs-prompt").render())

        # Untick SLOW (tab to the list, down to it, space): FAST alone, at its newest step.
        await pilot.press("shift+tab")
        assert screen.query_one("#sbs-runs").has_focus
        await pilot.press("home", "down", "space")
        await wait_until(pilot, lambda: "step 10" in top_bar(app), what="FAST's newest step")
        assert columns(screen) == ["#", "prompt", f"{FAST} 1.00"]
        await pilot.press("left_square_bracket")
        await wait_until(pilot, lambda: "step 0" in top_bar(app), what="the older step")
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, SideBySideScreen), what="back")


async def test_runs_without_a_shared_step_are_said_so(experiment, make_app):
    record(experiment / FAST, 10, good=True)
    record(experiment / SLOW, 0, good=False)
    app = make_app(experiment)
    async with app.run_test(size=(80, 24)) as pilot:
        await next_polls(pilot, app)
        await pilot.press("v")
        await wait_until(pilot, lambda: isinstance(app.screen, SideBySideScreen), what="screen")
        await wait_until(pilot, lambda: "not every run" in top_bar(app), what="the reason")


async def test_A_opens_the_playground_and_without_a_server_says_so(experiment, make_app):
    app = make_app(experiment)
    async with app.run_test(size=(80, 24)) as pilot:
        await next_polls(pilot, app)
        await pilot.press("A")
        await wait_until(pilot, lambda: isinstance(app.screen, PlaygroundScreen), what="screen")
        assert app.screen.query_one("#play-prompt").has_focus
        await pilot.press(*"hi", "enter")
        await wait_until(pilot, lambda: "no inference server" in top_bar(app), what="why")
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, PlaygroundScreen), what="back")
