"""The output console: as wide as a terminal on one, wide enough for any table when
piped, and the width asked for when one is."""

from __future__ import annotations

import io

import pytest

from workbench.system.console import PIPED_WIDTH, OutputConsole


def test_a_piped_console_is_wide_unless_a_width_is_asked_for(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert OutputConsole(file=io.StringIO()).width == PIPED_WIDTH
    assert OutputConsole(file=io.StringIO(), width=80).width == 80
    monkeypatch.setenv("COLUMNS", "100")
    assert OutputConsole(file=io.StringIO()).width == 100


def test_a_terminal_keeps_its_width(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    terminal = OutputConsole(file=io.StringIO(), force_terminal=True)
    assert terminal.is_terminal and terminal.width != PIPED_WIDTH
