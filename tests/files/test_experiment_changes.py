"""Which runs changed since the last look, from real file events (watchdog's native observer)
on real directories."""

from __future__ import annotations

import errno
import logging
import shutil
import time
from pathlib import Path

import pytest

from workbench.files import layout
from workbench.files.experiment_changes import Changes, ExperimentChanges

# Events reach the feed from watchdog's threads within milliseconds; a look waits this long
# at most for the ones a test expects, and a quiet look this long for none to come.
SETTLE_S = 0.3


def look(changes: ExperimentChanges, expected: set[str] | None = None) -> Changes:
    """The looks' union until `expected` runs were named (or SETTLE_S passed)."""
    deadline = time.monotonic() + SETTLE_S
    runs: set[str] = set()
    busy: set[str] = set()
    while True:
        seen = changes.take()
        if seen.everything:
            return seen
        runs |= seen.runs
        busy |= seen.busy
        if time.monotonic() > deadline or (expected is not None and expected <= runs):
            time.sleep(0.05)  # and anything else those writes sent
            seen = changes.take()
            if seen.everything:
                return seen
            return Changes(runs=frozenset(runs | seen.runs), busy=frozenset(busy | seen.busy))
        time.sleep(0.01)


def make_runs(experiment: Path, *run_ids: str) -> None:
    for run_id in run_ids:
        run = layout.run_dir(experiment, run_id)
        layout.control_dir(run).mkdir(parents=True)
        layout.broadcasts_dir(run).mkdir()
        layout.orch_config_path(run).write_text("max_steps = 10\n")


@pytest.fixture
def changes(tmp_path: Path):
    make_runs(tmp_path, "run_a", "run_b", "run_c", "run_d", "run_e")
    follower = ExperimentChanges(tmp_path, full_pass_looks=None)
    assert follower.watching, "watchdog's native observer runs on the machines tests run on"
    assert follower.take().everything, "nothing was watched before the first look"
    yield follower
    follower.close()


def test_a_look_names_the_runs_whose_files_changed_and_no_other(tmp_path, changes):
    assert look(changes).runs == frozenset()

    with open(layout.metrics_path(tmp_path / "run_b"), "a") as handle:
        handle.write('{"step": 1}\n')
    layout.atomic_write_text(layout.evicted_path(tmp_path / "run_c"), "too slow\n")
    (layout.broadcasts_dir(tmp_path / "run_d") / "step_1").mkdir()
    # What no reader of a run's status or curves looks at: its logs, rollouts, other files.
    (tmp_path / "run_e" / "logs").mkdir()
    (tmp_path / "run_e" / "logs" / "orchestrator.log").write_text("a line\n")
    (tmp_path / "run_e" / "notes.txt").write_text("mine\n")

    seen = look(changes, {"run_b", "run_c", "run_d"})
    assert not seen.everything
    assert seen.runs == {"run_b", "run_c", "run_d"}
    assert look(changes).runs == frozenset(), "each event is told once"


def test_an_orch_toml_edited_in_place_is_a_change(tmp_path, changes):
    with open(layout.orch_config_path(tmp_path / "run_a"), "a") as handle:
        handle.write("lr = 1e-3\n")
    assert look(changes, {"run_a"}).runs == {"run_a"}


def test_a_new_run_is_named_and_its_directories_watched_as_they_are_made(tmp_path, changes):
    run = tmp_path / "run_new"
    run.mkdir()
    assert look(changes, {"run_new"}).runs == {"run_new"}
    layout.control_dir(run).mkdir()
    assert look(changes, {"run_new"}).runs == {"run_new"}
    layout.orch_config_path(run).write_text("max_steps = 5\n")
    assert look(changes, {"run_new"}).runs == {"run_new"}, "inside control/, made after the run"
    (tmp_path / "not_a_run").mkdir()
    assert look(changes).runs == frozenset()


def test_a_run_deleted_and_made_again_is_watched_again(tmp_path, changes):
    shutil.rmtree(tmp_path / "run_a")
    assert "run_a" in look(changes, {"run_a"}).runs
    make_runs(tmp_path, "run_a")
    assert "run_a" in look(changes, {"run_a"}).runs
    layout.atomic_write_text(layout.finished_path(tmp_path / "run_a"), "")
    assert look(changes, {"run_a"}).runs == {"run_a"}


def test_busy_records_are_named_by_file(tmp_path, changes):
    busy = layout.busy_dir(tmp_path)
    busy.mkdir()
    layout.atomic_write_text(layout.busy_path(tmp_path, "trainer"), "{}")
    seen = look(changes)
    assert seen.busy == {"trainer.json"}
    assert seen.runs == frozenset()
    layout.atomic_write_text(layout.busy_path(tmp_path, "run_a"), "{}")
    assert look(changes).busy == {"run_a.json"}
    layout.busy_path(tmp_path, "trainer").unlink()
    assert look(changes).busy == {"trainer.json"}, "a record removed is a change too"


def test_every_run_is_looked_at_within_a_full_pass_events_or_not(tmp_path):
    # The safety net for events that never come (writes from another machine on NFS).
    run_ids = [f"run_{index:02d}" for index in range(25)]
    make_runs(tmp_path, *run_ids)
    follower = ExperimentChanges(tmp_path, full_pass_looks=10)
    follower.take()
    looked_at: set[str] = set()
    for _ in range(10):
        runs = follower.take().runs
        assert len(runs) <= 3
        looked_at |= runs
    follower.close()
    assert looked_at == set(run_ids)


def test_logs_rollouts_and_checkpoints_send_the_feed_nothing(tmp_path, changes):
    run = tmp_path / "run_a"
    (run / "logs").mkdir()
    # Only the experiment directory itself is watched: not one event from inside a run
    # reaches the feed's handler.
    with open(run / "logs" / "orchestrator.log", "a", buffering=1) as log_file:
        time.sleep(SETTLE_S)  # the log's "made" has come
        before = changes.events_seen
        for index in range(2000):
            log_file.write(f"line {index}\n")
        time.sleep(SETTLE_S)
        assert changes.events_seen == before
    # Rollouts and checkpoints are below the one directory watched, and never looked at.
    for step in range(5):
        layout.atomic_write_text(run / "rollouts" / f"step_{step}" / "batch.json", "{}")
        layout.atomic_write_text(run / "checkpoints" / f"step_{step}" / "STABLE", "")
    assert look(changes).runs == frozenset()
    assert changes.events_seen == before


def test_out_of_inotify_watches_every_look_is_everything_after_a_warning(
    tmp_path, monkeypatch, caplog
):
    # A fake kernel answer: the real limit (fs.inotify.max_user_watches) is per user and
    # the machine's, and lowering it would starve every other process watching files.
    from watchdog.observers import inotify_c

    def no_watch_left(fd, path, mask):
        inotify_c.ctypes.set_errno(errno.ENOSPC)
        return -1

    make_runs(tmp_path, "run_a")
    monkeypatch.setattr(inotify_c, "inotify_add_watch", no_watch_left)
    with caplog.at_level(logging.WARNING):
        follower = ExperimentChanges(tmp_path)
    assert not follower.watching
    assert follower.take().everything
    assert follower.take().everything
    warning = caplog.text
    assert "fs.inotify.max_user_watches" in warning and "sudo sysctl" in warning


def test_a_closed_follower_says_everything(tmp_path, changes):
    changes.close()
    assert changes.take().everything


def test_an_ended_run_costs_one_stat_a_look_and_its_restart_or_late_record_is_seen(
    tmp_path, monkeypatch
):
    """At 300 runs most have ended (finished or evicted): each costs its control/ alone.
    Lifting the end (a restart) is a change of control/; a record it gets after it ended
    is left to the slice of the runs every `FULL_PASS_LOOKS` looks."""
    from workbench.files import experiment_changes

    make_runs(tmp_path, "run_open", "run_done", "run_gone")
    layout.atomic_write_text(layout.finished_path(tmp_path / "run_done"), "finished at 10\n")
    layout.atomic_write_text(layout.evicted_path(tmp_path / "run_gone"), "slow\n")
    follower = ExperimentChanges(tmp_path, full_pass_looks=3)
    follower.take()
    looked: list[str] = []
    real_signature = experiment_changes.signature

    def counting(path):
        looked.append(str(path))
        return real_signature(path)

    monkeypatch.setattr(experiment_changes, "signature", counting)
    follower.take()
    per_run = {run: sum(f"/{run}/" in p or p.endswith(f"/{run}/control") for p in looked)
               for run in ("run_open", "run_done", "run_gone")}  # fmt: skip
    assert per_run == {"run_open": 4, "run_done": 1, "run_gone": 1}, looked

    with open(layout.metrics_path(tmp_path / "run_done"), "a") as handle:
        handle.write('{"step": 10}\n')  # an update of a batch sent before it ended
    seen = set()
    for _ in range(3):
        seen |= follower.take().runs
    assert "run_done" in seen, "the slice looks at it within a full pass"

    layout.evicted_path(tmp_path / "run_gone").unlink()  # `workbench restart`
    assert "run_gone" in follower.take().runs
    looked.clear()
    follower.take()
    assert sum("/run_gone/" in p for p in looked) == 4, "open again: every path looked at"
    follower.close()
