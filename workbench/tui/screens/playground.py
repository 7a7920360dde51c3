"""The playground (`A`): a prompt to every ticked run's newest adapter and the base model,
their answers side by side (`workbench.playground`, as `workbench ask`).

Type a prompt and press enter; or ctrl+n to ask the next held-out prompt of the runs'
environment (a dataset row), whose answers are scored with its reward. The list on the
left ticks the runs asked and the base model (space; tab moves between the prompt and
the list). Each run is sampled with its own settings; the requests go through the
experiment's vLLM beside training, one per run. Escape goes back.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import Input, SelectionList, Static

from workbench.files import layout
from workbench.playground import BASE_LABEL, Answer, AskError, ask
from workbench.tui.widgets.footer import Footer


class PlaygroundScreen(Screen[None]):
    DEFAULT_CSS = """
    #play-body { height: 1fr; }
    #play-runs { width: 22; border: round $primary; }
    #play-answers { width: 1fr; border: round $primary; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "app.pop_screen", "back"),
        Binding("ctrl+n", "next_row", "dataset row", priority=True),
    ]

    def __init__(self, experiment: Path) -> None:
        super().__init__()
        self.experiment = experiment
        self.row: int | None = None  # the dataset row asked last; None: a typed prompt
        self.answers: list[Answer] = []
        self.asking = False

    def compose(self) -> ComposeResult:
        yield Static(" playground: enter asks every ticked run and the base", id="top-bar")
        yield Input(placeholder="a prompt (enter: ask; ctrl+n: a dataset row)", id="play-prompt")
        with Horizontal(id="play-body"):
            runs = SelectionList[str](id="play-runs")
            runs.border_title = "ask (space)"
            yield runs
            with VerticalScroll(id="play-answers"):
                yield Static("", id="play-text")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        runs = self.query_one(SelectionList)
        for path in layout.list_run_dirs(self.experiment):
            runs.add_option((path.name, path.name, True))
        runs.add_option((BASE_LABEL, BASE_LABEL, True))
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.row = None
        self._ask(event.value.strip(), None)

    def action_next_row(self) -> None:
        self.row = 0 if self.row is None else self.row + 1
        self._ask(None, self.row)

    def _ask(self, text: str | None, row: int | None) -> None:
        if self.asking or (not text and row is None):
            return
        ticked = list(self.query_one(SelectionList).selected)
        run_ids = [run for run in ticked if run != BASE_LABEL]
        self.asking = True
        what = f"dataset row {row}" if row is not None else repr(text)
        self._status(f"asking {what} of {len(ticked)} models...")
        self._send(text, row, run_ids, BASE_LABEL in ticked)

    @work(thread=True, group="playground", exit_on_error=False)
    def _send(self, text: str | None, row: int | None, run_ids: list[str], base: bool) -> None:
        # A thread: the answers take as long as the longest completion.
        try:
            answers = ask(self.experiment, text, run_ids=run_ids, base=base, row=row)
        except (AskError, OSError) as err:
            self.app.call_from_thread(self._failed, str(err))
            return
        self.app.call_from_thread(self._answered, answers, row)

    def _failed(self, message: str) -> None:
        self.asking = False
        self._status(message, style="red")

    def _answered(self, answers: list[Answer], row: int | None) -> None:
        self.asking = False
        self.answers = answers
        done = f"dataset row {row}" if row is not None else "the prompt"
        self._status(f"{len(answers)} answers to {done}")
        self.query_one("#play-text", Static).update(answers_text(answers))

    def _status(self, message: str, style: str = "") -> None:
        bar = Text(" playground  ", style="bold", no_wrap=True, overflow="ellipsis")
        bar.append(message, style=style)
        self.query_one("#top-bar", Static).update(bar)


def answers_text(answers: list[Answer]) -> Text:
    """Each answer under its run's name and adapter version."""
    text = Text()
    for i, answer in enumerate(answers):
        if i:
            text.append("\n")
        text.append(answer.label, style="bold cyan")
        if answer.model and answer.model != answer.label:
            text.append(f" {answer.model}", style="dim")
        if answer.reward is not None:
            text.append(f" reward {answer.reward:.2f}")
        text.append("\n")
        if answer.error:
            text.append(answer.error, style="yellow")
            continue
        text.append(answer.text)
        if answer.truncated:
            text.append(" [cut at max_tokens]", style="yellow")
    return text
