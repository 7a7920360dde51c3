"""The Textual TUI of workbench: `run_tui(experiment)` is its only entry point.

Only the CLI imports this package (`from workbench.tui import run_tui`); importing it is
cheap, Textual is loaded when the TUI starts.
"""

from __future__ import annotations

from pathlib import Path


def run_tui(experiment: Path) -> None:
    """Open the TUI on an experiment directory; returns when the user quits."""
    from workbench.tui.app import run_tui as _run_tui

    _run_tui(experiment)


__all__ = ["run_tui"]
