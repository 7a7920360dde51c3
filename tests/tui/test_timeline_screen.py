"""The timeline screen: `t` shows each process's last minute, a character a second coloured by
its activity, vLLM's row from the runs' requests, at 80x24; `t` goes back."""

from __future__ import annotations

from pathlib import Path

from tests.tui.conftest import press_for
from tests.tui.synthetic import FROZEN_NOW
from workbench.files import layout
from workbench.files.busy import BUSY, STARTING, WAITING, Interval, Recorder
from workbench.tui.screens.main import MainScreen
from workbench.tui.screens.timeline import TimelineScreen, timeline_row


def test_a_row_is_a_character_a_second_the_activity_that_covered_most_of_it():
    now = 1000.0
    row = timeline_row(
        [
            Interval("starting", STARTING, 945.0, 950.0),
            Interval("scoring and writing", BUSY, 950.0, 950.3),
            Interval("generation", BUSY, 950.3, 970.0),
            Interval("waiting for adapter", WAITING, 970.0, 980.0),
            Interval("loading adapter", BUSY, 980.0, 982.0),
            Interval("update", BUSY, 982.0, 1000.0),
        ],
        now,
    )
    assert row.plain == " " * 5 + "~" * 5 + "G" * 20 + "·" * 10 + "LL" + "U" * 18
    assert {span.style for span in row.spans} >= {"green", "magenta", "yellow", "blue"}


def record(experiment: Path, process: str, marks: list[tuple[float, str, str]]) -> None:
    """A busy record of this (live) process: `marks` are (seconds before FROZEN_NOW, label,
    kind), each lasting until the next."""
    clock = _Clock(FROZEN_NOW + marks[0][0])
    recorder = Recorder(
        layout.busy_path(experiment, process), process, started_at=clock.now - 1, clock=clock
    )
    for at, label, kind in marks:
        clock.now = FROZEN_NOW + at
        recorder.push(label, kind)
    clock.now = FROZEN_NOW
    recorder.flush()


class _Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def test_t_shows_every_process_last_minute_at_80x24(experiment, make_app):
    layout.busy_dir(experiment).mkdir(parents=True, exist_ok=True)
    record(experiment, "trainer", [(-50, "waiting for rollouts", WAITING), (-20, "update", BUSY)])
    record(
        experiment,
        "run_lr1e-3",
        [(-40, "generation", BUSY), (-10, "scoring and writing", BUSY)],
    )
    app = make_app(experiment)
    async with app.run_test(size=(80, 24)) as pilot:
        await press_for(pilot, "t", TimelineScreen)
        await pilot.pause()
        lines = {
            line.split()[0]: line
            for line in str(app.screen.query_one("#timeline-rows").render()).splitlines()
            if line.strip()
        }
        assert lines["inference"].endswith(" ·" + "G" * 30 + "·" * 10)
        assert lines["trainer"].endswith("·" * 30 + "U" * 20)
        assert lines["run_lr1e-3"].endswith("G" * 30 + "s" * 10)
        assert "U train step" in lines["G"] and "~ starting" in lines["·"]  # the legend
        assert all(len(line) <= 80 for line in lines.values())
        screenshot = app.export_screenshot()
        assert "starting" in screenshot and "run_lr1e-3" in screenshot  # on screen at 80x24
        await press_for(pilot, "t", MainScreen)
