"""When the trainer checkpoints a run: its interval, its last step, and forced saves."""

from __future__ import annotations

from pathlib import Path

from tests.trainer.builders import build_trainer
from workbench.files import layout
from workbench.trainer.runs.checkpoint import PART, RunCheckpointer


def saved_steps(run: Path) -> list[int]:
    return [step for step, _ in layout.list_step_dirs(layout.checkpoints_dir(run))]


def checkpointer_at(tmp_path: Path, orch_toml: str) -> tuple[RunCheckpointer, int]:
    trainer = build_trainer(tmp_path, {"run_a": orch_toml})
    checkpointer = RunCheckpointer(trainer.manager, trainer.optimizer, trainer.scheduler, keep=10)
    return checkpointer, trainer.slot("run_a")


def test_a_run_is_saved_at_its_interval_and_its_last_step_once_each(tmp_path: Path):
    checkpointer, idx = checkpointer_at(tmp_path, "checkpoint_interval = 3\nmax_steps = 7\n")
    progress = checkpointer.manager.progress[idx]
    written = {}
    for step in range(8):
        progress.step = step
        written[step] = checkpointer.save_if_due(idx)
        assert checkpointer.save_if_due(idx) is None, "a step is saved at most once"
    assert [step for step, path in written.items() if path is not None] == [3, 6, 7]
    assert written[3] == layout.checkpoint_part_dir(tmp_path / "run_a", 3, PART)
    assert saved_steps(tmp_path / "run_a") == [3, 6, 7]


def test_a_forced_save_writes_any_unsaved_step_but_never_one_already_saved(tmp_path: Path):
    checkpointer, idx = checkpointer_at(tmp_path, "checkpoint_interval = 0\nmax_steps = 50\n")
    progress = checkpointer.manager.progress[idx]
    assert checkpointer.save_if_due(idx, force=True) is None, "step 0: nothing trained yet"
    progress.step = 4
    assert checkpointer.save_if_due(idx) is None, "interval 0: only the last step is due"
    assert checkpointer.save_if_due(idx, force=True) is not None
    assert checkpointer.save_if_due(idx, force=True) is None
    assert saved_steps(tmp_path / "run_a") == [4]


def test_a_restored_step_counts_as_saved(tmp_path: Path):
    checkpointer, idx = checkpointer_at(tmp_path, "checkpoint_interval = 2\n")
    checkpointer.manager.progress[idx].step = 2
    assert checkpointer.save_if_due(idx) is not None
    checkpointer.forget(idx)
    assert checkpointer.restore(idx) == 2
    assert checkpointer.save_if_due(idx, force=True) is None
