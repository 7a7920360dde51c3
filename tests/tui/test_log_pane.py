"""The log pane follows a file as it grows, stays small with huge logs, pauses, searches."""

from __future__ import annotations

from pathlib import Path

from textual.app import App, ComposeResult

from tests.tui.conftest import wait_until
from tests.tui.synthetic import append_log
from workbench.tui.widgets.log_pane import LogPane, LogTarget

TCSS = Path(__import__("workbench.tui", fromlist=["_"]).__file__).with_name("workbench.tcss")


class LogPaneApp(App[None]):
    """Just the pane, following one file."""

    CSS_PATH = TCSS

    def __init__(self, path: Path, max_lines: int = 1000) -> None:
        super().__init__()
        self.path = path
        self.max_lines = max_lines

    def compose(self) -> ComposeResult:
        yield LogPane(max_lines=self.max_lines, id="log-pane")

    def on_mount(self) -> None:
        pane = self.query_one(LogPane)
        pane.follow(LogTarget("test", self.path))
        pane.log.focus()


def shown(app: LogPaneApp) -> list[str]:
    return list(app.query_one(LogPane).log.lines)


async def test_lines_appended_to_the_followed_log_appear(tmp_path):
    log = tmp_path / "orchestrator.log"
    append_log(log, ["first", "second"])
    app = LogPaneApp(log)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: shown(app) == ["first", "second"])
        append_log(log, ["third"])
        await wait_until(pilot, lambda: shown(app)[-1:] == ["third"], what="the appended line")
        with open(log, "a") as handle:
            handle.write("half a li")  # no newline yet: held back until complete
        await pilot.pause(0.5)
        assert shown(app)[-1] == "third"
        with open(log, "a") as handle:
            handle.write("ne\n")
        await wait_until(pilot, lambda: shown(app)[-1] == "half a line")


async def test_a_log_that_does_not_exist_yet_is_followed_once_it_appears(tmp_path):
    log = tmp_path / "logs" / "trainer.log"
    app = LogPaneApp(log)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.3)
        assert shown(app) == []
        append_log(log, ["trainer up"])
        await wait_until(pilot, lambda: shown(app) == ["trainer up"])


async def test_a_huge_log_keeps_only_its_last_lines(tmp_path):
    log = tmp_path / "trainer.log"
    total = 200_000
    with open(log, "w") as handle:
        handle.writelines(
            f"line {i:06d} of the trainer's very chatty output\n" for i in range(total)
        )
    app = LogPaneApp(log, max_lines=1000)
    async with app.run_test(size=(80, 24)) as pilot:
        pane = app.query_one(LogPane)
        last = f"line {total - 1:06d} of the trainer's very chatty output"
        await wait_until(pilot, lambda: shown(app)[-1:] == [last], what="the last line")
        assert pane.log.line_count <= 1000
        # Only the end of the file was read, not the 10 MB before it.
        assert pane.tail.bytes_read < log.stat().st_size / 10
        lines = shown(app)
        numbers = [int(line.split()[1]) for line in lines]
        assert numbers == list(range(total - len(lines), total)), "a contiguous tail, in order"

        append_log(log, [f"burst {i}" for i in range(5000)])
        await wait_until(pilot, lambda: shown(app)[-1:] == ["burst 4999"])
        assert pane.log.line_count <= 1000


async def test_scrolling_up_pauses_following_until_end(tmp_path):
    log = tmp_path / "orchestrator.log"
    append_log(log, [f"step {i}" for i in range(100)])
    app = LogPaneApp(log)
    async with app.run_test(size=(80, 24)) as pilot:
        pane = app.query_one(LogPane)
        await wait_until(pilot, lambda: len(shown(app)) == 100)
        await pilot.press("home")
        assert pane.paused
        append_log(log, ["new while reading"])
        await wait_until(pilot, lambda: "1 new lines" in str(pane.query_one("#log-title").content))
        assert "new while reading" not in shown(app)
        assert pane.log.scroll_offset.y == 0, "the view does not move under the reader"

        await pilot.press("G")
        assert shown(app)[-1] == "new while reading"
        assert not pane.paused
        append_log(log, ["following again"])
        await wait_until(pilot, lambda: shown(app)[-1] == "following again")


async def test_search_jumps_between_matches(tmp_path):
    log = tmp_path / "orchestrator.log"
    lines = [f"step {i}: ok" for i in range(200)]
    lines[20] = "step 20: ERROR nan loss"
    lines[150] = "step 150: error again"
    append_log(log, lines)
    app = LogPaneApp(log)
    async with app.run_test(size=(80, 24)) as pilot:
        pane = app.query_one(LogPane)
        await wait_until(pilot, lambda: len(shown(app)) == 200)
        await pilot.press("home")
        await pilot.press("slash", *"error", "enter")
        assert pane.current_match == 20
        top = int(pane.log.scroll_offset.y)
        assert top <= 20 < top + pane.log.size.height, "the match is on screen"
        await pilot.press("n")
        assert pane.current_match == 150
        await pilot.press("n")
        assert pane.current_match == 20, "n wraps around"
        await pilot.press("N")
        assert pane.current_match == 150
        assert "2/2" in str(pane.query_one("#log-title").content)
