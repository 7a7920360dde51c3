"""`python -m workbench.tui EXPERIMENT`: the TUI without the CLI (development, tmux tests,
and each browser tab of `workbench web`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from workbench.system.lifeline import PARENT_PID_ENV, die_with_parent
from workbench.tui import run_tui

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m workbench.tui EXPERIMENT_DIR")
    if PARENT_PID_ENV in os.environ:  # `workbench web`'s TUI for one tab: ends with it
        die_with_parent()
    run_tui(Path(sys.argv[1]))
