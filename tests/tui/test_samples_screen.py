"""The rollout browser in the TUI: a run's recent steps, group by group, at 80x24.

Real Textual driven by Pilot over the synthetic experiment, with `samples.jsonl` written
through the orchestrator's own writer (`workbench.files.samples.record_step`).
"""

from __future__ import annotations

from pathlib import Path

from tests.tui.conftest import next_polls, wait_until
from workbench.files.samples import SampledCompletion, SampleGroup, StepSamples, record_step
from workbench.tui.screens.main import MainScreen
from workbench.tui.screens.run_detail import RunDetailScreen
from workbench.tui.screens.samples import SamplesScreen

RUN = "run_lr1e-3"  # the runs table's first row, selected when the TUI opens


def step_samples(step: int, *, written: bool = True) -> StepSamples:
    """Two groups: 'abc' scored by its completions' step-dependent rewards, 'xyz' flat."""
    varied = SampleGroup(
        prompt=f"reverse abc{step}",
        answer=f"{step}cba",
        completions=[
            SampledCompletion(f"{step}cba", 1.0, 0.5, False, 4),
            SampledCompletion(f"cba-{step}-long", 0.0, -0.5, True, 16),
        ],
    )
    flat = SampleGroup(
        prompt=f"reverse xyz{step}",
        answer=f"{step}zyx",
        completions=[SampledCompletion("zy", 0.5, 0.0, False, 2)] * 2,
    )
    return StepSamples(step, max(step - 1, 0), written, [varied, flat], time=1000.0 + step)


def top_bar(app) -> str:
    return str(app.screen.query_one("#top-bar").render())


def shown_group(app) -> str:
    return str(app.screen.query_one("#sample-group").render())


async def open_samples(pilot, app) -> SamplesScreen:
    await next_polls(pilot, app)
    await pilot.press("s")
    await wait_until(pilot, lambda: isinstance(app.screen, SamplesScreen), what="samples")
    return app.screen


async def test_samples_key_shows_the_newest_step_its_groups_and_histogram(experiment, make_app):
    run = experiment / RUN
    for step in range(3):
        record_step(run, step_samples(step))
    app = make_app(experiment)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_samples(pilot, app)
        await wait_until(pilot, lambda: "step 2" in top_bar(app), what="the newest step")
        assert screen.run_id == RUN and "(3/3)" in top_bar(app)
        table = screen.query_one("#sample-groups")
        assert table.row_count == 2
        assert [str(c) for c in table.get_row_at(0)][:3] == ["1", "0.50", "0.50"]
        histogram = str(screen.query_one("#sample-histogram").render())
        # 4 completions: one at 0.0, two at 0.5, one at 1.0.
        counts = [int(line.split()[-1]) for line in histogram.splitlines()]
        assert sum(counts) == 4 and counts[0] == 1 and counts[-1] == 1
        # The first group's completions, best first, the cut one marked.
        text = shown_group(app)
        assert text.index("2cba") < text.index("cba-2-long")
        assert "cut at max_tokens" in text and "+0.50" in text

        await pilot.press("down")
        await wait_until(pilot, lambda: "reverse xyz2" in shown_group(app), what="group 2")


async def test_older_steps_stay_shown_while_new_ones_arrive_until_end(experiment, make_app):
    run = experiment / RUN
    for step in range(2):
        record_step(run, step_samples(step))
    app = make_app(experiment)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_samples(pilot, app)
        await wait_until(pilot, lambda: "step 1" in top_bar(app), what="the newest step")
        await pilot.press("left")
        assert "step 0 (1/2)" in top_bar(app) and "reverse abc0" in shown_group(app)
        await pilot.press("left")  # already the oldest kept
        assert "step 0 (1/2)" in top_bar(app)

        record_step(run, step_samples(2, written=False))
        await next_polls(pilot, app)
        assert "step 0 (1/3)" in top_bar(app)
        await pilot.press("end")
        assert "step 2 (3/3)" in top_bar(app) and "dropped" in top_bar(app)
        await pilot.press("escape")
        await wait_until(pilot, lambda: isinstance(app.screen, MainScreen), what="main screen")


async def test_a_run_without_samples_says_so_and_detail_opens_the_browser(
    experiment: Path, make_app
):
    app = make_app(experiment)
    async with app.run_test(size=(80, 24)) as pilot:
        await next_polls(pilot, app)
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, RunDetailScreen), what="detail")
        await pilot.press("s")
        await wait_until(pilot, lambda: isinstance(app.screen, SamplesScreen), what="samples")
        await wait_until(
            pilot, lambda: "no samples recorded yet" in shown_group(app), what="the empty note"
        )
        assert "no samples yet" in top_bar(app)
