"""Atomic writes and STABLE markers: a reader never sees half a file or half a step."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from workbench.files import layout


def test_atomic_write_replaces_whole_file_and_leaves_no_temp_files(tmp_path: Path):
    target = tmp_path / "deep" / "state.json"
    layout.atomic_write_text(target, "old")
    layout.atomic_write_text(target, "new")
    assert target.read_text() == "new"
    assert [p.name for p in target.parent.iterdir()] == ["state.json"]


def test_failed_atomic_write_keeps_the_old_file(tmp_path: Path, monkeypatch):
    target = tmp_path / "orch.toml"
    layout.atomic_write_text(target, "lr = 1\n")

    def disk_full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(layout.os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space"):
        layout.atomic_write_text(target, "lr = 2\n")
    assert target.read_text() == "lr = 1\n"
    assert [p.name for p in tmp_path.iterdir()] == ["orch.toml"]


def test_staged_directory_appears_whole_with_stable_written_last(tmp_path: Path):
    final = layout.rollout_dir(tmp_path / "run_a", 3)
    with layout.staged_directory(final) as staging:
        (staging / "batch.pt").write_bytes(b"x" * 100)
        assert not final.exists(), "readers must not see the step before it is complete"
    assert layout.is_stable(final) and (final / "batch.pt").read_bytes() == b"x" * 100
    assert layout.latest_stable_step(layout.rollouts_dir(tmp_path / "run_a")) == 3


def test_staged_directory_that_fails_leaves_nothing(tmp_path: Path):
    final = layout.broadcast_dir(tmp_path / "run_a", 1)
    with pytest.raises(RuntimeError), layout.staged_directory(final) as staging:
        (staging / "adapter_model.safetensors").write_bytes(b"partial")
        raise RuntimeError("killed mid-write")
    assert not final.exists()
    assert list(final.parent.iterdir()) == []


def test_step_listing_is_numeric_and_ignores_other_entries(tmp_path: Path):
    for name in ("step_10", "step_2", "step_x", ".step_3.tmp"):
        (tmp_path / name).mkdir()
    assert [step for step, _ in layout.list_step_dirs(tmp_path)] == [2, 10]
    assert layout.latest_stable_step(tmp_path) is None
    layout.mark_stable(tmp_path / "step_2")
    assert layout.latest_stable_step(tmp_path) == 2


WRITER_KILLED_MID_WAY = """
import sys, time
from pathlib import Path
from workbench.files import layout
with layout.staged_directory(Path(sys.argv[1])) as staging:
    (staging / "adapter.safetensors").write_bytes(b"half")
    print("writing", flush=True)
    time.sleep(600)
"""


def test_writing_a_step_again_removes_what_a_killed_writer_left(tmp_path: Path):
    final = tmp_path / "checkpoints" / "step_3"
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER_KILLED_MID_WAY, str(final)], stdout=subprocess.PIPE
    )
    assert writer.stdout.readline() == b"writing\n"
    writer.kill()
    writer.wait()
    assert list(final.parent.glob(".step_3.*.tmp")), "SIGKILL leaves the staging directory"

    with layout.staged_directory(final) as staging:
        (staging / "adapter.safetensors").write_bytes(b"whole")
    assert sorted(p.name for p in final.parent.iterdir()) == ["step_3"]
    assert layout.is_stable(final)


def test_a_process_log_is_found_by_the_process_name(tmp_path):
    experiment = tmp_path / "exp"
    assert layout.process_log_path(experiment, "trainer") == experiment / "logs" / "trainer.log"
    assert layout.process_log_path(experiment, "supervisor") == (
        experiment / "logs" / "supervisor.log"
    )
    # An orchestrator is named by its run id and logs in its run directory.
    assert layout.process_log_path(experiment, "run_lr1e-3") == layout.orchestrator_log_path(
        layout.run_dir(experiment, "run_lr1e-3")
    )
