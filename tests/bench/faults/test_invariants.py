"""The fault benchmark's checks, on experiment directories built by hand."""

from __future__ import annotations

from pathlib import Path
from random import Random

from tests.helpers import make_run
from workbench.bench.faults import invariants
from workbench.bench.faults.experiment import FaultExperiment
from workbench.bench.faults.runner import recovery_s
from workbench.bench.faults.scenarios import Injection
from workbench.files import layout
from workbench.files.metrics import append_metrics


def test_steps_trained_twice_after_a_restart_are_counted(tmp_path: Path):
    run = make_run(tmp_path, "run_a")
    for step in (1, 2, 3, 4, 3, 4, 5):  # restarted from the checkpoint of step 2
        append_metrics(run, "trainer", step, loss=0.0)
    append_metrics(run, "orchestrator", 3, reward_mean=0.5)
    assert invariants.recomputed_steps(run) == 2
    assert invariants.trained_steps(run) == [1, 2, 3, 4, 5]


def test_half_written_files_are_temp_names_and_step_directories_without_stable(tmp_path: Path):
    run = make_run(tmp_path, "run_a")
    with layout.staged_directory(layout.rollout_dir(run, 0)) as staging:
        (staging / "rollouts.jsonl").write_text("{}\n")
    cut = layout.rollout_dir(run, 1)
    cut.mkdir(parents=True)
    staged = layout.checkpoints_dir(run) / ".step_2.abc.tmp"
    staged.mkdir(parents=True)
    part = layout.checkpoint_part_dir(run, 3, "trainer")
    part.mkdir(parents=True)
    planted = layout.broadcast_dir(run, 9)
    planted.mkdir(parents=True)
    (layout.control_dir(run) / ".orch.toml.x1.tmp").write_text("max_")
    found = invariants.half_written(tmp_path, planted={planted})
    assert found == sorted([cut, staged, part, layout.control_dir(run) / ".orch.toml.x1.tmp"])


def test_a_checkpoint_loaded_without_stable_is_reported(tmp_path: Path):
    run = make_run(tmp_path, "run_a")
    good = layout.checkpoint_part_dir(run, 4, "trainer")
    good.mkdir(parents=True)
    layout.mark_stable(good)
    bad = layout.checkpoint_part_dir(run, 8, "trainer")
    bad.mkdir(parents=True)
    log = layout.process_log_path(tmp_path, "trainer")
    log.parent.mkdir(parents=True)
    log.write_text(f"x run run_a resumed from {good}\ny run run_a resumed from {bad}\n")
    assert invariants.checkpoints_loaded(tmp_path) == [("run_a", good), ("run_a", bad)]
    assert invariants.incomplete_loaded(tmp_path, planted=set()) == [bad]


def test_recovery_is_the_longest_pause_in_generation_or_training_after_the_fault(
    tmp_path: Path,
):
    run = make_run(tmp_path, "run_a")
    lines = [("trainer", t) for t in (100.0, 101.0, 102.0, 130.0, 131.0)]
    lines += [("orchestrator", t) for t in (100.5, 101.5, 140.5, 141.5)]
    path = layout.metrics_path(run)
    path.write_text("".join(f'{{"source":"{s}","step":0,"time":{t}}}\n' for s, t in lines))
    inj = Injection(FaultExperiment(tmp_path / "scratch", 8, 3), Random(0), at=102.5)
    inj.exp.path = tmp_path
    inj.expect_finished = ("run_a",)
    assert recovery_s(inj) == 39.0  # generation stopped from 101.5 to 140.5


def test_a_failing_command_is_noted_in_the_report_shortened(tmp_path: Path):
    """The security scenario's 10,000-character run id is refused; the report's note of the
    refused command names it in a line, not in a page."""
    experiment = FaultExperiment(tmp_path, max_steps=2, checkpoint_interval=1)
    huge = "x" * 10_000
    make_run(experiment.path, "run_a")
    result = experiment.cli("runs", "add", huge, "--experiment", str(experiment.path))
    assert result.returncode == 2
    assert experiment.cli_lines[0].startswith("$ workbench runs add xxx")
    assert "... (10000 characters)" in experiment.cli_lines[0]
    assert all(len(line) < 400 for line in experiment.cli_lines)


def test_deleting_a_run_directory_wins_against_a_writer_adding_a_file(tmp_path, monkeypatch):
    """The trainer may write a checkpoint into the run while it is being deleted: that
    removal fails with ENOTEMPTY, and the injection deletes it again, as a user would."""
    import errno
    import shutil

    from workbench.bench.faults import scenarios

    run = make_run(tmp_path, "run_b")
    real_rmtree, calls = shutil.rmtree, []

    def racing_rmtree(path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 1:
            (Path(path) / "checkpoints").mkdir()  # what the writer added meanwhile
            raise OSError(errno.ENOTEMPTY, "Directory not empty", "checkpoints")
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(scenarios.shutil, "rmtree", racing_rmtree)
    scenarios.remove_tree(run)
    assert not run.exists() and len(calls) == 2
