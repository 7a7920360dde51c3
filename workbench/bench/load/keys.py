"""Key-to-screen latency of the TUI attached to a loaded experiment.

The real app (`WorkbenchApp`, its polls, screens and workers) runs headless through
Textual's `run_test()`; a key is pressed the way a terminal delivers one (Pilot hands the
key event to the app's driver), and the latency is the time from that moment to the first
frame the app composes in which the key's effect is on the screen:

- `down` / `up` on the runs table: the cursor is on another row;
- `enter`: the run's detail screen is the screen shown;
- `escape` on the detail screen: the main screen is shown again;
- a view's key on the main screen (`v` side by side, `!` alerts, `t` timeline, `c` curves,
  `A` playground, one a cycle in turn): its screen is shown, then `escape` back to the main
  screen. Each view polls what it shows while it is open, under the same load.

"Composes" is Textual's compositor producing the frame's update, the step just before it
is written to the terminal; headless, that write is skipped. The hook is Textual's public
`App.post_display_hook`, which the app calls each time it has displayed the screen's
update (headless: each time it would have). Keys go one at a time, `KEY_GAP_S` apart, so
each latency is the app's alone and not a queue of keys. A key whose effect is not on screen
within `KEY_TIMEOUT_S` counts as timed out (its latency is not in the figures).

The time each poll of the experiment directory takes (the app's reader, in a worker
thread) is recorded too: what the app spends every second to stay current. Each key's and
poll's time is split into its thread running, waiting for a CPU, the collector and the
rest (`stalls`), so a slow one says what held it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.bench.load.stalls import Breakdown, Mark, StallMeter
from workbench.tui.app import WorkbenchApp
from workbench.tui.data import ExperimentReader, ExperimentSnapshot
from workbench.tui.screens.alerts import AlertsScreen
from workbench.tui.screens.curves import CurvesScreen
from workbench.tui.screens.main import MainScreen
from workbench.tui.screens.playground import PlaygroundScreen
from workbench.tui.screens.run_detail import RunDetailScreen
from workbench.tui.screens.side_by_side import SideBySideScreen
from workbench.tui.screens.timeline import TimelineScreen
from workbench.tui.widgets.runs_table import RunsTable

TUI_SIZE = (120, 40)
KEY_GAP_S = 1.0
KEY_TIMEOUT_S = 10.0
# One cycle: move, open the run, back, move again (down while it can, then up), open the
# next view and close it.
CYCLE = ("move", "enter", "escape", "move", "view", "close")
# The researcher's views, by the key that opens each from the main screen.
VIEWS: tuple[tuple[str, type], ...] = (
    ("v", SideBySideScreen),
    ("exclamation_mark", AlertsScreen),
    ("t", TimelineScreen),
    ("c", CurvesScreen),
    ("A", PlaygroundScreen),
)


class TimedReader(ExperimentReader):
    """The app's reader, timing each poll and telling where its time went."""

    def __init__(self, experiment: Path, stalls: StallMeter) -> None:
        super().__init__(experiment)
        self._stalls = stalls
        self.poll_s: list[float] = []
        self.poll_parts: list[Breakdown] = []

    def poll(self, *, rank: bool = True) -> ExperimentSnapshot:
        mark = self._stalls.mark()
        try:
            return super().poll(rank=rank)
        finally:
            parts = self._stalls.since(mark)
            self.poll_s.append(parts.wall_s)
            self.poll_parts.append(parts)


class FrameTimedApp(WorkbenchApp):
    """The TUI, noting the first frame in which an awaited effect of a key is on screen."""

    # Textual reads a relative CSS_PATH beside the module that defines the class.
    CSS_PATH = str(Path(inspect.getfile(WorkbenchApp)).parent / WorkbenchApp.CSS_PATH)

    def __init__(self, experiment: Path) -> None:
        self.stalls = StallMeter()
        self.reader = TimedReader(experiment, self.stalls)
        super().__init__(experiment, reader=self.reader)
        self._awaited: tuple[Callable[[], bool], Mark, asyncio.Future[Breakdown]] | None = None

    def await_frame(self, shown: Callable[[], bool]) -> asyncio.Future[Breakdown]:
        """A future of the time from now to the first frame that shows `shown()` true, and
        where it went (`stalls`), measured in that frame's hook: the event loop's thread."""
        future: asyncio.Future[Breakdown] = asyncio.get_running_loop().create_future()
        self._awaited = (shown, self.stalls.mark(), future)
        return future

    def on_unmount(self) -> None:
        super().on_unmount()
        self.stalls.close()

    def post_display_hook(self) -> None:
        super().post_display_hook()
        if self._awaited is None:
            return
        shown, mark, future = self._awaited
        if shown() and not future.done():
            future.set_result(self.stalls.since(mark))
            self._awaited = None


@dataclass
class KeyLatencies:
    by_key: dict[str, list[float]] = field(default_factory=dict)  # seconds
    timed_out: dict[str, int] = field(default_factory=dict)
    parts: list[tuple[str, Breakdown]] = field(default_factory=list)  # where each went

    def add(self, key: str, latency: Breakdown | None) -> None:
        if latency is None:
            self.timed_out[key] = self.timed_out.get(key, 0) + 1
        else:
            self.by_key.setdefault(key, []).append(latency.wall_s)
            self.parts.append((key, latency))

    @property
    def all_s(self) -> list[float]:
        return [value for values in self.by_key.values() for value in values]


async def time_key(
    app: FrameTimedApp, pilot: Any, key: str, shown: Callable[[], bool]
) -> Breakdown | None:
    """Press `key`; the time until a frame shows `shown()` true and where it went; None
    after KEY_TIMEOUT_S."""
    frame = app.await_frame(shown)
    await pilot.press(key)
    try:
        return await asyncio.wait_for(frame, KEY_TIMEOUT_S)
    except TimeoutError:
        return None


async def press_keys(app: FrameTimedApp, pilot: Any, stop: asyncio.Event) -> KeyLatencies:
    """Press the cycle's keys, `KEY_GAP_S` apart, until `stop` is set."""
    latencies = KeyLatencies()
    step = views_opened = 0
    direction = "down"
    while not stop.is_set():
        action = CYCLE[step % len(CYCLE)]
        step += 1
        if action == "move" and isinstance(app.screen, MainScreen):
            table = app.screen.query_one(RunsTable)
            if table.row_count < 2:
                await sleep_unless_stopped(stop, KEY_GAP_S)
                continue
            if table.cursor_row >= table.row_count - 1:
                direction = "up"
            elif table.cursor_row <= 0:
                direction = "down"
            latency = await time_key(app, pilot, direction, cursor_moved(table))
            latencies.add(direction, latency)
        elif action == "enter" and isinstance(app.screen, MainScreen):
            latency = await time_key(
                app, pilot, "enter", lambda: isinstance(app.screen, RunDetailScreen)
            )
            latencies.add("enter", latency)
        elif action == "escape" and isinstance(app.screen, RunDetailScreen):
            latency = await time_key(
                app, pilot, "escape", lambda: isinstance(app.screen, MainScreen)
            )
            latencies.add("escape", latency)
        elif action == "view" and isinstance(app.screen, MainScreen):
            key, screen = VIEWS[views_opened % len(VIEWS)]
            views_opened += 1
            latency = await time_key(app, pilot, key, lambda s=screen: isinstance(app.screen, s))
            latencies.add(key, latency)
        elif action == "close" and isinstance(app.screen, tuple(s for _, s in VIEWS)):
            latency = await time_key(
                app, pilot, "escape", lambda: isinstance(app.screen, MainScreen)
            )
            latencies.add("escape view", latency)
        await sleep_unless_stopped(stop, KEY_GAP_S)
    return latencies


def cursor_moved(table: RunsTable) -> Callable[[], bool]:
    before = table.cursor_row
    return lambda: table.cursor_row != before


async def sleep_unless_stopped(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def wait_for_runs(app: FrameTimedApp, runs: int, timeout_s: float) -> None:
    """Until the app shows `runs` runs (the TUI is attached and current)."""
    deadline = time.monotonic() + timeout_s
    while not (app.snapshot and len(app.snapshot.runs) >= runs):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the TUI did not show {runs} runs within {timeout_s:g} s")
        await asyncio.sleep(0.1)
