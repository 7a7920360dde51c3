"""Discovery: what run directories say, what the supervisor does about it, and the watcher."""

from __future__ import annotations

import errno
import logging
import shutil
import threading
from pathlib import Path

import pytest

from tests.helpers import make_run
from workbench.files import layout, run_control
from workbench.supervisor.discovery import (
    RUN_DELETED,
    OrchestratorView,
    RunDirectoryWatcher,
    RunScan,
    StartOrchestrator,
    StopOrchestrator,
    reconcile,
    scan_run,
    scan_runs,
)


def test_scan_reads_eviction_rejection_invalid_config_and_finish(experiment: Path):
    ok = make_run(experiment, "run_ok")
    evicted = make_run(experiment, "run_evicted")
    run_control.write_eviction(evicted, "reward collapsed", by="trainer")
    rejected = make_run(experiment, "run_rejected")
    run_control.write_validation_error(rejected, "lr must be > 0")
    make_run(experiment, "run_invalid", "lr = -1\n")
    finished = make_run(experiment, "run_finished")
    run_control.mark_finished(finished, 30)
    (experiment / "run_bare").mkdir()
    (experiment / "not_a_run").mkdir()

    conditions = scan_runs(experiment)

    assert sorted(conditions) == [
        "run_bare",
        "run_evicted",
        "run_finished",
        "run_invalid",
        "run_ok",
        "run_rejected",
    ]
    assert conditions["run_ok"].runnable
    assert conditions["run_evicted"].hold_reason == "evicted: reward collapsed"
    assert conditions["run_rejected"].hold_reason == "rejected: lr must be > 0"
    assert "control/orch.toml is invalid" in conditions["run_invalid"].hold_reason
    assert "lr" in conditions["run_invalid"].hold_reason
    assert conditions["run_bare"].hold_reason == "no control/orch.toml yet"
    assert conditions["run_finished"].finished and not conditions["run_finished"].runnable
    # What the supervisor looks at again on every tick: runs whose orch.toml is to come.
    awaiting = {run_id for run_id, scan in conditions.items() if scan.awaiting_config}
    assert awaiting == {"run_bare", "run_invalid"}
    assert scan_run(ok) == conditions["run_ok"]


def test_a_tinker_clients_run_gets_no_orchestrator_yet_is_open_to_the_trainer(experiment: Path):
    tinker = make_run(experiment, "run_tinker_ab12", 'source = "tinker"\n[lora]\nrank = 4\n')
    make_run(experiment, "run_recipe", 'source = "recipe"\n')

    scans = scan_runs(experiment)

    assert scans["run_tinker_ab12"].client_driven and scans["run_tinker_ab12"].runnable
    assert not scans["run_recipe"].client_driven
    assert reconcile(scans, {}) == [StartOrchestrator("run_recipe", experiment / "run_recipe")]
    assert run_control.run_condition(tinker).open_to_trainer


def _runnable(run_id: str) -> RunScan:
    return RunScan(run_id, Path(run_id))


def test_a_new_runnable_run_gets_an_orchestrator():
    assert reconcile({"run_a": _runnable("run_a")}, {}) == [
        StartOrchestrator("run_a", Path("run_a"))
    ]


def test_a_deleted_evicted_or_rejected_run_has_its_orchestrator_stopped():
    orchestrators = {name: OrchestratorView("running") for name in ("run_a", "run_b")}
    conditions = {"run_b": RunScan("run_b", Path("run_b"), hold_reason="evicted: why")}
    assert reconcile(conditions, orchestrators) == [
        StopOrchestrator("run_a", RUN_DELETED),
        StopOrchestrator("run_b", "evicted: why"),
    ]


def test_a_held_orchestrator_starts_again_once_its_condition_clears():
    held = {"run_a": OrchestratorView("stopped", held=True, reason=RUN_DELETED)}
    assert reconcile({"run_a": _runnable("run_a")}, held) == [
        StartOrchestrator("run_a", Path("run_a"))
    ]


def test_exited_failed_and_finished_runs_are_left_alone():
    orchestrators = {
        "run_failed": OrchestratorView("failed"),
        "run_exited": OrchestratorView("exited"),
        "run_finishing": OrchestratorView("running"),
    }
    conditions = {
        "run_failed": _runnable("run_failed"),
        "run_exited": _runnable("run_exited"),
        "run_finishing": RunScan("run_finishing", Path("x"), finished=True),
    }
    assert reconcile(conditions, orchestrators) == []


def test_an_already_stopped_orchestrator_only_gets_a_new_reason_when_it_changes():
    evicted = {"run_a": OrchestratorView("stopped", held=True, reason="evicted: x")}
    same = {"run_a": RunScan("run_a", Path("run_a"), hold_reason="evicted: x")}
    assert reconcile(same, evicted) == []
    assert reconcile({}, evicted) == [StopOrchestrator("run_a", RUN_DELETED)]


class ChangeCounter:
    def __init__(self) -> None:
        self.count = 0
        self.event = threading.Event()

    def __call__(self) -> None:
        self.count += 1
        self.event.set()

    def expect_change(self, timeout_s: float = 2.0) -> None:
        assert self.event.wait(timeout_s), "the watcher did not report the change"
        self.event.clear()

    def expect_quiet(self, seconds: float = 0.5) -> None:
        self.event.clear()
        assert not self.event.wait(seconds), "the watcher reported an irrelevant change"


@pytest.fixture
def watcher(experiment: Path):
    counter = ChangeCounter()
    watcher = RunDirectoryWatcher(experiment, counter)
    watcher.start()
    yield watcher, counter
    watcher.stop()


def test_watcher_reports_runs_made_deleted_and_renamed_into_place(watcher, experiment: Path):
    watcher, changes = watcher
    run = make_run(experiment, "run_a")
    changes.expect_change()
    shutil.rmtree(run)
    changes.expect_change()
    staging = experiment / ".run_b.staging"
    make_run(experiment, staging.name)
    changes.expect_quiet()  # not a run directory's name
    staging.rename(experiment / "run_b")
    changes.expect_change()
    (experiment / "not_a_run").mkdir()
    changes.expect_quiet()


def test_nothing_a_run_writes_reaches_the_watchers_handler(watcher, experiment: Path):
    # Logs, metrics, rollouts, checkpoints, broadcasts and control files are below the
    # one directory watched: the kernel sends discovery none of their events. (Control
    # files are read by the rescans, and by every tick for a run awaiting its orch.toml.)
    watcher, changes = watcher
    run = make_run(experiment, "run_a")
    changes.expect_change()
    events_before = watcher.events_seen
    layout.orchestrator_log_path(run).parent.mkdir()
    with open(layout.orchestrator_log_path(run), "a", buffering=1) as log_file:
        for index in range(2000):
            log_file.write(f"a log line {index}\n")
    for step in range(5):  # what a training step writes
        layout.atomic_write_text(run / "rollouts" / f"step_{step}" / "batch.json", "{}")
        layout.atomic_write_text(run / "checkpoints" / f"step_{step}" / "STABLE", "")
        layout.atomic_write_text(run / "broadcast" / f"step_{step}" / "STABLE", "")
        with open(layout.metrics_path(run), "a") as metrics:
            metrics.write('{"step": 1}\n')
    run_control.write_eviction(run, "found by the rescan", by="user")
    changes.expect_quiet()
    assert watcher.events_seen == events_before


def test_out_of_inotify_watches_the_watcher_warns_naming_the_limit_and_how_to_raise_it(
    experiment: Path, monkeypatch, caplog
):
    # A fake kernel answer: the real limit (fs.inotify.max_user_watches) is per user and
    # the machine's; lowering it would starve every other process watching files.
    from watchdog.observers import inotify_c

    def no_watch_left(fd, path, mask):
        inotify_c.ctypes.set_errno(errno.ENOSPC)
        return -1

    monkeypatch.setattr(inotify_c, "inotify_add_watch", no_watch_left)
    watcher = RunDirectoryWatcher(experiment, ChangeCounter())
    with caplog.at_level(logging.WARNING):
        watcher.start()
    try:
        assert not watcher.watching  # the supervisor's rescans find every change
        assert "fs.inotify.max_user_watches" in caplog.text
        assert "sudo sysctl fs.inotify.max_user_watches=" in caplog.text
    finally:
        watcher.stop()


def test_watcher_reports_a_run_directory_deleted_and_made_again(watcher, experiment: Path):
    watcher, changes = watcher
    run = make_run(experiment, "run_a")
    changes.expect_change()
    shutil.rmtree(run)
    changes.expect_change()
    make_run(experiment, "run_a")
    changes.expect_change()


def test_a_sweep_of_many_runs_is_watched_by_three_threads_whatever_the_number_of_runs(
    experiment: Path,
):
    # A watchdog schedule per run directory and per control/ cost two threads per run:
    # 204 threads for a 100-run sweep.
    threads_before = threading.active_count()
    counter = ChangeCounter()
    watcher = RunDirectoryWatcher(experiment, counter)
    watcher.start()
    try:
        added_with_no_run = threading.active_count() - threads_before
        runs = [make_run(experiment, f"run_{index:03d}") for index in range(100)]
        counter.expect_change()
        while counter.event.wait(0.3):  # the hundred runs' own events, read in batches
            counter.event.clear()
        watcher.sync()
        assert 0 < added_with_no_run <= 3
        assert threading.active_count() - threads_before == added_with_no_run
        shutil.rmtree(runs[-1])
        counter.expect_change()
    finally:
        watcher.stop()
    assert threading.active_count() == threads_before
