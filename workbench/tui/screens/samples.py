"""The rollout browser: one run's recent steps, group by group, as the policy wrote them.

Reads the run's `samples.jsonl` (`workbench.files.samples`: the last few steps' prompts and
completions as text) again whenever the app's poll finds it changed. On top, the step
shown and its reward histogram; below, a table of the step's GRPO groups (mean reward,
spread, prompt); under it, every completion of the selected group with its reward and
advantage. Left / right (or `[` / `]`) move between steps; while the newest step is shown,
new steps are shown as they arrive. Escape goes back.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Static

from workbench.files import layout
from workbench.files.samples import SampleGroup, StepSamples, read_steps, reward_histogram
from workbench.tui.widgets.footer import Footer

HISTOGRAM_BINS = 8
HISTOGRAM_BAR_WIDTH = 10


def step_title(run_id: str, steps: list[StepSamples], index: int) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(f" {run_id}  ", style="bold")
    if not steps:
        text.append("no samples yet", style="dim")
        return text
    shown = steps[index]
    text.append(f"step {shown.step}", style="bold")
    text.append(f" ({index + 1}/{len(steps)})  policy v{shown.policy_version}  ")
    text.append(f"reward {shown.reward_mean:.3f}")
    if not shown.written:
        text.append("  dropped: no learning signal", style="yellow")
    if index == len(steps) - 1:
        text.append("  newest", style="dim")
    return text


def histogram_text(rewards: list[float]) -> Text:
    """One line per bin: its range, a bar, the count."""
    bins = reward_histogram(rewards, HISTOGRAM_BINS)
    most = max((count for _, _, count in bins), default=0)
    text = Text(no_wrap=True)
    for i, (low, high, count) in enumerate(bins):
        width = round(HISTOGRAM_BAR_WIDTH * count / most) if most else 0
        text.append(f"{low:4.2f}-{high:4.2f} ")
        text.append("█" * width, style="cyan")
        text.append(f"{' ' * (HISTOGRAM_BAR_WIDTH - width)} {count}")
        if i < len(bins) - 1:
            text.append("\n")
    return text


def completions_text(group: SampleGroup) -> Text:
    """The group's completions, best first: reward, advantage, text (one line each)."""
    text = Text()
    text.append("prompt ", style="bold")
    text.append(group.prompt)
    text.append("\nanswer ", style="bold")
    text.append(group.answer)
    ranked = sorted(group.completions, key=lambda c: c.reward, reverse=True)
    for completion in ranked:
        style = "green" if completion.advantage > 0 else "red" if completion.advantage < 0 else ""
        text.append(f"\n{completion.reward:5.2f} ", style=style)
        text.append(f"{completion.advantage:+5.2f} ", style="dim")
        text.append(completion.text.replace("\n", "⏎"))
        if completion.truncated:
            text.append(" [cut at max_tokens]", style="yellow")
    return text


class SamplesScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,backspace", "app.pop_screen", "back"),
        # Priority: the groups table has focus and would take these keys to scroll.
        Binding("left,left_square_bracket", "older", "older step", priority=True),
        Binding("right,right_square_bracket", "newer", "newer step", priority=True),
        Binding("end", "newest", "newest", priority=True),
    ]

    def __init__(self, run_id: str, experiment: Path) -> None:
        super().__init__()
        self.run_id = run_id
        self.path = layout.samples_path(layout.run_dir(experiment, run_id))
        self.steps: list[StepSamples] = []
        self.index = 0
        self._read_stamp: tuple[int, int] | None = None

    def compose(self) -> ComposeResult:
        yield Static(f" {self.run_id}", id="top-bar")
        with Horizontal(id="samples-top"):
            groups = DataTable(id="sample-groups", cursor_type="row", zebra_stripes=True)
            groups.border_title = "groups"
            yield groups
            yield Static("", id="sample-histogram")
        with VerticalScroll(id="sample-completions"):
            yield Static("", id="sample-group")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_column("#", key="index")
        table.add_column("mean", key="mean")
        table.add_column("spread", key="spread")
        table.add_column("prompt", key="prompt")
        table.focus()
        self.query_one("#sample-histogram", Static).border_title = "rewards"
        self.watch(self.app, "snapshot", lambda _: self.refresh_steps())

    def refresh_steps(self) -> None:
        """Read the file again if it changed; stay on the step shown unless it was newest."""
        try:
            stat = os.stat(self.path)
            stamp = (stat.st_mtime_ns, stat.st_size)
        except FileNotFoundError:
            stamp = None
        if stamp == self._read_stamp and self.steps:
            return
        self._read_stamp = stamp
        following = not self.steps or self.index == len(self.steps) - 1
        shown = self.steps[self.index] if self.steps else None
        self.steps = read_steps(self.path.parent)
        if following or shown is None:
            self.index = max(len(self.steps) - 1, 0)
        else:
            self.index = _position_of(self.steps, shown)
        self._show_step()

    def _show_step(self) -> None:
        self.query_one("#top-bar", Static).update(step_title(self.run_id, self.steps, self.index))
        table = self.query_one(DataTable)
        table.clear()
        if not self.steps:
            self.query_one("#sample-histogram", Static).update("")
            self.query_one("#sample-group", Static).update(
                Text(
                    "no samples recorded yet: the run's orchestrator writes them at each step",
                    style="dim italic",
                )
            )
            return
        step = self.steps[self.index]
        for i, group in enumerate(step.groups):
            spread = Text(f"{group.reward_spread:.2f}", style="" if group.reward_spread else "dim")
            table.add_row(str(i + 1), f"{group.reward_mean:.2f}", spread, group.prompt, key=str(i))
        self.query_one("#sample-histogram", Static).update(histogram_text(step.rewards))
        self._show_group()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_group()

    def _show_group(self) -> None:
        if not self.steps:
            return
        groups = self.steps[self.index].groups
        row = self.query_one(DataTable).cursor_row
        if 0 <= row < len(groups):
            self.query_one("#sample-group", Static).update(completions_text(groups[row]))

    def action_older(self) -> None:
        if self.index > 0:
            self.index -= 1
            self._show_step()

    def action_newer(self) -> None:
        if self.index < len(self.steps) - 1:
            self.index += 1
            self._show_step()

    def action_newest(self) -> None:
        if self.steps:
            self.index = len(self.steps) - 1
            self._show_step()

    @property
    def shown_step(self) -> StepSamples | None:
        return self.steps[self.index] if self.steps else None


def _position_of(steps: list[StepSamples], shown: StepSamples) -> int:
    """Where the step shown is in the re-read list (the oldest kept if it rotated out)."""
    for i, step in enumerate(steps):
        if (step.step, step.time) == (shown.step, shown.time):
            return i
    return 0
