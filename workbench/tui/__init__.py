"""The Textual TUI of workbench, opened with `run_tui(experiment)`.

`workbench up` and `workbench attach` call `run_tui`, as does `python -m workbench.tui`;
the load and supervisor benchmarks and the tests drive `workbench.tui.app.WorkbenchApp`
themselves. Importing this package is cheap: Textual is loaded when the TUI starts.

`app` is the application; `screens/` and `widgets/` what it shows; `selection` the runs
the user selected, pinned and filtered, and each run's colour; `data` reads the
experiment directory into dataclasses, `leaderboard` ranks its runs, `tail` follows logs,
`format` writes numbers and ages; `messages` are the screens' requests to the app,
`commands` what it sends the supervisor; `collector` keeps Python's cycle collector from
pausing it; `web` serves it to a browser (`workbench web`); `__main__` is
`python -m workbench.tui`.
"""

from __future__ import annotations

from pathlib import Path


def run_tui(experiment: Path) -> None:
    """Open the TUI on an experiment directory; returns when the user quits."""
    from workbench.tui.app import run_tui as _run_tui

    _run_tui(experiment)


__all__ = ["run_tui"]
