"""Which runs changed since the last look, from real inotify events on real directories."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from workbench.files import experiment_changes, layout
from workbench.files.experiment_changes import ExperimentChanges


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
    assert follower.watching, "inotify is there on the Linux machines these tests run on"
    assert follower.take().everything, "nothing was watched before the first look"
    yield follower
    follower.close()


def test_a_look_names_the_runs_whose_files_changed_and_no_other(tmp_path, changes):
    assert changes.take().runs == frozenset()

    with open(layout.metrics_path(tmp_path / "run_b"), "a") as handle:
        handle.write('{"step": 1}\n')
    layout.atomic_write_text(layout.evicted_path(tmp_path / "run_c"), "too slow\n")
    (layout.broadcasts_dir(tmp_path / "run_d") / "step_1").mkdir()
    # What no reader of a run's status or curves looks at: its logs, rollouts, other files.
    (tmp_path / "run_e" / "logs").mkdir()
    (tmp_path / "run_e" / "logs" / "orchestrator.log").write_text("a line\n")
    (tmp_path / "run_e" / "notes.txt").write_text("mine\n")

    seen = changes.take()
    assert not seen.everything
    assert seen.runs == {"run_b", "run_c", "run_d"}
    assert changes.take().runs == frozenset(), "each event is told once"


def test_an_orch_toml_edited_in_place_is_a_change(tmp_path, changes):
    with open(layout.orch_config_path(tmp_path / "run_a"), "a") as handle:
        handle.write("lr = 1e-3\n")
    assert changes.take().runs == {"run_a"}


def test_a_new_run_is_named_and_its_directories_watched_as_they_are_made(tmp_path, changes):
    run = tmp_path / "run_new"
    run.mkdir()
    assert changes.take().runs == {"run_new"}
    layout.control_dir(run).mkdir()
    assert changes.take().runs == {"run_new"}
    layout.orch_config_path(run).write_text("max_steps = 5\n")
    assert changes.take().runs == {"run_new"}, "written inside control/, made after the run"
    (tmp_path / "not_a_run").mkdir()
    assert changes.take().runs == frozenset()


def test_a_run_deleted_and_made_again_is_watched_again(tmp_path, changes):
    shutil.rmtree(tmp_path / "run_a")
    assert "run_a" in changes.take().runs
    make_runs(tmp_path, "run_a")
    assert "run_a" in changes.take().runs
    layout.atomic_write_text(layout.finished_path(tmp_path / "run_a"), "")
    assert changes.take().runs == {"run_a"}


def test_busy_records_are_named_by_file(tmp_path, changes):
    busy = layout.busy_dir(tmp_path)
    busy.mkdir()
    assert changes.take().everything, "records written before busy/ was watched are unknown"
    layout.atomic_write_text(layout.busy_path(tmp_path, "trainer"), "{}")
    seen = changes.take()
    assert "trainer.json" in seen.busy
    assert seen.runs == frozenset()


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


def test_without_inotify_every_look_is_everything(tmp_path, monkeypatch):
    make_runs(tmp_path, "run_a")
    monkeypatch.setattr(experiment_changes, "INotify", None)
    follower = ExperimentChanges(tmp_path)
    assert not follower.watching
    assert follower.take().everything
    assert follower.take().everything


def test_a_closed_follower_says_everything(tmp_path, changes):
    changes.close()
    assert changes.take().everything
