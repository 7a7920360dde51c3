"""The add-run dialog: a run id and `key=value` overrides of the experiment's defaults."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any, ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label

from workbench.config import (
    check_run_id,
    deep_merge,
    nest_dotted,
    normalize_run_id,
    parse_assignment,
)


@dataclass(frozen=True)
class AddRunRequest:
    run_id: str
    overrides: dict[str, Any] = field(default_factory=dict)


def parse_add_run(raw_id: str, raw_overrides: str) -> AddRunRequest:
    """`("lr1e-3", "lr=1e-3 sampling.temperature=0.7")` -> a request; ValueError says why not.

    Overrides are parsed as the CLI's `--set` values are (TOML values, dotted keys nest).
    """
    raw_id = raw_id.strip()
    problem = check_run_id(raw_id)
    if problem is not None:
        raise ValueError(problem)
    overrides: dict[str, Any] = {}
    try:
        assignments = shlex.split(raw_overrides)
    except ValueError as err:
        raise ValueError(f"overrides: {err}") from None
    for assignment in assignments:
        key, value = parse_assignment(assignment)
        overrides = deep_merge(overrides, nest_dotted(key, value))
    return AddRunRequest(run_id=normalize_run_id(raw_id), overrides=overrides)


class AddRunScreen(ModalScreen[AddRunRequest | None]):
    """Returns the request on Enter / Add, None on Escape / Cancel; errors show inline."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "cancel")]

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label("Add a run", classes="dialog-title")
            yield Label(
                "It starts from the experiment's [b]\\[defaults][/b]; overrides are "
                "space-separated key=value (e.g. lr=1e-3 sampling.temperature=0.7).",
                classes="dialog-text",
            )
            yield Input(placeholder="run id, e.g. lr1e-3", id="add-run-id")
            yield Input(placeholder="overrides (optional)", id="add-run-overrides")
            yield Label("", id="add-run-error", classes="dialog-error")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Add (enter)", variant="primary", id="add-run-confirm", compact=True)
                yield Button("Cancel (esc)", id="add-run-cancel", compact=True)

    def on_mount(self) -> None:
        self.query_one("#add-run-id", Input).focus()

    @on(Input.Submitted, "#add-run-id")
    def _next_field(self) -> None:
        self.query_one("#add-run-overrides", Input).focus()

    @on(Input.Submitted, "#add-run-overrides")
    @on(Button.Pressed, "#add-run-confirm")
    def confirm(self) -> None:
        try:
            request = parse_add_run(
                self.query_one("#add-run-id", Input).value,
                self.query_one("#add-run-overrides", Input).value,
            )
        except ValueError as err:
            error = self.query_one("#add-run-error", Label)
            error.update(str(err))
            error.add_class("-shown")
            return
        self.dismiss(request)

    @on(Button.Pressed, "#add-run-cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)
