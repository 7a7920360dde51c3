"""What a builtin model is to the rest of the project: the `BuiltinModel` its builder
provides, how a build reports its steps, and the error a build or a lookup raises.

Apart from `resolve` so that a builder (`workbench.trainer.sft.tiny_reverse`) imports these
and nothing that imports it back.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console

# `on_step(step, steps, what)`: a build is at `step` of `steps` (from 1), doing `what`;
# step 0 of 0 while it waits for another process's build.
StepCallback = Callable[[int, int, str], None]


def ignore_steps(step: int, steps: int, what: str) -> None:
    """The `on_step` of a build nobody follows."""


class ModelResolutionError(ValueError):
    """An unknown builtin model or a build that could not finish; the message says why."""


class BuiltinModel(Protocol):
    """What `resolve_model` needs from a model the project builds itself."""

    name: str

    def default_spec(self) -> Any:
        """The spec `builtin:NAME` means; tests pass a smaller one to build fast."""

    def version_hash(self, spec: Any) -> str:
        """Short hash of everything that determines the built files."""

    def model_config(self, spec: Any) -> Any:
        """The transformers config of `spec`'s model, known without building it."""

    def describe_build(self, spec: Any) -> str:
        """What writing `spec`'s model into the cache involves, told to the user waiting on
        it: "building builtin:NAME (first use, about a minute)"."""

    def build(
        self,
        target: Path,
        spec: Any,
        *,
        show_progress: bool,
        console: Console,
        on_step: StepCallback = ignore_steps,
    ) -> None:
        """Write the model into the empty directory `target`, telling `on_step` each step."""

    def build_from_scratch(
        self, target: Path, spec: Any, *, show_progress: bool, console: Console
    ) -> None:
        """Make `spec`'s model from nothing into `target` (what made any shipped weights)."""
