"""Run statuses read from the experiment directory: each run's max_steps comes from its
orch.toml, which is parsed again only when it changes (the TUI asks every second)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import tomlkit

from tests.helpers import make_run
from workbench import layout, status
from workbench.file_change import OnFileChange


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
