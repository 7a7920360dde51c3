"""Discovery: what run directories say, what the supervisor does about it, and the watcher."""

from __future__ import annotations

import shutil
import threading
import time
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
    assert scan_run(ok) == conditions["run_ok"]


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


def test_watcher_reports_new_runs_control_files_and_deletions(watcher, experiment: Path):
    watcher, changes = watcher
    run = make_run(experiment, "run_a")
    changes.expect_change()
    watcher.sync()  # the supervisor syncs the watched directories on every rescan
    assert layout.control_dir(run) in watcher.watched

    run_control.write_eviction(run, "because", by="user")
    changes.expect_change()
    shutil.rmtree(run)
    changes.expect_change()


def test_watcher_ignores_logs_rollouts_and_reads(watcher, experiment: Path):
    watcher, changes = watcher
    run = make_run(experiment, "run_a")
    changes.expect_change()
    watcher.sync()
    time.sleep(0.2)
    changes.expect_quiet(0.2)
    layout.orchestrator_log_path(run).parent.mkdir()
    changes.event.clear()
    for _ in range(20):
        with open(layout.orchestrator_log_path(run), "a") as log:
            log.write("a log line\n")
        layout.orch_config_path(run).read_text()
    changes.expect_quiet()


def test_watcher_follows_a_run_directory_that_is_deleted_and_created_again(
    watcher, experiment: Path
):
    watcher, changes = watcher
    run = make_run(experiment, "run_a")
    changes.expect_change()
    watcher.sync()
    shutil.rmtree(run)
    changes.expect_change()
    watcher.sync()
    run = make_run(experiment, "run_a")
    changes.expect_change()
    watcher.sync()
    run_control.write_eviction(run, "again", by="user")
    changes.expect_change()


def _inotify_descriptors() -> int:
    fds = Path("/proc/self/fd")
    count = 0
    for fd in fds.iterdir():
        try:
            count += "inotify" in fd.readlink().as_posix()
        except OSError:  # closed meanwhile
            continue
    return count


def test_a_sweep_of_many_runs_is_watched_through_one_descriptor_and_one_thread(
    watcher, experiment: Path
):
    # Linux allows 128 inotify descriptors per user by default; a descriptor per watched
    # directory (two per run) left the runs past about 60 to the periodic rescan.
    watcher, changes = watcher
    descriptors, threads = _inotify_descriptors(), threading.active_count()
    runs = [make_run(experiment, f"run_{index:03d}") for index in range(100)]
    watcher.sync()
    assert len(watcher.watched) == 1 + 2 * len(runs)
    changes.expect_change()
    while changes.event.wait(0.3):  # the hundred runs' own events, read in batches
        changes.event.clear()
    assert (_inotify_descriptors(), threading.active_count()) == (descriptors, threads)
    run_control.write_eviction(runs[-1], "the last of a hundred", by="user")
    changes.expect_change()
