"""A run's control files: the one way to evict a run from outside it."""

from __future__ import annotations

import pytest

from workbench import layout, run_control


def test_evicting_writes_the_reason_and_who_evicted(tmp_path):
    run = tmp_path / "run_a"
    run.mkdir()
    eviction, already = run_control.evict(run, "diverged", by="user")
    assert not already
    assert run_control.read_eviction(run) == eviction
    assert (eviction.reason, eviction.evicted_by) == ("diverged", "user")


def test_evicting_an_evicted_run_keeps_the_first_eviction(tmp_path):
    run = tmp_path / "run_a"
    run.mkdir()
    first, _ = run_control.evict(run, "diverged", by="trainer")
    before = layout.evicted_path(run).read_text()
    eviction, already = run_control.evict(run, "again", by="tui")
    assert already and eviction == first
    assert layout.evicted_path(run).read_text() == before


def test_evicting_a_deleted_run_writes_nothing(tmp_path):
    run = tmp_path / "run_gone"
    with pytest.raises(FileNotFoundError):
        run_control.evict(run, "late", by="tui")
    assert not run.exists()
