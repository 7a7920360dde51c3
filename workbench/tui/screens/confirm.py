"""A yes/no confirmation for actions that disturb training (stop all, restart a process)."""

from __future__ import annotations

from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label


class ConfirmScreen(ModalScreen[bool]):
    """`y` or the confirm button: True; `n`, Escape or Cancel: False. Cancel has focus."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,n", "answer(False)", "cancel"),
        Binding("y", "answer(True)", "confirm"),
    ]

    def __init__(self, title: str, text: str, confirm_label: str) -> None:
        super().__init__()
        self.title_text = title
        self.body_text = text
        self.confirm_label = confirm_label

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.title_text, classes="dialog-title")
            yield Label(self.body_text, classes="dialog-text")
            with Horizontal(classes="dialog-buttons"):
                yield Button(
                    f"{self.confirm_label} (y)", variant="error", id="confirm-yes", compact=True
                )
                yield Button("Cancel (n)", id="confirm-no", compact=True)

    def on_mount(self) -> None:
        self.query_one("#confirm-no", Button).focus()

    @on(Button.Pressed, "#confirm-yes")
    def _yes(self) -> None:
        self.dismiss(True)

    @on(Button.Pressed, "#confirm-no")
    def _no(self) -> None:
        self.dismiss(False)

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)
