"""model_build.json: a build's steps as the child that builds writes them."""

from __future__ import annotations

from pathlib import Path

from workbench.files import layout
from workbench.models.build_progress import BuildProgressFile, read_build_progress


def test_a_waiting_child_says_so_and_its_clock_restarts_when_it_builds(tmp_path: Path):
    with BuildProgressFile(tmp_path, "builtin:tiny-reverse") as on_step:
        on_step(0, 0, "waiting for another process's build")
        waiting = read_build_progress(tmp_path)
        assert waiting is not None and waiting.waiting
        on_step(1, 2, "initial weights")  # the other build failed: this one builds
        building = read_build_progress(tmp_path)
        assert (building.step, building.steps, building.waiting) == (1, 2, False)
        assert building.started_at >= waiting.started_at
        on_step(2, 2, "warm-up")
        assert read_build_progress(tmp_path).started_at == building.started_at
    assert read_build_progress(tmp_path) is None


def test_a_waiting_child_leaves_the_builders_file_alone(tmp_path: Path):
    with BuildProgressFile(tmp_path, "builtin:tiny-reverse") as builder:
        builder(2, 3, "warm-up update 10 of 150")
        with BuildProgressFile(tmp_path, "builtin:tiny-reverse") as waiter:
            waiter(0, 0, "waiting for another process's build")
        assert read_build_progress(tmp_path).what == "warm-up update 10 of 150"
    assert read_build_progress(tmp_path) is None


def test_a_malformed_file_is_no_progress(tmp_path: Path):
    path = layout.model_build_path(tmp_path)
    for text in ("not json", "[1, 2]", '{"model": "m", "step": "two"}'):
        path.write_text(text)
        assert read_build_progress(tmp_path) is None
