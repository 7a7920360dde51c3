"""A run's control files: the one way to evict a run from outside it."""

from __future__ import annotations

import os

import pytest

from workbench.files import layout, run_control


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


def test_a_rejection_names_the_config_it_rejected_and_stands_until_that_changes(tmp_path):
    run = tmp_path / "run_a"
    config = layout.orch_config_path(run)
    config.parent.mkdir(parents=True)
    config.write_text("lr = -1\n")
    read = run_control.current_config_signature(run)
    run_control.write_validation_error(run, "lr must be > 0\nsecond line", read)
    assert run_control.read_validation_error(run) == "lr must be > 0\nsecond line"
    assert not run_control.run_condition(run).reconsidered
    config.write_text("lr = 0.1\n")  # edited in place: same inode, new time and size
    assert run_control.read_validation_error(run) == "lr must be > 0\nsecond line"
    assert run_control.run_condition(run).reconsidered


def test_a_rejection_that_names_no_config_stands_until_the_config_is_newer(tmp_path):
    run = tmp_path / "run_a"
    config = layout.orch_config_path(run)
    config.parent.mkdir(parents=True)
    config.write_text("lr = -1\n")
    run_control.write_validation_error(run, "lr must be > 0")
    error = layout.validation_error_path(run)
    stamp = config.stat().st_mtime_ns
    os.utime(error, ns=(stamp, stamp))
    assert not run_control.run_condition(run).reconsidered
    os.utime(config, ns=(stamp + 10**9, stamp + 10**9))
    assert run_control.run_condition(run).reconsidered
