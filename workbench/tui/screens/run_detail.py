"""One run in full: status and reason, its loss's diagnostics, reward, eval reward and loss
curves, its orch.toml.

The app keeps one such screen and shows it for whichever run is chosen (`show_run`), so
`enter` does not build a screen of widgets each time; the run's orch.toml is read and
highlighted in a thread worker, and while the screen is hidden, snapshots pass it by.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from rich.syntax import Syntax
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import Static

from workbench.curves import EVAL_METRIC
from workbench.files import layout
from workbench.tui.data import ExperimentSnapshot, LossDiagnostics, RunView
from workbench.tui.format import format_age, format_count, format_reward, format_steps
from workbench.tui.messages import EvictRun, RestartRun, ShowCurves, ShowSamples
from workbench.tui.widgets.curves import CurveChart, StepCurveChart
from workbench.tui.widgets.footer import Footer
from workbench.tui.widgets.runs_table import STATUS_STYLES


def config_text(path: Path) -> Text:
    """A run's orch.toml, highlighted as TOML; or why it cannot be read."""
    try:
        source = path.read_text(encoding="utf-8", errors="replace")
    except OSError as err:
        return Text(f"cannot read {path}: {err.strerror or err}", style="red")
    # Highlighted once, here: a Syntax would lex the file again at every redraw.
    syntax = Syntax(source, "toml", theme="ansi_dark", word_wrap=True)
    return syntax.highlight(source)


def run_summary(run: RunView, now: float) -> Text:
    text = Text(no_wrap=False)
    text.append(run.id, style="bold")
    text.append("  ")
    text.append(run.status, style=STATUS_STYLES.get(run.status, ""))
    text.append(f"  step {format_steps(run.step, run.max_steps)}")
    text.append(f"  reward {format_reward(run.reward)}")
    if run.evals:
        step, value = run.evals[-1]
        text.append(f"  eval {format_reward(value)} at step {step}")
    text.append(f"  tokens {format_count(run.tokens)}")
    if run.slot is not None:
        text.append(f"  slot {run.slot}")
    if run.forked_from:
        text.append(f"  forked from {run.forked_from}")
    text.append(f"  updated {format_age(run.last_update, now)}", style="dim")
    if run.loss is not None:
        text.append("\n")
        text.append(loss_summary(run.loss))
    return text


def loss_summary(loss: LossDiagnostics) -> Text:
    """The run's loss at its latest update: kind, clipped share, ratio, KL to the base."""
    text = Text()
    text.append("loss ", style="dim")
    text.append(loss.kind, style="bold")
    if loss.clipped is not None:
        text.append(f"  clipped {loss.clipped:.1%}")
    if loss.ratio_mean is not None:
        text.append(f"  ratio {loss.ratio_mean:.3f}")
        if loss.ratio_min is not None and loss.ratio_max is not None:
            text.append(f" [{loss.ratio_min:.3g}, {loss.ratio_max:.3g}]", style="dim")
    if loss.base_kl is not None:
        text.append(f"  KL to base {loss.base_kl:.3g}")
    return text


class RunDetailScreen(Screen[None]):
    """Follows the app's snapshots while open; Escape goes back to the main screen."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,backspace", "app.pop_screen", "back"),
        Binding("e", "evict", "evict"),
        Binding("r", "restart", "restart"),
        Binding("s", "samples", "samples"),
        Binding("c", "curves", "curves"),
    ]

    def __init__(self, run_id: str, experiment: Path, clock: Callable[[], float]) -> None:
        super().__init__()
        self.run_id = run_id
        self.experiment = experiment
        self.clock = clock
        self._shown: RunView | None = None  # the row whose curves are drawn

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="detail"):
            yield Static(Text(self.run_id, style="bold"), id="detail-summary")
            yield Static("", id="detail-reason")
            with Horizontal(id="detail-curves"):
                yield CurveChart("reward (mean)", low=0.0, high=1.0, id="reward-chart")
                yield StepCurveChart(EVAL_METRIC, low=0.0, high=1.0, id="eval-chart")
                yield CurveChart("loss", id="loss-chart")
            yield Static("control/orch.toml", classes="section-title")
            yield Static("", id="detail-config")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.watch(self.app, "snapshot", self._follow_snapshot)
        self._read_config(self.run_id)

    def show_run(self, run_id: str, snapshot: ExperimentSnapshot | None) -> None:
        """Show `run_id` from now on (the screen is about to be shown again)."""
        if run_id != self.run_id:
            self.run_id = run_id
            self._shown = None
            if self.is_mounted:
                self.query_one("#detail-config", Static).update("")
                self.query_one(VerticalScroll).scroll_home(animate=False)
        if self.is_mounted:
            self._read_config(run_id)
            self._show_snapshot(snapshot)

    @work(thread=True, exclusive=True, group="run-config", exit_on_error=False)
    def _read_config(self, run_id: str) -> None:
        config = config_text(layout.orch_config_path(layout.run_dir(self.experiment, run_id)))
        self.app.call_from_thread(self._config_read, run_id, config)

    def _config_read(self, run_id: str, config: Text) -> None:
        if run_id == self.run_id:
            self.query_one("#detail-config", Static).update(config)

    def _follow_snapshot(self, snapshot: ExperimentSnapshot | None) -> None:
        if self.is_current:  # hidden: `show_run` catches up when it is shown again
            self._show_snapshot(snapshot)

    def _show_snapshot(self, snapshot: ExperimentSnapshot | None) -> None:
        if snapshot is None:
            return
        run = snapshot.run(self.run_id)
        summary = self.query_one("#detail-summary", Static)
        reason = self.query_one("#detail-reason", Static)
        if run is None:
            summary.update(Text(f"{self.run_id}: its directory is gone", style="bold red"))
            reason.display = False
            return
        summary.update(run_summary(run, self.clock()))
        reason.display = bool(run.reason)
        if run.reason:
            label = {
                "evicted": "eviction reason",
                "diverged": "eviction reason",
                "rejected": "rejected config",
            }.get(run.status, "note")
            reason.update(Text.assemble((f"{label}: ", "bold"), run.reason))
            reason.set_class(run.status in ("evicted", "diverged", "rejected"), "-problem")
        if run is not self._shown:  # the same row object: the same curves
            self._shown = run
            self.query_one("#reward-chart", CurveChart).values = run.rewards
            self.query_one("#eval-chart", StepCurveChart).points = run.evals
            self.query_one("#loss-chart", CurveChart).values = run.losses

    def action_evict(self) -> None:
        self.post_message(EvictRun(self.run_id))

    def action_restart(self) -> None:
        self.post_message(RestartRun(self.run_id))

    def action_samples(self) -> None:
        self.post_message(ShowSamples(self.run_id))

    def action_curves(self) -> None:
        self.post_message(ShowCurves())
