"""Where an orchestrator starts in a run made from another run's checkpoint: the step the
trainer resumes at, with the copied data position when the orchestrator's state was copied
too, and a line in its log saying what it assumed when it was not."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from tests.helpers import make_run
from tests.orchestrator.scripted import ScriptedChat, make_orchestrator, publish_adapter
from workbench.files import layout
from workbench.files.rollouts import read_rollouts


def trainer_checkpoint(run: Path, step: int) -> None:
    """What the trainer's checkpoint of `step` looks like to the orchestrator: STABLE."""
    with layout.staged_directory(layout.checkpoint_part_dir(run, step, "trainer")) as staging:
        (staging / "progress.json").write_text("{}")


def source_run_at_step_4(experiment: Path):
    """run_a after 4 steps, its trainer one step behind, with its checkpoints of step 4."""
    source = make_run(experiment, "run_a")
    orchestrator = make_orchestrator(source, ScriptedChat(), max_steps=8, async_level=1)
    for step in range(4):
        publish_adapter(source, step)
        orchestrator.step_once()
    trainer_checkpoint(source, 4)
    return source, orchestrator


def test_a_copied_checkpoint_with_both_parts_continues_the_sources_data_and_seeds(
    experiment: Path,
):
    source, orchestrator = source_run_at_step_4(experiment)
    next_seed = orchestrator.rng.randrange(2**31)
    copy = make_run(experiment, "run_copy")
    shutil.copytree(layout.checkpoint_dir(source, 4), layout.checkpoint_dir(copy, 4))

    resumed = make_orchestrator(copy, ScriptedChat(), max_steps=8)
    assert (resumed.state.step, resumed.state.data_position) == (4, 8)  # 2 prompts a step
    assert resumed.rng.randrange(2**31) == next_seed


def test_a_checkpoint_with_only_the_trainers_part_starts_at_its_step_and_says_so(
    experiment: Path, caplog
):
    source, _ = source_run_at_step_4(experiment)
    copy = make_run(experiment, "run_copy")
    shutil.copytree(
        layout.checkpoint_part_dir(source, 4, "trainer"),
        layout.checkpoint_part_dir(copy, 4, "trainer"),
    )

    with caplog.at_level(logging.INFO):
        resumed = make_orchestrator(copy, ScriptedChat(), max_steps=8)
    assert (resumed.state.step, resumed.state.data_position) == (4, 8)
    note = "\n".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "starts from the trainer's checkpoint at step 4 without an orchestrator state" in note
    assert "data position 8" in note

    # Its first batch is step 4, the one the trainer resumed at step 4 waits for, made
    # with the adapter the trainer publishes from the checkpoint.
    publish_adapter(copy, 4)
    assert resumed.step_once().step == 4
    assert read_rollouts(layout.rollout_dir(copy, 4)).policy_version == 4


def test_orchestrator_states_newer_than_the_trainers_checkpoint_are_passed_over_when_their_batches_are_not_there(
    experiment: Path, caplog
):
    # Copying all of a running run's checkpoints/ copies orchestrator states ahead of its
    # newest trainer checkpoint; the batches in between stayed in the source's rollouts/.
    source, orchestrator = source_run_at_step_4(experiment)
    publish_adapter(source, 4)
    orchestrator.step_once()  # state of step 5, batch 4 in the source's rollouts/ only
    copy = make_run(experiment, "run_copy")
    shutil.copytree(layout.checkpoints_dir(source), layout.checkpoints_dir(copy))
    assert layout.is_stable(layout.checkpoint_part_dir(copy, 5, "orchestrator"))

    with caplog.at_level(logging.WARNING):
        resumed = make_orchestrator(copy, ScriptedChat(), max_steps=8)
    assert (resumed.state.step, resumed.state.data_position) == (4, 8)
    assert "resumes from its orchestrator state at step 4, not the newer step 5" in caplog.text

    # Its own run, restarted, keeps going from its newest state: its batch 4 is there.
    restarted = make_orchestrator(source, ScriptedChat(), max_steps=8)
    assert restarted.state.step == 5
