"""`python -m workbench.tui EXPERIMENT`: the TUI without the CLI (development, tmux tests)."""

from __future__ import annotations

import sys
from pathlib import Path

from workbench.tui import run_tui

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m workbench.tui EXPERIMENT_DIR")
    run_tui(Path(sys.argv[1]))
