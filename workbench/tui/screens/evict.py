"""The eviction confirmation: names the run, asks for a reason, returns it (or None)."""

from __future__ import annotations

from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label

DEFAULT_REASON = "evicted from the TUI"


class EvictScreen(ModalScreen[str | None]):
    """Enter (or the Evict button) confirms with the typed reason; Escape cancels."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "cancel")]

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(f"Evict [b]{self.run_id}[/b]?", classes="dialog-title")
            yield Label(
                "Its trainer slot is freed and its orchestrator stops. "
                "`workbench restart` brings it back from its last checkpoint.",
                classes="dialog-text",
            )
            yield Input(placeholder=f"reason (default: {DEFAULT_REASON})", id="evict-reason")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Evict (enter)", variant="error", id="evict-confirm", compact=True)
                yield Button("Cancel (esc)", id="evict-cancel", compact=True)

    def on_mount(self) -> None:
        self.query_one("#evict-reason", Input).focus()

    @on(Input.Submitted, "#evict-reason")
    @on(Button.Pressed, "#evict-confirm")
    def confirm(self) -> None:
        reason = self.query_one("#evict-reason", Input).value.strip()
        self.dismiss(reason or DEFAULT_REASON)

    @on(Button.Pressed, "#evict-cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)
