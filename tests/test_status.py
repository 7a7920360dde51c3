"""Run statuses read from the experiment directory, again and again (the TUI asks every
second) at the cost of what changed: a run's files are read again only when they change,
its orch.toml (for max_steps) parsed again only when it changes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import tomlkit

from tests.helpers import age_files, make_run
from tests.tui.synthetic import build_experiment
from workbench import status
from workbench.files import layout, run_control
from workbench.system.file_change import OnFileChange


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every orch.toml text tomlkit parses from here on."""
    seen: list[str] = []
    real_parse = tomlkit.parse

    def counting_parse(text: str):
        seen.append(text)
        return real_parse(text)

    monkeypatch.setattr(status.tomlkit, "parse", counting_parse)
    return seen


def max_steps(experiment: Path) -> dict[str, int | None]:
    return {run.id: run.max_steps for run in status.run_statuses(experiment)}


def test_an_unchanged_orch_toml_is_parsed_once_however_often_statuses_are_read(
    tmp_path: Path, parses: list[str]
):
    for name, steps in (("run_a", 5), ("run_b", 7)):
        make_run(tmp_path, name, f"max_steps = {steps}\n")
    age_files(tmp_path)
    for _ in range(4):
        assert max_steps(tmp_path) == {"run_a": 5, "run_b": 7}
    assert len(parses) == 2


def test_a_changed_orch_toml_is_read_again(tmp_path: Path, parses: list[str]):
    run = make_run(tmp_path, "run_a", "max_steps = 5\n")
    assert max_steps(tmp_path) == {"run_a": 5}
    layout.atomic_write_text(layout.orch_config_path(run), "max_steps = 12\n")
    assert max_steps(tmp_path) == {"run_a": 12}
    assert len(parses) == 2


def test_a_run_deleted_and_created_again_is_read_again(tmp_path: Path, parses: list[str]):
    run = make_run(tmp_path, "run_a", "max_steps = 5\n")
    assert max_steps(tmp_path) == {"run_a": 5}
    config = layout.orch_config_path(run)
    config.unlink()
    config.parent.rmdir()
    run.rmdir()
    assert max_steps(tmp_path) == {}
    make_run(tmp_path, "run_a", "max_steps = 9\n")
    assert max_steps(tmp_path) == {"run_a": 9}


def test_a_file_rewritten_in_place_to_the_same_size_or_removed_is_derived_again(tmp_path: Path):
    path = tmp_path / "value.txt"
    path.write_text("1")
    derived = OnFileChange(path, lambda: path.read_text() if path.exists() else None)
    assert derived.get() == "1"
    path.write_text("2")
    os.utime(path, ns=(0, 1))  # same inode and size: only the modification time differs
    assert derived.get() == "2"
    path.unlink()
    assert derived.get() is None


def test_a_run_whose_files_did_not_change_is_not_read_again(tmp_path):
    experiment = build_experiment(tmp_path)
    age_files(experiment)
    reader = status.RunStatusReader(experiment)
    first = reader.read()
    assert reader.files_read == 4, "every run read once"

    assert reader.read() == first
    assert reader.files_read == 4, "nothing changed: nothing read again"

    run_control.write_eviction(experiment / "run_queued", "not needed", by="test")
    statuses = {status.id: status for status in reader.read()}
    assert reader.files_read == 5, "only the evicted run is read again"
    assert statuses["run_queued"].status == "evicted"
    assert statuses["run_queued"].reason == "not needed"


def test_files_changed_a_moment_ago_are_read_until_they_settle(tmp_path):
    # A change within the file system's clock tick may leave a signature as it was: a
    # run changed that recently is read again at every poll until its files settle.
    experiment = build_experiment(tmp_path)
    reader = status.RunStatusReader(experiment)
    reader.read()
    reader.read()
    assert reader.files_read == 8
    age_files(experiment)
    reader.read()
    reader.read()
    assert reader.files_read == 12


def test_the_trainers_slots_change_statuses_without_reading_run_files(tmp_path):
    experiment = build_experiment(tmp_path)
    state_path = experiment / "trainer" / "runs.json"
    state = json.loads(state_path.read_text())
    age_files(experiment)
    reader = status.RunStatusReader(experiment)
    reader.read()
    state["slots"] = {"0": "run_lr1e-3", "1": "run_queued"}
    state_path.write_text(json.dumps(state))
    statuses = {status.id: status.status for status in reader.read()}
    assert statuses["run_queued"] == "active" and statuses["run_lr3e-4"] == "waiting"
    assert reader.files_read == 4
